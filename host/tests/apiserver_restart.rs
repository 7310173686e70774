//! The apiserver is killed and started again while objects change, or the host is cut off from it
//! while etcd's history is compacted: every plugin converges on the final state of every object,
//! and deletions made while it was down or cut off still reach the plugin. Its own test binary:
//! stopping the apiserver would break tests running beside it, and the tests here take turns.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const OBJECTS: usize = 30;

/// The tests of this binary stop the one apiserver, so they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn plugins_converge_across_an_apiserver_restart() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
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
    create_configmaps(&cms, OBJECTS).await?;

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

    // Both plugins converge: every remaining object carries its final value, and each deletion
    // reached the plugin.
    let want: Vec<(String, String)> = (5..OBJECTS)
        .map(|i| (format!("cm-{i}"), format!("final-{i}")))
        .collect();
    converged(&cms, &want, Duration::from_secs(90)).await?;
    deletions_reached(&cms, 0..5).await?;
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

/// ConfigMaps `cm-0..n` with `data.value = v0`.
async fn create_configmaps(cms: &Api<ConfigMap>, n: usize) -> Result<()> {
    for i in 0..n {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"value": "v0"}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    Ok(())
}

/// Waits until the plugin has seen the deletion of `cm-N` for each N in `which`: well-behaved
/// records a deletion as a ConfigMap `cm-N-deleted`.
async fn deletions_reached(cms: &Api<ConfigMap>, which: std::ops::Range<usize>) -> Result<()> {
    eventually(
        "every deletion reached the plugin",
        Duration::from_secs(60),
        || async {
            let names: Vec<String> = cms
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect();
            Ok(which
                .clone()
                .all(|i| names.contains(&format!("cm-{i}-deleted")))
                .then_some(()))
        },
    )
    .await
}

/// Waits until every ConfigMap named in `want` carries the `wcm.test/reconciled` value given.
async fn converged(
    cms: &Api<ConfigMap>,
    want: &[(String, String)],
    timeout: Duration,
) -> Result<()> {
    let outcome = eventually(
        "every object reconciled to its final value",
        timeout,
        || async {
            let annotated = reconciled_annotations(cms).await?;
            Ok(want
                .iter()
                .all(|(name, value)| annotated.get(name) == Some(value))
                .then_some(()))
        },
    )
    .await;
    if outcome.is_err() {
        let annotated = reconciled_annotations(cms).await?;
        let behind: Vec<String> = want
            .iter()
            .filter(|(name, value)| annotated.get(name) != Some(value))
            .map(|(name, value)| format!("{name}: want {value}, has {:?}", annotated.get(name)))
            .collect();
        eprintln!("{} objects behind: {behind:?}", behind.len());
    }
    outcome
}

/// The host is cut off from the apiserver (a proxy between them drops every connection) while
/// objects are changed, created and deleted; etcd's history is compacted and the apiserver
/// restarted, so its watch cache cannot replay what the host missed either. When the link comes
/// back, the host's watch resumes from a resourceVersion that is gone: the apiserver answers 410,
/// the host lists again, and every final state and every missed deletion reaches the plugin.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_cut_off_while_history_is_compacted_relists_and_misses_nothing() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = testenv::TestEnv::shared().await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: the tests cannot compact the etcd of an existing cluster");
        return Ok(());
    };
    let apiserver: std::net::SocketAddr = local
        .server
        .trim_start_matches("https://")
        .parse()
        .context("the testenv server address")?;
    let proxy = testenv::CuttableProxy::start(apiserver).await?;
    let mut host = host_config().await?;
    host.cluster_url = format!("https://{}", proxy.addr()).parse()?;

    let client = env.client().await?;
    let ns = env.namespace("cutoff").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    create_configmaps(&cms, 20).await?;
    let dir = temp_dir("cutoff")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    grant_dir(&dir).await?;
    let manager = wasm_controller_manager::app::Manager::start(test_config(&dir), host).await?;
    let v0: Vec<(String, String)> = (0..20).map(|i| (format!("cm-{i}"), "v0".into())).collect();
    converged(&cms, &v0, Duration::from_secs(60)).await?;

    proxy.cut();
    for i in 0..15 {
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": format!("final-{i}")}})),
        )
        .await?;
    }
    for i in 15..20 {
        cms.delete(&format!("cm-{i}"), &DeleteParams::default())
            .await?;
    }
    for i in 0..3 {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("new-{i}")}, "data": {"value": format!("new-{i}")}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    env.compact_etcd().await?;
    env.stop_apiserver().await?;
    env.start_apiserver().await?;
    let mark = env.audit_mark()?;
    proxy.restore();

    let client = env.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut want: Vec<(String, String)> = (0..15)
        .map(|i| (format!("cm-{i}"), format!("final-{i}")))
        .collect();
    want.extend((0..3).map(|i| (format!("new-{i}"), format!("new-{i}"))));
    converged(&cms, &want, Duration::from_secs(90)).await?;
    deletions_reached(&cms, 15..20).await?;

    // What the apiserver saw from the host (the only cluster-wide reader of ConfigMaps here). The
    // 410 comes as an ERROR event inside the watch's 200 stream, so the audit shows it by what
    // followed: a watch resumed from the resourceVersion held before the cut, then a fresh list
    // (the host lists only at start and when its resourceVersion is gone), then a watch from the
    // newer resourceVersion that list returned.
    let host_calls: Vec<(String, u64)> = env
        .audit_events_since(mark)?
        .into_iter()
        .filter(|e| e.request_uri.starts_with("/api/v1/configmaps?"))
        .map(|e| {
            let rv = e
                .request_uri
                .split('&')
                .find_map(|p| p.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (e.verb, rv)
        })
        .collect();
    let resumed = host_calls.iter().position(|(verb, _)| verb == "watch");
    let relist = host_calls.iter().position(|(verb, _)| verb == "list");
    let ok = match (resumed, relist) {
        (Some(w), Some(l)) if l > w => {
            let old = host_calls[w].1;
            host_calls[l..]
                .iter()
                .any(|(verb, rv)| verb == "watch" && *rv > old)
        }
        _ => false,
    };
    assert!(
        ok,
        "expected a resumed watch, a relist, then a watch from a newer resourceVersion: {host_calls:?}"
    );
    manager.stop().await;
    Ok(())
}

/// The apiserver is killed (SIGKILL) halfway through a burst of 2,000 changes to 200 objects and
/// started again 2 s later; the burst goes on as the writers can. Every object converges on its
/// final value. The time from the last write to convergence is printed for docs/reliability.md.
/// (A restarted API server refuses requests 403 for a moment, until its RBAC cache has synced: a
/// plugin must retry them, not give up on the object.)
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_2000_changes_converges_across_an_apiserver_kill() -> Result<()> {
    const OBJECTS: usize = 200;
    const ROUNDS: usize = 10;
    let _turn = ONE_AT_A_TIME.lock().await;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = testenv::TestEnv::shared().await?;
    if !env.can_restart_apiserver() {
        eprintln!("skipped: the apiserver of an existing cluster cannot be restarted by the tests");
        return Ok(());
    }
    let client = env.client().await?;
    let ns = env.namespace("burst").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    create_configmaps(&cms, OBJECTS).await?;
    let dir = temp_dir("burst")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;

    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers = {
        let cms = cms.clone();
        let written = written.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            // Each object's rounds in order (so its last write is its final value); 16 objects
            // at a time. A write refused while the apiserver is down is tried again.
            futures::stream::iter(0..OBJECTS)
                .map(|i| {
                    let cms = cms.clone();
                    let written = written.clone();
                    async move {
                        for round in 1..=ROUNDS {
                            let patch =
                                Patch::Merge(json!({"data": {"value": format!("r{round}")}}));
                            while cms
                                .patch(&format!("cm-{i}"), &PatchParams::default(), &patch)
                                .await
                                .is_err()
                            {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<()>>()
                .await;
        })
    };
    eventually(
        "half the burst written",
        Duration::from_secs(120),
        || async {
            Ok(
                (written.load(std::sync::atomic::Ordering::Relaxed) >= OBJECTS * ROUNDS / 2)
                    .then_some(()),
            )
        },
    )
    .await?;
    env.stop_apiserver().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.start_apiserver().await?;
    tokio::time::timeout(Duration::from_secs(300), writers)
        .await
        .context("the writers did not finish")??;
    let last_write = std::time::Instant::now();

    let client = env.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let want: Vec<(String, String)> = (0..OBJECTS)
        .map(|i| (format!("cm-{i}"), format!("r{ROUNDS}")))
        .collect();
    if let Err(e) = converged(&cms, &want, Duration::from_secs(120)).await {
        // What the host did, for the failure's report.
        let text = manager.metrics.encode();
        let ours = text.lines().filter(|l| {
            !l.starts_with('#') && l.contains("well-behaved") && !l.contains("_bucket")
        });
        eprintln!("{}", ours.collect::<Vec<_>>().join("\n"));
        return Err(e);
    }
    println!(
        "burst of {} changes with an apiserver kill: converged {:.2} s after the last write",
        OBJECTS * ROUNDS,
        last_write.elapsed().as_secs_f64()
    );
    manager.stop().await;
    Ok(())
}
