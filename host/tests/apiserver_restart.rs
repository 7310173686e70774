//! The apiserver is killed and started again while objects change: every plugin converges on the
//! final state of every object, and deletions made while it was down or around it still reach the
//! plugin. Its own test binary: stopping the apiserver would break tests running beside it.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const OBJECTS: usize = 30;

#[tokio::test(flavor = "multi_thread")]
async fn plugins_converge_across_an_apiserver_restart() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    if !env.can_restart_apiserver() {
        eprintln!("skipped: the apiserver of an existing cluster cannot be restarted by the tests");
        return Ok(());
    }
    let client = env.client().await?;
    let ns = env.namespace("restart").await?;
    let dir = temp_dir("restart")?;
    // Two plugins with the same watch: one shared informer, two queues.
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    std::fs::write(dir.join("second.toml"), "name = \"well-behaved-2\"\n")?;
    install(&dir, "well-behaved", "second.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..OBJECTS {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"value": "v0"}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }

    // Changes before, during and after the outage.
    for i in 0..OBJECTS / 2 {
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "v1"}})),
        )
        .await?;
    }
    env.stop_apiserver().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.start_apiserver().await?;
    let client = env.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..OBJECTS {
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": format!("final-{i}")}})),
        )
        .await?;
    }
    for i in 0..5 {
        cms.delete(&format!("cm-{i}"), &DeleteParams::default())
            .await?;
    }

    // Both plugins converge: every remaining object carries its final value.
    eventually(
        "every object reconciled to its final value",
        Duration::from_secs(90),
        || async {
            let annotated = reconciled_annotations(&cms).await?;
            let ok = (5..OBJECTS)
                .all(|i| annotated.get(&format!("cm-{i}")) == Some(&format!("final-{i}")));
            Ok(ok.then_some(()))
        },
    )
    .await?;
    // Each deletion reached the plugin (well-behaved records it as a ConfigMap NAME-deleted).
    eventually(
        "every deletion reached the plugin",
        Duration::from_secs(60),
        || async {
            let list = cms.list(&ListParams::default()).await?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            Ok((0..5)
                .all(|i| names.contains(&format!("cm-{i}-deleted")))
                .then_some(()))
        },
    )
    .await?;
    let reconciles_2 = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "well-behaved-2")],
    );
    assert!(
        reconciles_2 >= OBJECTS as f64,
        "the second plugin reconciled only {reconciles_2} times"
    );
    manager.stop().await;
    Ok(())
}
