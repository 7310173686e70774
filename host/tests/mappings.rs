//! Mappings beyond the controller owner: a secondary object wakes every primary among its owners
//! (any owner), or the primary its label names; a change of owners or label wakes the old and
//! the new primary. The plugin has no resync, so a primary is reconciled only when a mapping
//! wakes it.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

async fn refs(cms: &Api<ConfigMap>, name: &str) -> Result<Option<String>> {
    Ok(cms
        .get(name)
        .await?
        .metadata
        .annotations
        .and_then(|a| a.get("wcm.test/refs").cloned()))
}

async fn wait_refs(cms: &Api<ConfigMap>, want: &[(&str, &str)]) -> Result<()> {
    eventually(
        &format!("primaries annotated {want:?}"),
        Duration::from_secs(30),
        || async {
            for (name, value) in want {
                if refs(cms, name).await?.as_deref() != Some(*value) {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Waits until the plugin has been idle for a second (no reconcile, nothing queued): a primary's
/// own annotation write wakes it once more, and that reconcile must not happen after the next
/// step's change, or it would find the refs itself and hide a mapping that does not work.
async fn settled(manager: &wasm_controller_manager::app::Manager) -> Result<()> {
    let count = || {
        metric(
            manager,
            "controller_runtime_reconcile_total",
            &[("controller", "mapper")],
        )
    };
    let mut last = count();
    let mut quiet_since = std::time::Instant::now();
    eventually("the mapper idle", Duration::from_secs(30), || {
        let now = count();
        let queued = metric(manager, "workqueue_depth", &[("name", "mapper")]);
        if now != last || queued > 0.0 {
            last = now;
            quiet_since = std::time::Instant::now();
        }
        let idle = quiet_since.elapsed() >= Duration::from_secs(1);
        async move { Ok::<_, anyhow::Error>(idle.then_some(())) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn any_owner_and_label_mappings_wake_the_primaries_they_name() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("mappings").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let dir = temp_dir("mappings")?;
    install(&dir, "mapper", "mapper.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;

    let mut uids = Vec::new();
    for p in ["p1", "p2"] {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": p, "labels": {"wcm.test/role": "primary"}}}),
        )?;
        let made = cms.create(&PostParams::default(), &cm).await?;
        uids.push(made.metadata.uid.context("no uid")?);
    }
    wait_refs(&cms, &[("p1", ""), ("p2", "")]).await?;
    settled(&manager).await?;

    // Owned by p1 (controller) and p2 (not controller): both are woken.
    let owned: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "o", "labels": {"wcm.test/role": "owned"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "p1", "uid": uids[0], "controller": true},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "p2", "uid": uids[1]}
        ]
    }}))?;
    cms.create(&PostParams::default(), &owned).await?;
    wait_refs(&cms, &[("p1", "o"), ("p2", "o")]).await?;
    settled(&manager).await?;

    // Labelled with p2: p2 is woken.
    let labelled: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "l", "labels": {"wcm.test/role": "labelled", "wcm.test/primary": "p2"}
    }}))?;
    cms.create(&PostParams::default(), &labelled).await?;
    wait_refs(&cms, &[("p1", "o"), ("p2", "l,o")]).await?;
    settled(&manager).await?;

    // Its label moves to p1: both the old and the new primary are woken.
    cms.patch(
        "l",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"wcm.test/primary": "p1"}}})),
    )
    .await?;
    wait_refs(&cms, &[("p1", "l,o"), ("p2", "o")]).await?;
    manager.stop().await;
    Ok(())
}
