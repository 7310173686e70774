//! The RBAC that grants each plugin exactly what it declares, and the host exactly what it needs
//! to act for them: generated from the plugins' descriptions, for an operator to review and apply
//! (`wasm-controller-manager rbac PLUGIN.wasm…`).
//!
//! Per plugin: a ServiceAccount; a ClusterRole with its declared permissions and list/watch of what
//! it watches in all namespaces; a Role in each namespace it watches alone; events create/patch where
//! its events go; get on the Secrets its NAME.toml names. For the host, per plugin: list/watch of
//! what it watches (the shared informers) and `impersonate` on its ServiceAccount; and, shared,
//! CRD list/watch and its leader-election Leases.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::identity::IdentitySettings;
use crate::contract::Description;
use crate::loading::settings::SecretRef;

/// A watch resolved to its resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchedResource {
    pub group: String,
    pub plural: String,
    /// The namespace watched; None: all namespaces (or a cluster-scoped kind).
    pub namespace: Option<String>,
    pub namespaced: bool,
}

/// One plugin as the generator sees it.
pub struct PluginRbac<'a> {
    pub description: &'a Description,
    pub watches: Vec<WatchedResource>,
    /// Secrets named in its NAME.toml.
    pub secrets: Vec<SecretRef>,
}

/// Rules by scope: None = cluster-wide (ClusterRole), Some(ns) = a Role in ns.
type Rules = BTreeMap<Option<String>, BTreeMap<(String, String), BTreeSet<String>>>;

fn add(rules: &mut Rules, ns: Option<&str>, group: &str, resource: &str, verbs: &[&str]) {
    let set = rules
        .entry(ns.map(str::to_string))
        .or_default()
        .entry((group.to_string(), resource.to_string()))
        .or_default();
    set.extend(verbs.iter().map(|v| v.to_string()));
}

/// The watch rules (list, watch) by scope, and where events about watched objects are written.
fn watch_rules(rules: &mut Rules, watches: &[WatchedResource], with_events: bool) {
    for w in watches {
        let ns = w.namespace.as_deref().filter(|_| w.namespaced);
        add(rules, ns, &w.group, &w.plural, &["list", "watch"]);
        if with_events {
            // Events about cluster-scoped objects go to "default", as client-go writes them.
            let events_ns = if w.namespaced { ns } else { Some("default") };
            add(
                rules,
                events_ns,
                "events.k8s.io",
                "events",
                &["create", "patch"],
            );
        }
    }
}

fn rules_json(rules: &BTreeMap<(String, String), BTreeSet<String>>) -> Vec<Value> {
    rules
        .iter()
        .map(|((group, resource), verbs)| {
            let verbs: Vec<&String> = if verbs.contains("*") {
                verbs.iter().filter(|v| *v == "*").collect()
            } else {
                verbs.iter().collect()
            };
            json!({"apiGroups": [group], "resources": [resource], "verbs": verbs})
        })
        .collect()
}

fn role_and_binding(
    name: &str,
    ns: Option<&str>,
    rules: &BTreeMap<(String, String), BTreeSet<String>>,
    subject: Value,
    labels: &Value,
) -> [Value; 2] {
    let (role_kind, binding_kind) = match ns {
        None => ("ClusterRole", "ClusterRoleBinding"),
        Some(_) => ("Role", "RoleBinding"),
    };
    let meta = |n: &str| {
        let mut m = json!({"name": n, "labels": labels});
        if let Some(ns) = ns {
            m["namespace"] = json!(ns);
        }
        m
    };
    [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": role_kind,
            "metadata": meta(name),
            "rules": rules_json(rules),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": binding_kind,
            "metadata": meta(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [subject],
        }),
    ]
}

/// The objects that grant one plugin what it declares.
pub fn plugin_objects(identity: &IdentitySettings, p: &PluginRbac<'_>) -> Vec<Value> {
    let d = p.description;
    let sa = identity.service_account(&d.name);
    let labels = json!({"app.kubernetes.io/managed-by": "wasm-controller-manager", "wcm.dev/plugin": d.name});
    let mut out = vec![json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": sa, "namespace": identity.namespace, "labels": labels},
    })];
    let mut rules = Rules::new();
    for perm in &d.permissions {
        let verbs: Vec<&str> = perm.verbs.iter().map(String::as_str).collect();
        add(&mut rules, None, &perm.group, &perm.resource, &verbs);
    }
    watch_rules(&mut rules, &p.watches, true);
    // One Role per Secret, limited to its name (several keys of one Secret share it).
    let secrets: BTreeSet<(&str, &str)> = p
        .secrets
        .iter()
        .map(|s| (s.namespace.as_str(), s.name.as_str()))
        .collect();
    for (namespace, secret) in secrets {
        let role = format!("wcm-plugin:{}:secret:{secret}", d.name);
        let meta = json!({"name": role, "namespace": namespace, "labels": labels});
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}],
        }));
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": identity.namespace}],
        }));
    }
    let subject = json!({"kind": "ServiceAccount", "name": sa, "namespace": identity.namespace});
    let name = format!("wcm-plugin:{}", d.name);
    for (ns, r) in &rules {
        out.extend(role_and_binding(
            &name,
            ns.as_deref(),
            r,
            subject.clone(),
            &labels,
        ));
    }
    out
}

/// What the host's own ServiceAccount needs for these plugins: list/watch of what they watch (the
/// shared informers run as the host) and of CRDs (to keep discovery fresh), its leader-election
/// Leases, and impersonation of exactly their ServiceAccounts.
///
/// The objects for a plugin are named after it (`wcm-host:watch:PLUGIN`,
/// `wcm-host:impersonate:PLUGIN`), and the shared ones do not depend on the plugins, so grants
/// add up: applying the output for one new plugin leaves the others' grants as they were.
pub fn host_objects(
    identity: &IdentitySettings,
    host_sa: (&str, &str),
    plugins: &[PluginRbac<'_>],
) -> Vec<Value> {
    let labels = json!({"app.kubernetes.io/managed-by": "wasm-controller-manager"});
    let subject = json!({"kind": "ServiceAccount", "name": host_sa.1, "namespace": host_sa.0});
    let mut out = Vec::new();
    // CRD metadata: the discovery cache follows CRDs that are deleted or re-created.
    let mut crds = Rules::new();
    add(
        &mut crds,
        None,
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["list", "watch"],
    );
    for (ns, r) in &crds {
        out.extend(role_and_binding(
            "wcm-host:crds",
            ns.as_deref(),
            r,
            subject.clone(),
            &labels,
        ));
    }
    // Leader election (`--leader-elect`) on Leases in the host's own namespace; per plugin, the
    // membership Leases are listed, and a member gone for a lease duration is deleted.
    let meta =
        json!({"name": "wcm-host:leader-election", "namespace": host_sa.0, "labels": labels});
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "create", "update", "delete"]}],
    }));
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wcm-host:leader-election"},
        "subjects": [subject.clone()],
    }));
    // Per plugin: its informers (run as the host) and its ServiceAccount to impersonate.
    let mut by_name: BTreeMap<&str, Vec<WatchedResource>> = BTreeMap::new();
    for p in plugins {
        by_name
            .entry(p.description.name.as_str())
            .or_default()
            .extend(p.watches.iter().cloned());
    }
    for (plugin, watches) in by_name {
        let plugin_labels = json!({"app.kubernetes.io/managed-by": "wasm-controller-manager", "wcm.dev/plugin": plugin});
        let mut rules = Rules::new();
        watch_rules(&mut rules, &watches, false);
        let name = format!("wcm-host:watch:{plugin}");
        for (ns, r) in &rules {
            out.extend(role_and_binding(
                &name,
                ns.as_deref(),
                r,
                subject.clone(),
                &plugin_labels,
            ));
        }
        let role = format!("wcm-host:impersonate:{plugin}");
        let meta = json!({"name": role, "namespace": identity.namespace, "labels": plugin_labels});
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [identity.service_account(plugin)], "verbs": ["impersonate"]}],
        }));
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [subject.clone()],
        }));
    }
    out
}

/// The objects as one YAML stream (`---` between documents), ready for `kubectl apply -f -` or a
/// kustomize resource file.
pub fn to_yaml(objects: &[Value]) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(o)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{KindRef, Permission, Watch};

    fn description() -> Description {
        let watch = |kind: &str, ns: Option<&str>| Watch {
            kind: KindRef {
                group: String::new(),
                version: "v1".into(),
                kind: kind.into(),
            },
            namespace: ns.map(str::to_string),
            label_selector: None,
            metadata_only: false,
        };
        Description {
            name: "demo".into(),
            version: "1".into(),
            primary: watch("ConfigMap", Some("team-a")),
            secondaries: vec![],
            resync_seconds: None,
            workers: None,
            permissions: vec![Permission {
                group: String::new(),
                resource: "configmaps".into(),
                verbs: vec!["get".into(), "patch".into()],
            }],
            outbound_hosts: vec![],
            config_keys: vec![],
            extensions: vec![],
        }
    }

    #[test]
    fn a_plugin_gets_its_declaration_and_a_namespaced_watch_stays_in_its_namespace() {
        let d = description();
        let p = PluginRbac {
            description: &d,
            watches: vec![WatchedResource {
                group: String::new(),
                plural: "configmaps".into(),
                namespace: Some("team-a".into()),
                namespaced: true,
            }],
            secrets: vec![SecretRef {
                namespace: "team-a".into(),
                name: "creds".into(),
                key: "password".into(),
            }],
        };
        let ids = IdentitySettings::default();
        let objs = plugin_objects(&ids, &p);
        let kinds: Vec<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding"
            ]
        );
        let cluster_role = &objs[3];
        assert_eq!(
            cluster_role["rules"],
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}])
        );
        let ns_role = &objs[5];
        assert_eq!(ns_role["metadata"]["namespace"], "team-a");
        let text = ns_role["rules"].to_string();
        assert!(text.contains("\"list\",\"watch\""), "{text}");
        assert!(text.contains("events.k8s.io"), "{text}");
        let secret_role = &objs[1];
        assert_eq!(secret_role["rules"][0]["resourceNames"], json!(["creds"]));
        assert_eq!(
            objs[0]["metadata"]["name"], "wcm-plugin-demo",
            "the ServiceAccount the host impersonates"
        );

        let host = host_objects(&ids, ("wcm-system", "wasm-controller-manager"), &[p]);
        let imp = host
            .iter()
            .find(|o| o["metadata"]["name"] == "wcm-host:impersonate:demo" && o["kind"] == "Role")
            .expect("impersonation role");
        assert_eq!(
            imp["rules"][0]["resourceNames"],
            json!(["wcm-plugin-demo"]),
            "only the plugins' own ServiceAccounts"
        );
        assert!(to_yaml(&host).expect("yaml").contains("impersonate"));
    }
}
