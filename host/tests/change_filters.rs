//! Change filters against the real API server: 1,000 objects each get a status-only update, and a
//! plugin whose watch ignores status changes is not reconciled once for them (counted); a spec
//! change still reaches it.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

const N: usize = 1000;
/// Requests in flight at once while creating and patching.
const CONCURRENCY: usize = 16;

#[tokio::test(flavor = "multi_thread")]
async fn status_only_updates_cause_no_reconcile() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("filters").await?;
    let dir = temp_dir("filters")?;
    install(&dir, "status-ignorer", "status-ignorer.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let reconciles = || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "status-ignorer")],
        )
    };
    let filtered = || {
        metric(
            &manager,
            "wcm_changes_filtered_total",
            &[("controller", "status-ignorer")],
        )
    };

    futures::stream::iter(0..N)
        .map(|i| {
            let api = api.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
                    "metadata": {"name": format!("n{i}")},
                    "spec": {"cidr": "10.0.0.0/24", "gateway": "10.0.0.1"},
                }))?;
                api.create(&PostParams::default(), &obj).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    eventually(
        "every Network reconciled once",
        Duration::from_secs(120),
        || async { Ok((reconciles() >= N as f64).then_some(())) },
    )
    .await?;
    // Settled: nothing more in flight.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (reconciled, filtered_before) = (reconciles(), filtered());

    // A status-only update of each.
    futures::stream::iter(0..N)
        .map(|i| {
            let api = api.clone();
            async move {
                let patch = json!({"status": {"observedGeneration": 1}});
                api.patch_status(
                    &format!("n{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    eventually(
        "every status update seen and skipped",
        Duration::from_secs(120),
        || async { Ok((filtered() >= filtered_before + N as f64).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        reconciles(),
        reconciled,
        "status-only updates caused reconciles"
    );
    assert_eq!(filtered() - filtered_before, N as f64, "reconciles saved");

    // A spec change passes the filter.
    api.patch(
        "n0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"gateway": "10.0.0.2"}})),
    )
    .await?;
    eventually(
        "the spec change reconciled",
        Duration::from_secs(30),
        || async { Ok((reconciles() > reconciled).then_some(())) },
    )
    .await?;
    manager.stop().await;
    Ok(())
}
