//! docs/deploying.md's example deployment directory, written from the page itself: the manifests
//! test renders it, the node test applies it to a real node.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;
use wasm_controller_manager::loading::rbac;

/// The objects of a YAML stream (empty documents left out).
pub fn yaml_documents(text: &str) -> Result<Vec<Value>> {
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

/// The namespaces `manifests/namespace.yaml` makes: `rbac` is rendered as if they existed (it
/// prints a Namespace only for one the cluster lacks), so the generated file names none twice.
pub fn made_by_the_kustomization() -> std::collections::BTreeSet<String> {
    std::collections::BTreeSet::from(["wcm-system".to_string()])
}

/// What `rbac --kubeconfig … --all-namespaces pod-counter --host-service-account
/// wcm-system/wasm-controller-manager PLUGINS…` prints, as the deployment documents run it
/// (pod-counter records its events on the Pods it counts, in every namespace).
pub async fn deployment_rbac(
    client: &kube::Client,
    plugins: Vec<std::path::PathBuf>,
) -> Result<rbac::RbacOutput> {
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        client.clone(),
        std::time::Duration::from_secs(10),
    );
    rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins,
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
    .await
}

/// Writes the files of docs/deploying.md's example: every fenced block whose first line is
/// `# my-deploy/PATH` becomes that file, and one whose first line is `# appended to
/// my-deploy/PATH` is added to its end, in the order of the page. Returns the paths touched.
pub fn write_doc_example(doc: &str, root: &Path) -> Result<BTreeSet<String>> {
    let mut touched = BTreeSet::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let fence = line.trim_start();
        if !fence.starts_with("```") {
            continue;
        }
        // A block inside a list item is indented; its YAML starts at the fence's column.
        let indent = line.len() - fence.len();
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            let strip = l.len() - l.trim_start_matches(' ').len();
            body.push(&l[strip.min(indent)..]);
        }
        let Some(first) = body.first() else { continue };
        let (path, append) = match first.strip_prefix("# appended to ") {
            Some(p) => (p, true),
            None => match first.strip_prefix("# ") {
                Some(p) if p.starts_with("my-deploy/") => (p, false),
                _ => continue,
            },
        };
        let path = path.trim();
        anyhow::ensure!(
            path.starts_with("my-deploy/") && !path.split('/').any(|c| c == ".."),
            "docs/deploying.md: block for {path:?} is outside my-deploy/"
        );
        let file = root.join(path);
        if append {
            let mut text = std::fs::read_to_string(&file)
                .with_context(|| format!("{path} is appended to before it is written"))?;
            for l in &body[1..] {
                text.push_str(l);
                text.push('\n');
            }
            std::fs::write(&file, text)?;
        } else {
            std::fs::write(&file, body.join("\n") + "\n")?;
        }
        touched.insert(path.to_string());
    }
    Ok(touched)
}

pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dst = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &dst)?;
        } else {
            std::fs::copy(entry.path(), &dst)?;
        }
    }
    Ok(())
}
