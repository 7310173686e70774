//! Every contract version against the real cluster: a `wcm:reconciler@0.1.0` plugin binary kept as
//! a fixture (pod-counter as built before 0.2.0; `fixtures/README.md`) still loads and labels the
//! control-plane node with the pod count, beside a 0.2.0 binary kept as a fixture (options-probe
//! as built before 0.3.0) whose call options (a dry run, a field selector with a page limit, a
//! delete precondition, a field manager of its own) reach the API server: what is stored says
//! so. (0.3.0 plugins are the ones the SDK builds now: every other test runs them.)

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pod-counter-wit-0.1.0.wasm")
}

fn fixture_0_2() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/options-probe-wit-0.2.0.wasm")
}

fn contract_of(path: &std::path::Path) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("inspect")
        .arg(path)
        .arg("--json")
        .output()?;
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    Ok(report["contract"].as_str().unwrap_or_default().to_string())
}

#[test]
fn inspect_names_the_contract_version() -> Result<()> {
    assert_eq!(contract_of(&fixture())?, "wcm:reconciler@0.1.0");
    assert_eq!(contract_of(&fixture_0_2())?, "wcm:reconciler@0.2.0");
    assert_eq!(
        contract_of(&plugin("pod_counter")?)?,
        "wcm:reconciler@0.3.0"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_0_1_plugin_and_a_0_2_plugin_run_side_by_side_on_a_0_3_host() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "versions-cp",
        "labels": {"node-role.kubernetes.io/control-plane": ""}}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let ns = env.namespace("versions").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..2 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}")},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}))?;
        pods.create(&PostParams::default(), &p).await?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe"}}))?;
    cms.create(&PostParams::default(), &cm).await?;

    let dir = temp_dir("versions")?;
    std::fs::copy(fixture(), dir.join("pod-counter.wasm"))?;
    std::fs::copy(fixture_0_2(), dir.join("options-probe.wasm"))?;
    let manager = start_manager(test_config(&dir)).await?;

    // The 0.1.0 binary: the node carries the number of pods in the cluster.
    let all_pods: Api<Pod> = Api::all(client.clone());
    let labelled = eventually(
        "the 0.1.0 pod-counter labels the node with the pod count",
        Duration::from_secs(60),
        || async {
            let total = all_pods.list(&ListParams::default()).await?.items.len();
            let label = nodes
                .get("versions-cp")
                .await?
                .metadata
                .labels
                .and_then(|l| l.get("hopegi/pod-count").cloned());
            Ok((label == Some(total.to_string())).then_some(total))
        },
    )
    .await?;
    assert!(labelled >= 2);

    // The 0.2.0 probe: what it saw, and what the API server stored.
    let stored = eventually(
        "the options probe's result",
        Duration::from_secs(60),
        || async {
            let cm = cms.get("probe").await?;
            let done = cm
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("wcm.test/options"));
            Ok(done.then_some(cm))
        },
    )
    .await?;
    manager.stop().await;
    let annotations = stored.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations["wcm.test/options"], "dry-answered=true,listed=probe,precondition=409",
        "{annotations:?}"
    );
    // The dry run was answered with the label, and the API server did not store it.
    assert!(
        !stored
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("dry"),
        "a dry run was stored"
    );
    // The apply went through under the plugin's own field manager.
    assert_eq!(annotations["wcm.test/applied"], "yes");
    let managers: Vec<String> = stored
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "wcm:options-probe:probe"),
        "{managers:?}"
    );
    Ok(())
}
