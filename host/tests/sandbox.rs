//! The sandbox against the real test cluster, with real compiled components: a well-behaved plugin
//! reconciles; misbehaving ones are each stopped with a clear error and retried with backoff while
//! the host and the other plugins keep working.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

async fn annotation(cms: &Api<ConfigMap>, name: &str) -> Result<Option<String>> {
    Ok(cms
        .get(name)
        .await?
        .metadata
        .annotations
        .and_then(|a| a.get("wcm.test/reconciled").cloned()))
}

fn cm(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("value".to_string(), value.to_string())])),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_plugins_are_stopped_and_the_rest_keeps_working() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("sandbox").await?;
    let dir = temp_dir("sandbox")?;
    for p in [
        "well-behaved",
        "infinite-loop",
        "memory-bomb",
        "panicker",
        "undeclared-call",
        "oversized-output",
    ] {
        install(&dir, p, &format!("{p}.wasm"))?;
    }
    // The same two again with a warm instance per worker: a trap must drop that instance too.
    for p in ["well-behaved", "panicker"] {
        std::fs::write(
            dir.join(format!("{p}-warm.toml")),
            format!("name = \"{p}-warm\"\nisolation = \"worker\"\n"),
        )?;
        install(&dir, p, &format!("{p}-warm.wasm"))?;
    }
    let manager = start_manager(test_config(&dir)).await?;
    let status = manager.plugins.status().await;
    assert_eq!(status.len(), 8, "{status:?}");
    assert!(
        status.values().all(|s| matches!(
            s,
            wasm_controller_manager::loading::plugins::FileStatus::Running { .. }
        )),
        "{status:?}"
    );

    // A real node for the undeclared call to aim at: a broken check would patch it, not get 404.
    let node_name = format!("wcm-test-node-{}", ns.name);
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let mark = env.audit_mark()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut c1 = cm("c1", "v1");
    c1.data
        .get_or_insert_default()
        .insert("node".into(), node_name.clone());
    cms.create(&PostParams::default(), &c1).await?;

    // The well-behaved plugin reconciles, and follows an update.
    eventually(
        "well-behaved annotates c1 = v1",
        Duration::from_secs(30),
        || async { Ok((annotation(&cms, "c1").await?.as_deref() == Some("v1")).then_some(())) },
    )
    .await?;
    cms.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "v2"}})),
    )
    .await?;
    eventually(
        "well-behaved follows the update to v2",
        Duration::from_secs(30),
        || async { Ok((annotation(&cms, "c1").await?.as_deref() == Some("v2")).then_some(())) },
    )
    .await?;

    // Each misbehaving plugin fails in its own way, at least twice (the key is retried).
    for (plugin, reason) in [
        ("panicker-warm", "trap"),
        ("infinite-loop", "deadline"),
        ("memory-bomb", "memory"),
        ("panicker", "trap"),
        ("oversized-output", "limit"),
    ] {
        eventually(
            &format!("{plugin} fails with {reason} twice"),
            Duration::from_secs(60),
            || async {
                let n = metric(
                    &manager,
                    "wcm_plugin_call_failures_total",
                    &[("plugin", plugin), ("reason", reason)],
                );
                Ok((n >= 2.0).then_some(()))
            },
        )
        .await?;
    }
    // The undeclared call is refused inside the host: a Forbidden error, a metric, and the API
    // server never receives the patch (its audit log), so the node stays as it was.
    eventually(
        "undeclared-call is refused",
        Duration::from_secs(30),
        || async {
            Ok((metric(
                &manager,
                "wcm_forbidden_host_calls_total",
                &[
                    ("plugin", "undeclared-call"),
                    ("verb", "patch"),
                    ("resource", "undeclared"),
                ],
            ) >= 1.0)
                .then_some(()))
        },
    )
    .await?;
    eventually(
        "undeclared-call's reconcile reports the Forbidden error",
        Duration::from_secs(30),
        || async {
            Ok((metric(
                &manager,
                "controller_runtime_reconcile_total",
                &[("controller", "undeclared-call"), ("result", "error")],
            ) >= 1.0)
                .then_some(()))
        },
    )
    .await?;

    // A terminal error is not retried; it is counted and said in a Warning event on the object.
    let terminal = metric(
        &manager,
        "controller_runtime_terminal_reconcile_errors_total",
        &[("controller", "undeclared-call")],
    );
    assert!(terminal >= 1.0, "terminal errors counted: {terminal}");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    eventually(
        "a ReconcileFailed Warning on c1 from undeclared-call",
        Duration::from_secs(30),
        || async {
            let found = events
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ReconcileFailed")
                        && e.type_.as_deref() == Some("Warning")
                        && e.reporting_controller.as_deref() == Some("undeclared-call")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("c1")
                });
            Ok(found.then_some(()))
        },
    )
    .await?;

    // Retries back off: with a 200 ms base delay doubling, a few seconds allow only a handful.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Retries first: a failure is counted before its retry, so this order cannot see more retries
    // than failures however the two reads interleave with the next try.
    let retries = metric(&manager, "workqueue_retries_total", &[("name", "panicker")]);
    let panics = metric(
        &manager,
        "wcm_plugin_call_failures_total",
        &[("plugin", "panicker")],
    );
    assert!(
        panics < 60.0,
        "panicker retried {panics} times: no backoff?"
    );
    assert!(panics >= 2.0, "a trapping call is retried: {panics} calls");
    let terminal_retries = metric(
        &manager,
        "workqueue_retries_total",
        &[("name", "undeclared-call")],
    );
    assert_eq!(terminal_retries, 0.0, "a terminal error was retried");
    assert!(
        retries >= 1.0 && retries <= panics,
        "each retry goes through the rate limiter: {retries} retries for {panics} failed calls"
    );

    // The warm well-behaved instance reconciled many keys through one instance per worker.
    let warm_ok = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "well-behaved-warm"), ("result", "success")],
    );
    let warm_instances = metric(
        &manager,
        "wcm_plugin_instances_total",
        &[("name", "well-behaved-warm")],
    );
    assert!(
        warm_ok >= 2.0,
        "well-behaved-warm reconciled {warm_ok} times"
    );
    // Reused: fewer instances than calls (one per worker at most, none lost to a failure).
    assert!(
        warm_instances >= 1.0 && warm_instances < warm_ok,
        "{warm_instances} instances for {warm_ok} reconciles: not reused"
    );
    // The host and the well-behaved plugin still work after all of that.
    cms.create(&PostParams::default(), &cm("c2", "after"))
        .await?;
    eventually(
        "well-behaved still reconciles",
        Duration::from_secs(30),
        || async { Ok((annotation(&cms, "c2").await?.as_deref() == Some("after")).then_some(())) },
    )
    .await?;
    // The node the undeclared call aimed at exists, and the API server never received a patch of
    // it from anyone.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(&node_name).await?;
    let labels = node.metadata.labels.unwrap_or_default();
    assert!(
        !labels.keys().any(|k| k.contains("undeclared")),
        "node {node_name} was patched: {labels:?}"
    );
    let patches: Vec<_> = env
        .audit_events_since(mark)?
        .into_iter()
        .filter(|e| {
            e.verb == "patch" && e.object_ref.as_ref().is_some_and(|o| o.resource == "nodes")
        })
        .collect();
    assert!(
        patches.is_empty(),
        "node patches reached the API server: {patches:?}"
    );

    // The debug view: each plugin's state and version, and the latest failure of the failing ones.
    let (code, body) = http_get(&manager, "/debug/controllers").await?;
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(view["leading"], true, "{view}");
    let plugin = |file: &str| -> Result<serde_json::Value> {
        view["plugins"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["file"] == file).cloned())
            .with_context(|| format!("{file} missing from {view}"))
    };
    let good = plugin("well-behaved.wasm")?;
    assert_eq!(good["state"], "running", "{good}");
    assert!(
        good["queueDepth"].is_u64() && good["workers"].is_u64(),
        "{good}"
    );
    let bad = plugin("panicker.wasm")?;
    assert_eq!(bad["state"], "running", "{bad}");
    let last = bad["lastError"]["message"].as_str().unwrap_or_default();
    assert!(
        !last.is_empty() && bad["lastError"]["key"].is_string(),
        "{bad}"
    );
    manager.stop().await;
    Ok(())
}

/// Failed attempts are counted per key and forgotten after a success (client-go's `Forget`): the
/// attempt number a plugin sees grows while it fails, and is back to 0 at the next change after
/// it succeeded, so an old streak of failures never delays a later reconcile.
#[tokio::test(flavor = "multi_thread")]
async fn failures_are_counted_per_key_and_forgotten_after_a_success() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("flaky").await?;
    let dir = temp_dir("flaky")?;
    install(&dir, "flaky", "flaky.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let flaky: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "f", "labels": {"wcm.test/flaky": "yes"}},
        "data": {"fail": "true", "value": "a"}
    }))?;
    cms.create(&PostParams::default(), &flaky).await?;
    eventually("four failed attempts", Duration::from_secs(30), || async {
        let retries = metric(&manager, "workqueue_retries_total", &[("name", "flaky")]);
        Ok((retries >= 4.0).then_some(()))
    })
    .await?;
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(
            json!([{"op": "remove", "path": "/data/fail"}]),
        )?),
    )
    .await?;
    let attempt = |want_value: &'static str| {
        let cms = cms.clone();
        async move {
            eventually(
                &format!("f reconciled with value {want_value}"),
                Duration::from_secs(30),
                || async {
                    let seen = cms
                        .get("f")
                        .await?
                        .metadata
                        .annotations
                        .and_then(|a| a.get("wcm.test/attempt").cloned());
                    Ok(seen.and_then(|s| {
                        let (value, attempt) = s.split_once('@')?;
                        (value == want_value).then(|| attempt.parse::<u32>().ok())?
                    }))
                },
            )
            .await
        }
    };
    let after_failures = attempt("a").await?;
    assert!(
        after_failures >= 4,
        "the success came after {after_failures} counted failures"
    );
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "b"}})),
    )
    .await?;
    assert_eq!(attempt("b").await?, 0, "the failures were not forgotten");
    manager.stop().await;
    Ok(())
}
