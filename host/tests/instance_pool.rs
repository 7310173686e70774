//! The instance pool shared out (#23 item 2), against the real test cluster: plugins that hold
//! every instance they may (warm instances sleeping in WASI, which is no guest CPU time) leave
//! another plugin its reconciles and a plugin dropped in meanwhile its load.
//! Its own test binary: it fills a small pool on purpose.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, PostParams};
use serde_json::json;
use wasm_controller_manager::loading::plugins::FileStatus;

/// Long enough to hold the instances while the test looks (a warm instance is held after its
/// sleep too); stopping the manager waits for the sleeps in progress.
const SLEEP_SECONDS: &str = "40";

#[tokio::test(flavor = "multi_thread")]
async fn another_plugins_reconciles_and_a_new_plugins_load_go_on_while_two_plugins_hold_every_instance_they_may()
-> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("pool").await?;
    let dir = temp_dir("pool")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    // Two hostile plugins: 16 workers each, a warm instance per worker, reconciles that sleep.
    install(&dir, "sleeper", "sleeper.wasm")?;
    std::fs::write(dir.join("sleeper-b.toml"), "name = \"sleeper-b\"\n")?;
    install(&dir, "sleeper", "sleeper-b.wasm")?;
    let mut cfg = test_config(&dir);
    // 16 component instances for the whole host: each sleeper may hold 16 on its own
    // (--max-instances-per-plugin), so together they would take the pool twice over.
    cfg.max_instances = 16;
    let manager = start_manager(cfg).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..20 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("sleep-{i}"), &[("sleep_seconds", SLEEP_SECONDS)]),
        )
        .await?;
    }
    // The sleepers hold every instance the pool lets them have (their warm instances are never
    // given back): 16 less describe's 2, well-behaved's own slot and the 2 spare ones.
    let sleepers = || {
        metric(
            &manager,
            "wcm_plugin_instances_total",
            &[("name", "sleeper")],
        ) + metric(
            &manager,
            "wcm_plugin_instances_total",
            &[("name", "sleeper-b")],
        )
    };
    eventually(
        "the sleepers hold 11 instances",
        Duration::from_secs(60),
        || async { Ok((sleepers() >= 11.0).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = sleepers();

    // Another plugin's reconciles go on: well-behaved annotates a new ConfigMap, as the API
    // server stored it.
    cms.create(
        &PostParams::default(),
        &cm("honest", &[("value", "through")]),
    )
    .await?;
    eventually(
        "well-behaved annotates its ConfigMap while the sleepers hold the pool",
        Duration::from_secs(30),
        || async {
            let got = cms
                .get("honest")
                .await?
                .metadata
                .annotations
                .and_then(|a| a.get("wcm.test/reconciled").cloned());
            Ok((got.as_deref() == Some("through")).then_some(()))
        },
    )
    .await?;

    // A new plugin dropped in meanwhile loads (its describe gets a slot) and reconciles: the
    // operator grants it, then copies it into the directory.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = format!("pool-cp-{}", ns.name);
    let node: Node = serde_json::from_value(json!({"metadata": {
        "name": node_name,
        "labels": {"node-role.kubernetes.io/control-plane": ""},
    }}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let staging = temp_dir("pool-staging")?;
    let staged = install(&staging, "pod_counter", "pod-counter.wasm")?;
    grant(&[staged]).await?;
    let mark = env.audit_mark()?;
    install(&dir, "pod_counter", "pod-counter.wasm")?;
    let status = wait_status_within(
        &manager,
        "pod-counter",
        "running (never refused, never waiting for good)",
        Duration::from_secs(30),
        |s| match s {
            FileStatus::Running { .. } => true,
            FileStatus::Refused { error } => panic!("pod-counter refused: {error}"),
            _ => false,
        },
    )
    .await?;
    assert!(matches!(status, FileStatus::Running { .. }), "{status:?}");
    let count = eventually(
        "pod-counter labels the control-plane node",
        Duration::from_secs(30),
        || async {
            Ok(nodes
                .get(&node_name)
                .await?
                .metadata
                .labels
                .and_then(|l| l.get("hopegi/pod-count").cloned()))
        },
    )
    .await?;
    assert!(count.parse::<u64>().is_ok(), "label {count:?}");
    // The API server saw the patch, made as pod-counter's own identity.
    // The writer's audit line follows its change in etcd by a moment: read until it is there.
    let patched = eventually(
        "the patch of the node by pod-counter in the audit log",
        Duration::from_secs(10),
        || async {
            let seen = env.audit_events_since(mark)?.into_iter().any(|e| {
                e.verb == "patch"
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|o| o.resource == "nodes" && o.name == node_name)
                    && e.impersonated_user.as_ref().is_some_and(|u| {
                        u.username == "system:serviceaccount:wcm-system:wcm-plugin-pod-counter"
                    })
                    && e.response_status.as_ref().is_some_and(|s| s.code == 200)
            });
            Ok(seen.then_some(()))
        },
    )
    .await;
    assert!(
        patched.is_ok(),
        "no patch of {node_name} by pod-counter in the audit log"
    );

    // All along the sleepers kept what they held (their instances are warm and never end), and
    // no file was refused.
    let pool = manager.plugins.instance_pool();
    assert_eq!(
        (held, sleepers()),
        (11.0, 11.0),
        "the sleepers got no more than their share, however long they waited: {pool:?}"
    );
    assert_eq!(
        (pool.total, pool.reserved),
        (16, 4),
        "each of the 4 plugins has a slot of its own: {pool:?}"
    );
    for (file, st) in manager.plugins.status().await {
        assert!(matches!(st, FileStatus::Running { .. }), "{file}: {st:?}");
    }
    manager.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}
