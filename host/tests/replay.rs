//! Record and replay: pod-counter's reconcile of its aggregate key is recorded by a manager running
//! against the real cluster (`--record-dir`, all reconciles), then `wasm-controller-manager replay`
//! runs the same component offline against the file: the same calls (cache reads, the Node patch,
//! the events) and the same result. A recording changed by hand (one Pod fewer in the cache) makes
//! the replay differ, and say where.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use wasm_controller_manager::sandbox::tape::RecordWhat;

fn replay(recording: &Path, plugin: &Path) -> Result<(bool, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("replay")
        .arg(recording)
        .arg(plugin)
        // No cluster: nothing in the environment points at one.
        .env_remove("KUBECONFIG")
        .output()
        .context("run replay")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

/// The newest recording of the aggregate key whose patch labelled the node with `count`.
fn recording_with_count(dir: &Path, count: usize) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir.join("pod-counter")) else {
        return Ok(None);
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.to_string_lossy().ends_with("-pod-count.json"))
        .collect();
    names.sort();
    for path in names.into_iter().rev() {
        let rec: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let patched = rec["calls"].as_array().is_some_and(|calls| {
            calls.iter().any(|c| {
                c["call"] == "client.patch"
                    && c["args"]["body"]
                        .as_str()
                        .is_some_and(|b| b.contains(&format!("\"{count}\"")))
            })
        });
        if patched {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_reconcile_replays_offline_to_the_same_calls_and_result() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "replay-cp",
        "labels": {"node-role.kubernetes.io/control-plane": ""}}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let ns = env.namespace("replay").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..3 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}")},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}))?;
        pods.create(&PostParams::default(), &p).await?;
    }

    let dir = temp_dir("replay")?;
    let plugin = install(&dir, "pod_counter", "pod-counter.wasm")?;
    let records = temp_dir("replay-records")?;
    let mut cfg = test_config(&dir);
    cfg.record = Some((records.clone(), RecordWhat::All));
    let manager = start_manager(cfg).await?;
    let recording = eventually(
        "a recording of the count with the Node patch",
        Duration::from_secs(60),
        || async { recording_with_count(&records, 3) },
    )
    .await?;
    manager.stop().await;

    let rec: Value = serde_json::from_str(&std::fs::read_to_string(&recording)?)?;
    let calls: Vec<&str> = rec["calls"]
        .as_array()
        .context("calls")?
        .iter()
        .filter_map(|c| c["call"].as_str())
        .collect();
    assert!(calls.contains(&"cache.list"), "{calls:?}");
    assert!(calls.contains(&"events.record"), "{calls:?}");
    assert_eq!(rec["result"], json!({"action": "done"}), "{rec}");

    // Offline, the same component: the same calls and result.
    let (same, text) = replay(&recording, &plugin)?;
    assert!(same, "{text}");
    assert!(text.contains("same calls and result as recorded"), "{text}");
    assert!(text.contains("client.patch"), "{text}");

    // One Pod fewer in a cache answer: the count, so the patch, differs.
    let mut changed = rec.clone();
    let mut removed = false;
    for c in changed["calls"].as_array_mut().context("calls")? {
        if c["call"] == "cache.list"
            && let Some(items) = c["answer"]["ok"].as_array_mut()
            && items.len() == 3
        {
            items.pop();
            removed = true;
        }
    }
    if !removed {
        bail!("no cache.list answer with the 3 Pods in {rec}");
    }
    let changed_path = records.join("changed.json");
    std::fs::write(&changed_path, serde_json::to_string(&changed)?)?;
    let (same, text) = replay(&changed_path, &plugin)?;
    assert!(!same, "{text}");
    assert!(
        text.contains("call not in the recording: client.patch"),
        "{text}"
    );

    // Not a recording, and a missing file: clear errors.
    std::fs::write(records.join("bad.json"), "{\"format\": 1}")?;
    let (ok, text) = replay(&records.join("bad.json"), &plugin)?;
    assert!(!ok && text.contains("is not a recording"), "{text}");
    let (ok, text) = replay(&records.join("missing.json"), &plugin)?;
    assert!(!ok && text.contains("cannot read"), "{text}");
    Ok(())
}
