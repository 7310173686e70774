//! A host-side bug that panics in the middle of a plugin's API call costs that key one retry, not
//! the worker: the panic is caught, counted in `wcm_worker_panics_total`, the key is retried with
//! backoff, and the same worker goes on reconciling. The panic is injected with a fail point, so
//! this test needs `--features failpoints` (scripts/test passes it); its own test binary, because
//! fail points are global to the process.
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_in_a_host_call_costs_one_retry_not_the_worker() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("panic").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let dir = temp_dir("panic")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    let mut cfg = test_config(&dir);
    // One worker: if the panic killed it, nothing after would be reconciled.
    std::fs::write(dir.join("well-behaved.toml"), "workers = 1\n")?;
    cfg.default_workers = 1;
    let manager = start_manager(cfg).await?;

    // The next API call any plugin makes panics inside the host, once.
    fail::cfg("host-api-call", "1*panic(injected host bug)").map_err(anyhow::Error::msg)?;
    let create = |name: &str| {
        serde_json::from_value::<ConfigMap>(
            json!({"metadata": {"name": name}, "data": {"value": name}}),
        )
    };
    cms.create(&PostParams::default(), &create("first")?)
        .await?;
    eventually(
        "first reconciled after the injected panic",
        Duration::from_secs(30),
        || async {
            let a = reconciled_annotations(&cms).await?;
            Ok((a.get("first").map(String::as_str) == Some("first")).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        metric(
            &manager,
            "wcm_worker_panics_total",
            &[("controller", "well-behaved")]
        ),
        1.0,
        "the panic was not counted once"
    );
    // The same (only) worker goes on: more keys are reconciled, and no worker is left "active".
    for name in ["second", "third"] {
        cms.create(&PostParams::default(), &create(name)?).await?;
    }
    eventually("later keys reconciled", Duration::from_secs(30), || async {
        let a = reconciled_annotations(&cms).await?;
        Ok((a.get("second").map(String::as_str) == Some("second")
            && a.get("third").map(String::as_str) == Some("third"))
        .then_some(()))
    })
    .await?;
    eventually("no worker left active", Duration::from_secs(10), || async {
        let active = metric(
            &manager,
            "controller_runtime_active_workers",
            &[("controller", "well-behaved")],
        );
        Ok((active == 0.0).then_some(()))
    })
    .await?;
    assert_eq!(
        metric(
            &manager,
            "wcm_worker_panics_total",
            &[("controller", "well-behaved")]
        ),
        1.0
    );
    fail::remove("host-api-call");
    manager.stop().await;
    Ok(())
}
