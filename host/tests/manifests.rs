//! `manifests/`: `kubectl kustomize` renders exactly the objects of the kustomization's files, every
//! one of them passes a server-side dry run against the real API server, and the generated RBAC is
//! what `wasm-controller-manager rbac` prints for the shipped plugin today (set
//! WCM_UPDATE_MANIFESTS=1 to write it again). The example deployment of docs/deploying.md (plugins
//! in ConfigMap slots) renders and passes the same dry run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use common::deploying::{copy_dir, write_doc_example};
use common::*;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;
use wasm_controller_manager::loading::rbac;

/// The files of the kustomization's `resources`, in order.
fn resources() -> Result<Vec<PathBuf>> {
    let dir = testenv::manifests_dir();
    let text = std::fs::read_to_string(dir.join("kustomization.yaml"))?;
    let k: serde_json::Value = serde_yaml_ng::from_str(&text)?;
    k["resources"]
        .as_array()
        .context("kustomization.yaml has no resources")?
        .iter()
        .map(|r| Ok(dir.join(r.as_str().context("a resource that is not a path")?)))
        .collect()
}

fn documents(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    yaml_documents(&text).with_context(|| format!("parse {}", path.display()))
}

/// The objects of a YAML stream (empty documents left out).
fn yaml_documents(text: &str) -> Result<Vec<Value>> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// `apiVersion/kind namespace/name`, namespace empty for cluster-scoped objects.
fn object_id(doc: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    format!(
        "{}/{} {}/{}",
        s(&doc["apiVersion"]),
        s(&doc["kind"]),
        s(&doc["metadata"]["namespace"]),
        s(&doc["metadata"]["name"])
    )
}

/// What `kubectl kustomize dir` prints, as objects. The renderer is a process that may wait for a
/// build of the testenv binary, so it runs off the async workers.
async fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    let dir = dir.to_path_buf();
    let text = tokio::task::spawn_blocking(move || testenv::kustomize(&dir)).await??;
    yaml_documents(&text)
}

/// The namespace `manifests/` deploys into; a dry run in a namespace that does not exist is
/// refused, so it is made for real.
async fn ensure_wcm_system(client: &kube::Client) -> Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if namespaces.get_opt("wcm-system").await?.is_none() {
        let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": "wcm-system"}}))?;
        // Another test of this binary may make it first.
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Server-side applies `doc` as a dry run with strict field validation (an unknown or misspelt
/// field is an error, not a warning); `source` names where it came from in errors.
async fn dry_run_apply(client: &kube::Client, source: &str, doc: &Value) -> Result<()> {
    let mut dry_run = PatchParams::apply("wcm-manifests-test").dry_run().force();
    dry_run.field_validation = Some(kube::api::ValidationDirective::Strict);
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("{source}: {kind} {name} is not served"))?;
    let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => anyhow::bail!("{source}: {kind} {name} has no namespace"),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    };
    api.patch(name, &dry_run, &Patch::Apply(doc))
        .await
        .with_context(|| format!("{source}: the API server refused {kind} {name}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_generated_rbac_is_current() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        env.client().await?,
        Duration::from_secs(10),
    );
    let out = rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: vec![plugin("pod_counter")?],
            identity: Default::default(),
            host_service_account: Some(("wcm-system".into(), "wasm-controller-manager".into())),
            // pod-counter's events on the Pods it counts, in every namespace.
            allow: wasm_controller_manager::cluster::rbac::Allowances {
                all_namespaces: wasm_controller_manager::cluster::rbac::Allow::plugins([
                    "pod-counter".to_string(),
                ]),
                ..Default::default()
            },
        },
        Some(&discovery),
    )
    .await?;
    let want = format!(
        "# Generated by `wasm-controller-manager rbac --all-namespaces pod-counter --host-service-account wcm-system/wasm-controller-manager pod_counter.wasm`:\n# the pod-counter plugin's grant and what the host needs to act for it. Do not edit.\n{}",
        rbac::render(&out)?
    );
    let path = testenv::manifests_dir().join("rbac/generated.yaml");
    if std::env::var_os("WCM_UPDATE_MANIFESTS").is_some() {
        std::fs::write(&path, &want)?;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date: run WCM_UPDATE_MANIFESTS=1 cargo test --test manifests\n--- want:\n{want}",
        path.display()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_manifest_passes_a_server_side_dry_run() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_wcm_system(&client).await?;
    let mut applied = Vec::new();
    for file in resources()? {
        for doc in documents(&file)? {
            dry_run_apply(&client, &file.display().to_string(), &doc).await?;
            applied.push(format!(
                "{}/{}",
                doc["kind"].as_str().unwrap_or_default(),
                doc["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    for want in [
        "Deployment/wasm-controller-manager",
        "ServiceAccount/wasm-controller-manager",
        "Namespace/wcm-system",
        "CustomResourceDefinition/networks.samplecrd.k8s.io",
        "Role/wcm-host:leader-election",
    ] {
        assert!(
            applied.iter().any(|a| a == want),
            "{want} missing from {applied:?}"
        );
    }
    Ok(())
}

/// Kinds of `manifests/` that have no namespace; every other kind there must name one.
const CLUSTER_SCOPED: [&str; 4] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
];

/// `kubectl apply -k manifests/` sends what the dry-run test applies: `kubectl kustomize` (the same
/// kustomize library, through the testenv binary) yields exactly the objects of the listed files,
/// unchanged, each namespaced one in its namespace.
#[tokio::test(flavor = "multi_thread")]
async fn kustomize_renders_exactly_the_dry_run_objects() -> Result<()> {
    let rendered = kustomize(&testenv::manifests_dir()).await?;
    let mut listed = Vec::new();
    for file in resources()? {
        listed.extend(documents(&file)?);
    }
    assert!(!listed.is_empty(), "the kustomization lists no objects");
    let index = |docs: &[Value]| -> BTreeMap<String, Value> {
        docs.iter().map(|d| (object_id(d), d.clone())).collect()
    };
    let (have, want) = (index(&rendered), index(&listed));
    assert_eq!(
        have.len(),
        rendered.len(),
        "kustomize rendered an object twice"
    );
    let extra: Vec<_> = have.keys().filter(|k| !want.contains_key(*k)).collect();
    let missing: Vec<_> = want.keys().filter(|k| !have.contains_key(*k)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "kustomize and the files disagree: rendered but not listed {extra:?}, listed but not rendered {missing:?}"
    );
    for (id, doc) in &have {
        assert!(
            want.get(id) == Some(doc),
            "kustomize changed {id}: the dry run would not test what is applied"
        );
        let kind = doc["kind"].as_str().unwrap_or_default();
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or_default();
        if CLUSTER_SCOPED.contains(&kind) {
            assert!(namespace.is_empty(), "{id}: a {kind} names a namespace");
        } else {
            assert!(!namespace.is_empty(), "{id}: no namespace set");
        }
    }
    Ok(())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} rendered"))
}

/// Standard base64 as kustomize writes `binaryData` (lines of 76); `None` for a foreign character.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let (mut bits, mut held, mut out) = (0u32, 0u32, Vec::new());
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
            bits &= (1 << held) - 1;
        }
    }
    Some(out)
}

/// Keys of a ConfigMap field (`data` or `binaryData`).
fn keys(cm: &Value, field: &str) -> Vec<String> {
    cm[field]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// docs/deploying.md's deployment with plugins in ConfigMap slots, as the page writes it: a copy
/// of manifests/, the shipped plugins in slots 1 and 2, and the RBAC generated for both. It renders
/// to what the page says, every object passes the server-side dry run, and the reason for slots
/// holds: one ConfigMap holding both plugins is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_plugin_slots_render_and_pass_a_dry_run() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_wcm_system(&client).await?;
    let root = temp_dir("deploying-doc")?;
    let _cleanup = RemoveOnDrop(root.clone());
    let deploy = root.join("my-deploy");
    copy_dir(&testenv::manifests_dir(), &deploy)?;
    std::fs::create_dir_all(deploy.join("plugins"))?;
    let pod_counter = deploy.join("plugins/pod_counter.wasm");
    let network = deploy.join("plugins/network.wasm");
    std::fs::copy(plugin("pod_counter")?, &pod_counter)?;
    std::fs::copy(plugin("network")?, &network)?;

    let page = std::fs::read_to_string(testenv::repo_root().join("docs/deploying.md"))?;
    let touched = write_doc_example(&page, &root)?;
    for want in [
        "my-deploy/kustomization.yaml",
        "my-deploy/plugins-volume.yaml",
        "my-deploy/plugins/network.toml",
    ] {
        assert!(
            touched.contains(want),
            "docs/deploying.md has no block for {want} (found {touched:?})"
        );
    }

    // As the page runs it: `rbac --kubeconfig … --host-service-account wcm-system/… pod_counter.wasm
    // network.wasm`, which reads network.toml beside network.wasm.
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        client.clone(),
        Duration::from_secs(10),
    );
    let out = rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: vec![pod_counter.clone(), network.clone()],
            identity: Default::default(),
            host_service_account: Some(("wcm-system".into(), "wasm-controller-manager".into())),
            allow: wasm_controller_manager::cluster::rbac::Allowances {
                all_namespaces: wasm_controller_manager::cluster::rbac::Allow::plugins([
                    "pod-counter".to_string(),
                ]),
                ..Default::default()
            },
        },
        Some(&discovery),
    )
    .await?;
    // kustomize refuses a resource file that holds one object twice (network.toml names two keys
    // of one Secret: its grant must be one Role, not one per key).
    let mut ids = BTreeSet::new();
    for o in &out.objects {
        let id = object_id(o);
        assert!(
            ids.insert(id.clone()),
            "rbac prints {id} twice, so its output cannot be a kustomize resource"
        );
    }
    std::fs::write(deploy.join("rbac/generated.yaml"), rbac::render(&out)?)?;

    let rendered = kustomize(&deploy).await?;

    // Fixed names (no hash suffix), the wasm as binaryData, the settings as data.
    let slot1 = find(&rendered, "ConfigMap", "wcm-plugins-1")?;
    let slot2 = find(&rendered, "ConfigMap", "wcm-plugins-2")?;
    assert_eq!(keys(slot1, "binaryData"), ["pod_counter.wasm"]);
    assert_eq!(keys(slot2, "binaryData"), ["network.wasm"]);
    assert_eq!(keys(slot2, "data"), ["network.toml"]);
    for (cm, key, file) in [
        (slot1, "pod_counter.wasm", &pod_counter),
        (slot2, "network.wasm", &network),
    ] {
        let data = cm["binaryData"][key].as_str().and_then(base64_decode);
        assert!(
            data == Some(std::fs::read(file)?),
            "{key}: the ConfigMap does not hold the file's bytes"
        );
    }
    assert_eq!(
        slot2["data"]["network.toml"].as_str(),
        Some(std::fs::read_to_string(deploy.join("plugins/network.toml"))?.as_str())
    );

    // /plugins is the optional slots, mounted read-only; the compile cache stays.
    let deployment = find(&rendered, "Deployment", "wasm-controller-manager")?;
    let pod = &deployment["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "plugins"))
        .context("no plugins volume")?;
    let sources = volume["projected"]["sources"]
        .as_array()
        .context("the plugins volume is not projected")?;
    let slots: Vec<(String, Option<bool>)> = sources
        .iter()
        .map(|s| {
            let cm = &s["configMap"];
            (
                cm["name"].as_str().unwrap_or_default().into(),
                cm["optional"].as_bool(),
            )
        })
        .collect();
    let want: Vec<(String, Option<bool>)> = (1..=4)
        .map(|i| (format!("wcm-plugins-{i}"), Some(true)))
        .collect();
    assert_eq!(
        slots, want,
        "the plugins volume is not the four optional slots"
    );
    let manager = pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "manager"))
        .context("no manager container")?;
    let mounts = manager["volumeMounts"].as_array().context("no mounts")?;
    assert!(
        mounts.iter().any(|m| m["name"] == "plugins"
            && m["mountPath"] == "/plugins"
            && m["readOnly"] == true),
        "/plugins is not the slots, read-only: {mounts:?}"
    );
    assert!(
        mounts.iter().any(|m| m["mountPath"] == "/var/cache/wcm"),
        "the compile cache mount is gone: {mounts:?}"
    );
    assert!(
        manager["image"]
            .as_str()
            .is_some_and(|i| i != "wasm-controller-manager:latest"),
        "the images: entry did not rename the image"
    );

    // The host's grant covers both plugins.
    find(&rendered, "ServiceAccount", "wcm-plugin-network")?;
    for plugin in ["pod-counter", "network"] {
        let impersonate = find(&rendered, "Role", &format!("wcm-host:impersonate:{plugin}"))?;
        let names = &impersonate["rules"][0]["resourceNames"];
        assert_eq!(
            names,
            &serde_json::json!([format!("wcm-plugin-{plugin}")]),
            "the host's impersonation grant for {plugin}"
        );
    }

    for doc in &rendered {
        dry_run_apply(&client, "my-deploy (docs/deploying.md)", doc).await?;
    }

    // Why slots: the two shipped plugins together come within a few KiB of a ConfigMap's 1 MiB,
    // so a third plugin never fits beside them.
    let joined = |v: &Value| -> String {
        let text = v.as_str().unwrap_or_default();
        text.chars().filter(|c| !c.is_ascii_whitespace()).collect()
    };
    let both = serde_json::json!({
        "metadata": {"name": "wcm-plugins-both", "namespace": "wcm-system"},
        "binaryData": {
            "pod_counter.wasm": joined(&slot1["binaryData"]["pod_counter.wasm"]),
            "network.wasm": joined(&slot2["binaryData"]["network.wasm"]),
            "another.wasm": joined(&slot1["binaryData"]["pod_counter.wasm"]),
        },
    });
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "wcm-system");
    let refused = cms
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &serde_json::from_value(both)?,
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains("1048576")),
        "one ConfigMap with the two plugins and a third: {:?}",
        refused.map(|_| "accepted")
    );
    Ok(())
}

/// Removes a temp directory also when an assertion fails (two plugin copies, about 1 MiB).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
