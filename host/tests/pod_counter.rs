//! pod-counter end to end, against the real test cluster with its real component: the label on
//! control-plane nodes follows the number of pods, workers are never labelled, events land on the
//! pods, and once settled no further writes reach the API server.
//! Its own test binary: it counts every pod of its cluster and every write to it.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const LABEL: &str = "hopegi/pod-count";

async fn label(nodes: &Api<Node>, name: &str) -> Result<Option<String>> {
    Ok(nodes
        .get(name)
        .await?
        .metadata
        .labels
        .and_then(|l| l.get(LABEL).cloned()))
}

async fn total_pods(client: &kube::Client) -> Result<usize> {
    Ok(Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len())
}

async fn node(nodes: &Api<Node>, name: &str, role_label: Option<&str>) -> Result<()> {
    let mut labels = serde_json::Map::new();
    if let Some(l) = role_label {
        labels.insert(l.to_string(), json!(""));
    }
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    nodes.create(&PostParams::default(), &n).await?;
    Ok(())
}

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    }))?)
}

/// Writes (create, update, patch, delete) the API server has served for nodes and events.
async fn writes(env: &testenv::TestEnv) -> Result<f64> {
    let mut total = 0.0;
    for resource in ["nodes", "events"] {
        for verb in ["POST", "PUT", "PATCH", "DELETE", "APPLY"] {
            total += env
                .apiserver_metric(
                    "apiserver_request_total",
                    &[("resource", resource), ("verb", verb)],
                )
                .await?;
        }
    }
    Ok(total)
}

#[tokio::test(flavor = "multi_thread")]
async fn label_follows_the_pod_count_and_settles() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    node(
        &nodes,
        "cp-1",
        Some("node-role.kubernetes.io/control-plane"),
    )
    .await?;
    node(
        &nodes,
        "legacy-master",
        Some("node-role.kubernetes.io/master"),
    )
    .await?;
    node(&nodes, "worker-1", None).await?;

    let dir = temp_dir("pod-counter")?;
    install(&dir, "pod_counter", "pod-counter.wasm")?;
    std::fs::write(dir.join("pod-counter.toml"), "resync_seconds = 2\n")?;
    let manager = start_manager(test_config(&dir)).await?;

    // N pods in several namespaces.
    let mut namespaces = Vec::new();
    for i in 0..3 {
        let ns = env.namespace(&format!("count-{i}")).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        for j in 0..(4 + i) {
            pods.create(&PostParams::default(), &pod(&format!("p{j}"))?)
                .await?;
        }
        namespaces.push(ns.name);
    }
    let expect = total_pods(&client).await?;
    assert_eq!(
        expect,
        4 + 5 + 6,
        "only this test makes pods in its cluster"
    );
    for n in ["cp-1", "legacy-master"] {
        eventually(
            &format!("{n} labelled {expect}"),
            Duration::from_secs(60),
            || async {
                Ok(
                    (label(&nodes, n).await?.as_deref() == Some(expect.to_string().as_str()))
                        .then_some(()),
                )
            },
        )
        .await?;
    }
    assert_eq!(
        label(&nodes, "worker-1").await?,
        None,
        "a worker node is never labelled"
    );

    // Events on every counted pod.
    for ns in &namespaces {
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        eventually(
            &format!("events on every pod in {ns}"),
            Duration::from_secs(30),
            || async {
                let list = events.list(&ListParams::default()).await?;
                let ok = pods.items.iter().all(|p| {
                    list.items.iter().any(|e| {
                        e.reason.as_deref() == Some("SuccessCalculatePod")
                            && e.reporting_controller.as_deref() == Some("pod-counter")
                            && e.note
                                .as_deref()
                                .is_some_and(|n| n.starts_with("pod count is "))
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == p.metadata.name.as_deref()
                    })
                });
                Ok(ok.then_some(()))
            },
        )
        .await?;
    }

    // Pods deleted: the label follows.
    let first: Api<Pod> = Api::namespaced(client.clone(), &namespaces[0]);
    for j in 0..4 {
        first
            .delete(&format!("p{j}"), &DeleteParams::default())
            .await?;
    }
    let expect = total_pods(&client).await?;
    assert_eq!(expect, 11);
    for n in ["cp-1", "legacy-master"] {
        eventually(
            &format!("{n} relabelled {expect}"),
            Duration::from_secs(60),
            || async { Ok((label(&nodes, n).await?.as_deref() == Some("11")).then_some(())) },
        )
        .await?;
    }
    assert_eq!(label(&nodes, "worker-1").await?, None);

    // Settled: after the first repeats have become series, a quiet minute of recounts every 2 s
    // writes nothing to nodes or events.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = writes(env).await?;
    let reconciles_before = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "pod-counter")],
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = writes(env).await?;
    let reconciles_after = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "pod-counter")],
    );
    assert!(
        reconciles_after - reconciles_before >= 20.0,
        "the recount did not run: {reconciles_before} → {reconciles_after}"
    );
    assert_eq!(
        after - before,
        0.0,
        "writes to nodes/events during a quiet minute"
    );
    manager.stop().await;
    Ok(())
}
