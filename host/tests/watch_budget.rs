//! Watches are a budget too: a plugin may need at most `--max-watch-streams-per-plugin` distinct
//! list+watch streams, and selectors that differ only in spelling are one stream. Proven with the
//! hostile `many-watches` plugin from what the API server itself saw: its
//! `apiserver_longrunning_requests{verb="WATCH",resource="pods"}` gauge and its audit log.
//! Its own test binary (its own API server), so no other test's watches are counted; the tests in
//! it take turns, as the gauge is the API server's whole.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use testenv::{AuditEvent, AuditMark, TestEnv};
use wasm_controller_manager::app::Manager;
use wasm_controller_manager::loading::plugins::FileStatus;

/// The budget the tests run with: the flag's default.
const BUDGET: usize = 8;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn pod_watches(env: &TestEnv) -> Result<f64> {
    env.apiserver_metric(
        "apiserver_longrunning_requests",
        &[("verb", "WATCH"), ("resource", "pods")],
    )
    .await
}

/// Waits until the API server's Pod watches are `baseline + n`, and says so again a rescan later
/// (so a stream opened late is not missed).
async fn settles_at(env: &TestEnv, baseline: f64, n: usize, what: &str) -> Result<()> {
    let want = baseline + n as f64;
    eventually(what, Duration::from_secs(30), || async {
        Ok((pod_watches(env).await? == want).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = pod_watches(env).await?;
    assert_eq!(
        now - baseline,
        n as f64,
        "{what}: the API server serves {} Pod watches",
        now - baseline
    );
    Ok(())
}

/// A query parameter of a request URI, percent-decoded.
fn query_param(uri: &str, name: &str) -> Option<String> {
    let query = uri.split_once('?')?.1;
    let raw = query
        .split('&')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn pod_requests_in<'a>(
    events: &'a [AuditEvent],
    namespace: &'a str,
    verb: &'a str,
) -> impl Iterator<Item = &'a AuditEvent> + 'a {
    events.iter().filter(move |e| {
        e.verb == verb
            && e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "pods" && o.namespace == namespace)
    })
}

/// The label selectors of the Pod watches the API server started in `namespace` since `mark` (a
/// watch that ends is logged again, at `ResponseComplete`: those are not new).
fn watched_selectors(env: &TestEnv, mark: AuditMark, namespace: &str) -> Result<BTreeSet<String>> {
    let events = env.audit_events_since(mark)?;
    Ok(pod_requests_in(&events, namespace, "watch")
        .filter(|e| e.stage == "ResponseStarted")
        .map(|e| query_param(&e.request_uri, "labelSelector").unwrap_or_default())
        .collect())
}

/// `many-watches.toml` for these selectors (None: the plugin's own 33) in `namespace`.
fn write_settings(
    dir: &std::path::Path,
    namespace: &str,
    selectors: Option<&[String]>,
) -> Result<()> {
    let mut text = format!("[config]\nnamespace = {}\n", json!(namespace));
    if let Some(s) = selectors {
        text.push_str(&format!("selectors = {}\n", json!(s.join("|"))));
    }
    // Written whole, then renamed: the rescan never reads half a file.
    let tmp = dir.join(".many-watches.toml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join("many-watches.toml"))?;
    Ok(())
}

fn not_equal(from: usize, to: usize) -> Vec<String> {
    (from..=to).map(|i| format!("a!={i}")).collect()
}

fn refused_for_the_budget(s: &FileStatus) -> bool {
    matches!(s, FileStatus::Refused { error } if error.contains("over its budget"))
}

fn refused_total(m: &Manager) -> f64 {
    metric(
        m,
        "wcm_plugins_refused_total",
        &[("reason", "watch_budget")],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_three_pod_watches_open_no_stream_beyond_the_budget() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::shared().await?;
    let ns = env.namespace("wcm-many-watches").await?.name;
    let baseline = pod_watches(env).await?;
    let dir = temp_dir("watch-budget")?;
    write_settings(&dir, &ns, None)?;
    install(&dir, "many-watches", "many-watches.wasm")?;
    let mark = env.audit_mark()?;
    let manager = start_manager(test_config(&dir)).await?;

    // 33 watches with the selectors a!=1 … a!=33: refused, with the reason, and counted.
    let status = wait_status(
        &manager,
        "many-watches",
        "refused for its watch budget",
        refused_for_the_budget,
    )
    .await?;
    let FileStatus::Refused { error } = &status else {
        anyhow::bail!("not refused: {status:?}")
    };
    assert!(
        error.contains("needs 33 list+watch streams") && error.contains("budget of 8"),
        "{error}"
    );
    let (code, body) = http_get(&manager, "/plugins").await?;
    assert_eq!(code, 200);
    assert!(
        body.contains("many-watches.wasm\trefused\t") && body.contains("over its budget of 8"),
        "{body}"
    );
    assert_eq!(refused_total(&manager), 1.0);
    // It opened no stream at all: after a rescan and more, the API server serves no new Pod
    // watch and saw no Pod list or watch in its namespace.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pod_watches(env).await?, baseline, "Pod watches opened");
    assert_eq!(manager.informers.running(), 0);
    let events = env.audit_events_since(mark)?;
    let pod_reads: Vec<&AuditEvent> = pod_requests_in(&events, &ns, "watch")
        .chain(pod_requests_in(&events, &ns, "list"))
        .collect();
    assert!(pod_reads.is_empty(), "{pod_reads:?}");
    assert_eq!(refused_total(&manager), 1.0, "one refusal per content");

    // Exactly the budget (a!=1 … a!=8): it runs, on 8 streams.
    let mark = env.audit_mark()?;
    write_settings(&dir, &ns, Some(&not_equal(1, BUDGET)))?;
    wait_status(&manager, "many-watches", "running on 8 watches", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    settles_at(env, baseline, BUDGET, "8 watches").await?;
    assert_eq!(manager.informers.running(), BUDGET);
    let want: BTreeSet<String> = not_equal(1, BUDGET).into_iter().collect();
    assert_eq!(watched_selectors(env, mark, &ns)?, want);

    // A new version with the 33 watches again: refused, and the running version keeps its 8.
    write_settings(&dir, &ns, None)?;
    let status = wait_status(&manager, "many-watches", "the update refused", |s| {
        matches!(s, FileStatus::Running { update_refused: Some(e), .. } if e.contains("over its budget"))
    })
    .await?;
    assert!(matches!(status, FileStatus::Running { .. }));
    assert_eq!(refused_total(&manager), 2.0);
    settles_at(env, baseline, BUDGET, "the version kept running").await?;
    assert_eq!(manager.informers.running(), BUDGET);

    // A new version on 8 other streams (a!=9 … a!=16): the two together would be 16, so the
    // running version stops before the new one starts; the host never ran more than 8 streams.
    manager.informers.take_peak();
    let mark = env.audit_mark()?;
    write_settings(&dir, &ns, Some(&not_equal(BUDGET + 1, 2 * BUDGET)))?;
    let want: BTreeSet<String> = not_equal(BUDGET + 1, 2 * BUDGET).into_iter().collect();
    eventually(
        "the new version watches a!=9 … a!=16",
        Duration::from_secs(60),
        || async {
            let running = matches!(
                status_of(&manager, "many-watches").await,
                Some(FileStatus::Running {
                    update_refused: None,
                    ..
                })
            );
            Ok((running && watched_selectors(env, mark, &ns)? == want).then_some(()))
        },
    )
    .await?;
    settles_at(env, baseline, BUDGET, "the new version's 8 watches").await?;
    let peak = manager.informers.take_peak();
    assert!(
        peak <= BUDGET,
        "{peak} streams ran at once during the change of version"
    );

    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn selectors_written_differently_share_one_stream() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("wcm-equal-selectors").await?.name;
    let baseline = pod_watches(env).await?;
    let dir = temp_dir("watch-budget-equal")?;
    // 33 watches, over the budget of 8 if each were its own stream, but only two selectors,
    // each spelled in several ways.
    let spellings = [
        "a=1,b=2",
        "b=2, a=1",
        " a == 1 ,b=2",
        "b=2,a=1,a=1",
        "x in (b,a)",
        "x in (a,b)",
        "x  in ( b , a , a )",
    ];
    let selectors: Vec<String> = (0..33)
        .map(|i| format!("{}{}", spellings[i % spellings.len()], " ".repeat(i / 7)))
        .collect();
    write_settings(&dir, &ns, Some(&selectors))?;
    install(&dir, "many-watches", "many-watches.wasm")?;
    let mark = env.audit_mark()?;
    let manager = start_manager(test_config(&dir)).await?;
    wait_status(&manager, "many-watches", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    settles_at(env, baseline, 2, "33 watches of two selectors").await?;
    assert_eq!(manager.informers.running(), 2);
    let want: BTreeSet<String> = ["a=1,b=2", "x in (a,b)"].map(String::from).into();
    assert_eq!(watched_selectors(env, mark, &ns)?, want);

    // The canonical streams select what the selectors select: a Pod of each wakes the plugin,
    // then a Pod of neither changes nothing.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let create = |name: &'static str, labels: serde_json::Value| {
        let pods = pods.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]},
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
            anyhow::Ok(())
        }
    };
    let reconciled = |m: &Manager| {
        metric(
            m,
            "controller_runtime_reconcile_total",
            &[("controller", "many-watches")],
        )
    };
    create("ab", json!({"a": "1", "b": "2"})).await?;
    create("x", json!({"x": "b"})).await?;
    eventually("both Pods reconciled", Duration::from_secs(30), || async {
        Ok((reconciled(&manager) >= 2.0).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = reconciled(&manager);
    create("neither", json!({"a": "1", "x": "c"})).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        reconciled(&manager),
        before,
        "a Pod no selector matches woke the plugin"
    );
    manager.stop().await;
    Ok(())
}
