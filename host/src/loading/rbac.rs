//! `wasm-controller-manager rbac PLUGIN.wasm…`: the RBAC that grants each plugin what it declares
//! and the host what it needs to act for them, from the plugin files themselves (with their
//! NAME.toml). Watched kinds are resolved to resources through the cluster's discovery when one is
//! given, else by kube's pluralisation of the kind (printed as a comment to review).

use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::core::{ApiResource, GroupVersionKind};

use crate::cluster::discovery::Discovery;
use crate::cluster::identity::IdentitySettings;
use crate::cluster::rbac::{self, PluginRbac, WatchedResource};
use crate::contract::Watch;
use crate::loading::inspect::{Described, describe_file};
use crate::loading::settings::SecretRef;

/// What to generate.
pub struct RbacRequest {
    /// Where compiled plugins are cached (as `run --compile-cache`); None: compile each time.
    pub compile_cache: Option<PathBuf>,
    pub plugins: Vec<PathBuf>,
    pub identity: IdentitySettings,
    /// `namespace/name` of the host's ServiceAccount; None: no host objects.
    pub host_service_account: Option<(String, String)>,
}

/// The objects, and notes on what was guessed.
pub struct RbacOutput {
    pub objects: Vec<serde_json::Value>,
    pub notes: Vec<String>,
}

/// Generates the RBAC; `discovery` resolves watched kinds exactly (None: pluralise the kind).
pub async fn generate(req: &RbacRequest, discovery: Option<&Discovery>) -> Result<RbacOutput> {
    let mut described: Vec<Described> = Vec::new();
    for p in &req.plugins {
        described.push(describe_file(p, req.compile_cache.clone()).await?);
    }
    let mut notes = Vec::new();
    let mut plugins = Vec::new();
    for d in &described {
        let mut watches = Vec::new();
        let all = std::iter::once(&d.description.primary)
            .chain(d.description.secondaries.iter().map(|s| &s.watch));
        for w in all {
            watches.push(resolve(w, discovery, &mut notes).await?);
        }
        let secrets = d
            .settings
            .secrets
            .values()
            .map(|r| SecretRef::parse(r).map_err(anyhow::Error::msg))
            .collect::<Result<Vec<_>>>()?;
        plugins.push(PluginRbac {
            description: &d.description,
            watches,
            secrets,
        });
    }
    let mut objects = Vec::new();
    for p in &plugins {
        objects.extend(rbac::plugin_objects(&req.identity, p));
    }
    if let Some((ns, name)) = &req.host_service_account {
        objects.extend(rbac::host_objects(&req.identity, (ns, name), &plugins));
    }
    Ok(RbacOutput { objects, notes })
}

async fn resolve(
    w: &Watch,
    discovery: Option<&Discovery>,
    notes: &mut Vec<String>,
) -> Result<WatchedResource> {
    let namespace = w.namespace.clone().filter(|n| !n.is_empty());
    let (plural, namespaced) = match discovery {
        Some(d) => {
            let r = d.resolve(&w.kind).await.map_err(|e| {
                anyhow::anyhow!("resolve {}/{}: {}", w.kind.version, w.kind.kind, e.message)
            })?;
            (r.plural, r.namespaced)
        }
        None => {
            let gvk = GroupVersionKind::gvk(&w.kind.group, &w.kind.version, &w.kind.kind);
            let plural = ApiResource::from_gvk(&gvk).plural;
            notes.push(format!(
                "{} assumed to be resource {plural:?}, namespaced (no cluster given: pass --kubeconfig to resolve it)",
                w.kind.kind
            ));
            (plural, true)
        }
    };
    Ok(WatchedResource {
        group: w.kind.group.clone(),
        plural,
        namespace,
        namespaced,
    })
}

/// The YAML stream, with the notes as comments first.
pub fn render(out: &RbacOutput) -> Result<String> {
    let mut text = String::new();
    for n in &out.notes {
        text.push_str(&format!("# note: {n}\n"));
    }
    text.push_str(&rbac::to_yaml(&out.objects).context("render YAML")?);
    Ok(text)
}

/// Applies the objects with server-side apply (field manager `wasm-controller-manager-rbac`),
/// creating the namespaces they name when missing. For the local default and tests; operators
/// review the YAML and apply it their own way.
pub async fn apply(client: &kube::Client, objects: &[serde_json::Value]) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};

    let pp = PatchParams::apply("wasm-controller-manager-rbac").force();
    let mut namespaces: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let body =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        ns_api
            .patch(ns, &pp, &Patch::Apply(&body))
            .await
            .with_context(|| format!("apply namespace {ns}"))?;
    }
    for o in objects {
        let obj: DynamicObject =
            serde_json::from_value(o.clone()).context("a generated object is not an object")?;
        let types = obj
            .types
            .clone()
            .context("a generated object has no kind")?;
        let (group, version) = match types.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), types.api_version.clone()),
        };
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &types.kind));
        let name = obj
            .metadata
            .name
            .clone()
            .context("a generated object has no name")?;
        let api: Api<DynamicObject> = match &obj.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .with_context(|| format!("apply {} {name}", types.kind))?;
    }
    Ok(())
}
