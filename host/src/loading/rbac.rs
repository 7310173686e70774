//! `wasm-controller-manager rbac PLUGIN.wasm…`: the RBAC that grants each plugin what it declares
//! and the host what it needs to act for them, from the plugin files themselves (with their
//! NAME.toml). Watched kinds are resolved to resources through the cluster's discovery when one is
//! given, else by kube's pluralisation of the kind (printed as a comment to review).

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::core::{ApiResource, GroupVersionKind};

use crate::cluster::discovery::Discovery;
use crate::cluster::identity::IdentitySettings;
use crate::cluster::rbac::{self, Allowances, DeclaredRule, PluginRbac, WatchedResource};
use crate::cluster::scope::{Scope, WatchScope};
use crate::contract::{Permission, Watch};
use crate::loading::inspect::{Described, describe_file};
use crate::loading::settings::SecretRef;

/// What to generate.
pub struct RbacRequest {
    /// Where compiled plugins are cached (as `run --compile-cache`); None: compile each time.
    pub compile_cache: Option<PathBuf>,
    pub plugins: Vec<PathBuf>,
    pub identity: IdentitySettings,
    /// `namespace/name` of the host's ServiceAccount; None: no host objects. Its namespace is
    /// protected like `identity.protected`.
    pub host_service_account: Option<(String, String)>,
    /// What the operator allows beyond the default (`--all-namespaces`, `--allow-risky`).
    pub allow: Allowances,
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
    let mut identity = req.identity.clone();
    if let Some((ns, _)) = &req.host_service_account
        && !identity.protected.contains(ns)
    {
        identity.protected.push(ns.clone());
    }
    let protected = identity.protected_namespaces();
    let mut plugins = Vec::new();
    for d in &described {
        let mut watches = Vec::new();
        let all = std::iter::once(&d.description.primary)
            .chain(d.description.secondaries.iter().map(|s| &s.watch));
        for w in all {
            watches.push(resolve(w, discovery, &mut notes).await?);
        }
        let mut declared = Vec::new();
        for perm in &d.description.permissions {
            declared.push(declared_rule(perm, discovery, &mut notes).await?);
        }
        let scope = Scope::resolve(
            d.settings.namespaces.as_deref(),
            &watches
                .iter()
                .map(|w| WatchScope {
                    namespace: w.namespace.as_deref(),
                    namespaced: w.namespaced,
                })
                .collect::<Vec<_>>(),
            &protected,
        );
        let secrets = d
            .settings
            .secrets
            .values()
            .map(|r| SecretRef::parse(r).map_err(anyhow::Error::msg))
            .collect::<Result<Vec<_>>>()?;
        plugins.push(PluginRbac {
            description: &d.description,
            watches,
            declared,
            scope,
            secrets,
        });
    }
    // An allowance names plugins: one naming none of these is a typo, not a no-op.
    for (flag, allow) in [
        ("--all-namespaces", &req.allow.all_namespaces),
        ("--allow-risky", &req.allow.risky),
    ] {
        for name in allow.names() {
            anyhow::ensure!(
                plugins.iter().any(|p| p.description.name == name),
                "{flag} {name}: no plugin given is named {name:?} (the names: {})",
                plugins
                    .iter()
                    .map(|p| p.description.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    for p in &plugins {
        if p.declared.iter().any(|r| r.namespaced) {
            notes.push(format!("{} acts in {}", p.description.name, p.scope));
        }
        match rbac::plugin_objects(&identity, p, &req.allow) {
            Ok(grant) => {
                objects.extend(grant.objects);
                notes.extend(grant.warnings.into_iter().map(|w| format!("WARNING: {w}")));
            }
            Err(e) => problems.push(e),
        }
    }
    anyhow::ensure!(
        problems.is_empty(),
        "nothing printed: {}",
        problems.join("\n")
    );
    if let Some((ns, name)) = &req.host_service_account {
        objects.extend(rbac::host_objects(&identity, (ns, name), &plugins));
    }
    Ok(RbacOutput { objects, notes })
}

/// Cluster-scoped resources of the built-in groups, for when no cluster is given to ask.
const CLUSTER_SCOPED: &[(&str, &str)] = &[
    ("", "nodes"),
    ("", "namespaces"),
    ("", "persistentvolumes"),
    ("", "componentstatuses"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("apiregistration.k8s.io", "apiservices"),
    ("storage.k8s.io", "storageclasses"),
    ("storage.k8s.io", "csidrivers"),
    ("storage.k8s.io", "csinodes"),
    ("storage.k8s.io", "volumeattachments"),
    ("scheduling.k8s.io", "priorityclasses"),
    ("node.k8s.io", "runtimeclasses"),
    ("networking.k8s.io", "ingressclasses"),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
    ),
    ("admissionregistration.k8s.io", "mutatingadmissionpolicies"),
    (
        "admissionregistration.k8s.io",
        "mutatingadmissionpolicybindings",
    ),
    ("certificates.k8s.io", "certificatesigningrequests"),
    ("flowcontrol.apiserver.k8s.io", "flowschemas"),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
    ),
];

/// A declared permission with the scope of its resource: from discovery when a cluster is given,
/// else from the built-in list (anything else assumed namespaced, with a note).
async fn declared_rule(
    perm: &Permission,
    discovery: Option<&Discovery>,
    notes: &mut Vec<String>,
) -> Result<DeclaredRule> {
    let base = perm.resource.split('/').next().unwrap_or_default();
    let namespaced = if base == "*" {
        true
    } else {
        match discovery {
            Some(d) => {
                let g = d.group(&perm.group).await.map_err(|e| {
                    anyhow::anyhow!("resolve group {:?}: {}", perm.group, e.message)
                })?;
                g.by_plural(base)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "a declared permission names {base:?} in group {:?}, which the API server does not serve",
                            perm.group
                        )
                    })?
                    .namespaced
            }
            None => {
                let known = CLUSTER_SCOPED
                    .iter()
                    .any(|(g, r)| *g == perm.group && *r == base);
                let builtin = perm.group.is_empty()
                    || !perm.group.contains('.')
                    || perm.group.ends_with(".k8s.io");
                if !known && !builtin {
                    notes.push(format!(
                        "{base} (group {}) assumed to be namespaced (no cluster given: pass --kubeconfig to resolve it)",
                        perm.group
                    ));
                }
                !known
            }
        }
    };
    Ok(DeclaredRule {
        group: perm.group.clone(),
        resource: perm.resource.clone(),
        verbs: perm.verbs.clone(),
        namespaced,
    })
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
            let namespaced = !CLUSTER_SCOPED
                .iter()
                .any(|(g, r)| *g == w.kind.group && *r == plural);
            notes.push(format!(
                "{} assumed to be resource {plural:?}, {} (no cluster given: pass --kubeconfig to resolve it)",
                w.kind.kind,
                if namespaced { "namespaced" } else { "cluster-scoped" }
            ));
            (plural, namespaced)
        }
    };
    Ok(WatchedResource {
        group: w.kind.group.clone(),
        plural,
        namespace,
        namespaced,
    })
}

/// The YAML stream, with the notes as comments first. `existing` is the cluster's namespaces when
/// one was given: each namespace the objects name that it lacks is printed as a Namespace before
/// them, so that `kubectl apply -f` works on a fresh cluster (kubectl applies in order, and a Role
/// in a missing namespace is refused). A namespace that exists is never printed: applying a bare
/// Namespace over one that is managed elsewhere would take its labels away (Pod Security, what
/// NetworkPolicies select). Without a cluster the namespaces needed are named in a note.
pub fn render(out: &RbacOutput, existing: Option<&BTreeSet<String>>) -> Result<String> {
    let needed = namespaces_named(&out.objects);
    let mut notes = out.notes.clone();
    let mut objects = Vec::new();
    match existing {
        Some(existing) => {
            for ns in needed.iter().filter(|ns| !existing.contains(*ns)) {
                objects.push(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
            }
        }
        None if !needed.is_empty() => notes.push(format!(
            "these namespaces must exist before this is applied (with --kubeconfig the missing ones are printed as Namespace objects): {}",
            needed.iter().cloned().collect::<Vec<_>>().join(", ")
        )),
        None => {}
    }
    let mut text = String::new();
    for n in &notes {
        text.push_str(&format!("# note: {n}\n"));
    }
    objects.extend(out.objects.iter().cloned());
    text.push_str(&rbac::to_yaml(&objects).context("render YAML")?);
    Ok(text)
}

/// The namespaces the objects live in, but the cluster's own (which always exist).
fn namespaces_named(objects: &[serde_json::Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .filter(|ns| {
            !matches!(
                *ns,
                "default" | "kube-system" | "kube-public" | "kube-node-lease"
            )
        })
        .map(str::to_string)
        .collect()
}

/// The namespaces the cluster has (their names only).
pub async fn existing_namespaces(client: &kube::Client) -> Result<BTreeSet<String>> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<kube::core::PartialObjectMeta<Namespace>> = kube::Api::all(client.clone());
    let list = api
        .list_metadata(&kube::api::ListParams::default())
        .await
        .context("list namespaces")?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
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

#[cfg(test)]
mod namespace_tests {
    use super::*;

    fn objects() -> RbacOutput {
        RbacOutput {
            objects: vec![
                serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a", "namespace": "wcm-system"}}),
                serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r", "namespace": "default"}}),
                serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r", "namespace": "payments"}}),
            ],
            notes: Vec::new(),
        }
    }

    #[test]
    fn a_namespace_the_cluster_lacks_is_printed_before_what_lives_in_it() {
        let existing = BTreeSet::from(["payments".to_string()]);
        let text = render(&objects(), Some(&existing)).expect("renders");
        let ns = text.find("kind: Namespace").expect(&text);
        assert!(
            ns < text.find("kind: ServiceAccount").expect(&text),
            "{text}"
        );
        assert_eq!(
            text.matches("kind: Namespace").count(),
            1,
            "only wcm-system: not default, not the existing payments: {text}"
        );
        assert!(text.contains("name: wcm-system"), "{text}");
    }

    #[test]
    fn without_a_cluster_no_namespace_is_printed_but_a_note_names_them() {
        let text = render(&objects(), None).expect("renders");
        assert_eq!(text.matches("kind: Namespace").count(), 0, "{text}");
        let note = text
            .lines()
            .find(|l| l.contains("must exist"))
            .expect(&text);
        assert!(
            note.starts_with("# note:") && note.ends_with("payments, wcm-system"),
            "{note}"
        );
    }
}
