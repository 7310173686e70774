//! The RBAC that grants each plugin exactly what it declares, where the operator lets it act, and
//! the host exactly what it needs to act for them: generated from the plugins' descriptions, for an
//! operator to review and apply (`wasm-controller-manager rbac PLUGIN.wasm…`).
//!
//! Per plugin: a ServiceAccount; its declared permissions on cluster-scoped kinds in a ClusterRole,
//! and on namespaced kinds in a Role in each namespace where it acts (its [`Scope`]): never in a
//! protected namespace (the plugins' identity namespace, the host's) unless its NAME.toml names
//! it, and cluster-wide only when the operator asks (`--all-namespaces`); events create/patch
//! where it acts (and in `default`, for cluster-scoped kinds); list/watch of what it watches,
//! where it watches (reads follow the declaration: a ClusterRole for a watch of every
//! namespace); get on the Secrets its NAME.toml names. Rights that lead to
//! others' (wildcards, escalate, bind, impersonate, tokens, exec, webhooks, CSR approval, every
//! Secret) are refused unless the operator passes `--allow-risky`, and then printed with a warning
//! naming the risk. For the host, per plugin: list/watch of what it watches (the shared
//! informers) and `impersonate` on its ServiceAccount; and, shared, CRD list/watch and its
//! leader-election Leases.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::identity::IdentitySettings;
use super::scope::Scope;
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

/// A declared permission with the scope of its resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredRule {
    pub group: String,
    /// Plural, with "/subresource" where it applies, or "*".
    pub resource: String,
    pub verbs: Vec<String>,
    /// Whether the resource lives in namespaces ("*" counts as namespaced).
    pub namespaced: bool,
}

/// One plugin as the generator sees it.
pub struct PluginRbac<'a> {
    pub description: &'a Description,
    pub watches: Vec<WatchedResource>,
    /// Its declared permissions, resolved to their scope.
    pub declared: Vec<DeclaredRule>,
    /// Where it acts.
    pub scope: Scope,
    /// Secrets named in its NAME.toml.
    pub secrets: Vec<SecretRef>,
}

/// The plugins an allowance is given to, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    plugins: BTreeSet<String>,
    every: bool,
}

impl Allow {
    /// These plugins (the operator names each).
    pub fn plugins<I: IntoIterator<Item = String>>(names: I) -> Self {
        Allow {
            plugins: names.into_iter().collect(),
            every: false,
        }
    }

    /// Every plugin given (for tests that play the operator of their own plugins; the CLI names
    /// plugins one by one).
    pub fn every() -> Self {
        Allow {
            plugins: BTreeSet::new(),
            every: true,
        }
    }

    pub fn covers(&self, plugin: &str) -> bool {
        self.every || self.plugins.contains(plugin)
    }

    /// The plugins named.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.plugins.iter().map(String::as_str)
    }
}

/// What the operator allows beyond the default, plugin by plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowances {
    /// `--all-namespaces PLUGIN`: grant the declared rights (and events) of a plugin that acts in
    /// every namespace cluster-wide, protected namespaces included (RBAC cannot leave one out).
    pub all_namespaces: Allow,
    /// `--allow-risky PLUGIN`: print its rights that lead to others' (with a warning) instead of
    /// refusing them.
    pub risky: Allow,
}

/// A plugin's objects, and the warnings to print above them.
pub struct PluginGrant {
    pub objects: Vec<Value>,
    pub warnings: Vec<String>,
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

const WRITE_VERBS: [&str; 6] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

fn group_name(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

/// Rights that lead to others' (the well-known RBAC risk lists): each with what it costs.
/// `cluster_wide` is whether the plugin's namespaced rights would be granted in every namespace.
fn risks(p: &PluginRbac<'_>, cluster_wide: bool) -> Vec<String> {
    let mut out = Vec::new();
    for r in &p.declared {
        let has = |v: &str| r.verbs.iter().any(|x| x == v);
        let writes = WRITE_VERBS.iter().any(|v| has(v));
        let creates = has("create") || has("*");
        let reads = has("get") || has("list") || has("watch") || has("*");
        let what = format!("{} (group {})", r.resource, group_name(&r.group));
        if has("*") {
            out.push(format!(
                "verb \"*\" on {what}: every verb, escalate, bind and impersonate included"
            ));
        }
        if r.resource == "*" || r.resource.starts_with("*/") {
            out.push(format!(
                "resource \"*\" in group {}: every resource of the group, Secrets and RBAC included",
                group_name(&r.group)
            ));
        }
        for (verb, why) in [
            ("escalate", "grants rights its identity does not hold"),
            ("bind", "binds roles its identity does not hold"),
            ("impersonate", "acts as other users or ServiceAccounts"),
        ] {
            if has(verb) {
                out.push(format!("{verb} on {what}: {why}"));
            }
        }
        let risk = match (r.group.as_str(), r.resource.as_str()) {
            ("", "serviceaccounts/token") if writes => {
                Some("mints tokens for every ServiceAccount where it acts")
            }
            ("", "secrets") if creates => Some(
                "creates Secrets, and a service-account-token Secret is filled with a token of any ServiceAccount where it acts",
            ),
            ("", "secrets") if cluster_wide && reads => {
                Some("reads every Secret in every namespace, the host's included")
            }
            ("", "pods/exec" | "pods/attach" | "pods/portforward") if writes || has("get") => {
                Some("runs commands in, or connects to, every Pod where it acts")
            }
            ("", "nodes/proxy") => Some("reaches every kubelet's API, and through it every Pod"),
            ("", "persistentvolumes") if creates => {
                Some("creates volumes, a hostPath into any node's files among them")
            }
            (
                "",
                "pods" | "replicationcontrollers" | "configmaps" | "secrets" | "serviceaccounts",
            )
            | ("apps", "deployments" | "daemonsets" | "statefulsets" | "replicasets")
            | ("batch", "jobs" | "cronjobs")
            | ("coordination.k8s.io", "leases")
                if writes && cluster_wide =>
            {
                Some(
                    "writes it in every namespace, other controllers' included: what runs there, as their ServiceAccounts, and their configuration or Leases",
                )
            }
            (
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings",
            ) if writes => Some("sees, rejects or rewrites API requests cluster-wide"),
            ("certificates.k8s.io", "certificatesigningrequests/approval") if writes => {
                Some("approves certificates, for a node or system:masters too")
            }
            ("certificates.k8s.io", "certificatesigningrequests")
            | (
                "certificates.k8s.io",
                "certificatesigningrequests/nodeclient"
                | "certificatesigningrequests/selfnodeclient",
            ) if creates => Some(
                "requests client certificates, a node's among them, which the control plane may approve by itself",
            ),
            ("certificates.k8s.io", "signers") if has("approve") || has("sign") => {
                Some("approves or signs certificates, for a node or system:masters too")
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") if writes => Some(
                "changes or deletes any custom kind: a conversion webhook of its own sees every object of it, a deletion wipes them",
            ),
            ("apiregistration.k8s.io", "apiservices") if writes => {
                Some("redirects a whole API group to a server of its choosing")
            }
            (
                "rbac.authorization.k8s.io",
                "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings",
            ) if writes => {
                Some("changes or deletes grants, other plugins' and the host's among them")
            }
            ("flowcontrol.apiserver.k8s.io", "flowschemas" | "prioritylevelconfigurations")
                if writes =>
            {
                Some("decides whose API requests wait, the host's included")
            }
            _ => None,
        };
        if let Some(why) = risk {
            out.push(format!("{} on {what}: {why}", r.verbs.join(", ")));
        }
    }
    for w in &p.watches {
        if w.group.is_empty() && w.plural == "secrets" && w.namespaced && w.namespace.is_none() {
            out.push(
                "a watch of Secrets in every namespace: reads every Secret, the host's included"
                    .into(),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The objects that grant one plugin what it declares, where it acts; an error lists everything
/// the operator must decide first.
pub fn plugin_objects(
    identity: &IdentitySettings,
    p: &PluginRbac<'_>,
    allow: &Allowances,
) -> Result<PluginGrant, String> {
    let d = p.description;
    let protected = identity.protected_namespaces();
    let sa = identity.service_account(&d.name);
    let labels = json!({"app.kubernetes.io/managed-by": "wasm-controller-manager", "wcm.dev/plugin": d.name});
    let mut out = vec![json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": sa, "namespace": identity.namespace, "labels": labels},
    })];
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut rules = Rules::new();
    let cluster_wide = p.scope.is_all() && allow.all_namespaces.covers(&d.name);
    for rule in &p.declared {
        let verbs: Vec<&str> = rule.verbs.iter().map(String::as_str).collect();
        let what = format!(
            "{} on {} (group {})",
            verbs.join(", "),
            rule.resource,
            group_name(&rule.group)
        );
        if !rule.namespaced {
            add(&mut rules, None, &rule.group, &rule.resource, &verbs);
            continue;
        }
        match &p.scope {
            Scope::Namespaces {
                namespaces,
                by_operator: true,
            } if namespaces.is_empty() => problems.push(format!(
                "it declares {what}, a namespaced kind, but its NAME.toml names no namespace (`namespaces = []`): name one, or leave the plugin without that right"
            )),
            Scope::Namespaces { namespaces, .. } if namespaces.is_empty() => problems.push(format!(
                "it declares {what}, a namespaced kind, but acts in no namespace (it watches none): name where with `namespaces = [...]` in its NAME.toml"
            )),
            Scope::Namespaces { namespaces, .. } => {
                for ns in namespaces {
                    add(&mut rules, Some(ns), &rule.group, &rule.resource, &verbs);
                }
            }
            Scope::AllExcept(_) if cluster_wide => {
                add(&mut rules, None, &rule.group, &rule.resource, &verbs);
                warnings.push(format!(
                    "{}: {what} in every namespace (--all-namespaces {}), {protected} included: RBAC cannot leave a namespace out, so there only the host's own fence refuses its calls",
                    d.name, d.name
                ));
            }
            Scope::AllExcept(_) => problems.push(format!(
                "it declares {what} and acts in every namespace (it watches a kind in all of them), but RBAC cannot grant every namespace except {protected}: name where it acts with `namespaces = [...]` in its NAME.toml, or pass --all-namespaces {} to grant every namespace, {protected} included",
                d.name
            )),
        }
    }
    let named = |ns: &str| match &p.scope {
        Scope::Namespaces {
            namespaces,
            by_operator: true,
        } => namespaces.contains(ns),
        _ => false,
    };
    for w in &p.watches {
        if let Some(ns) = w.namespace.as_deref().filter(|_| w.namespaced)
            && protected.contains(ns)
            && !named(ns)
        {
            problems.push(format!(
                "it watches {} in {ns}, a protected namespace (the plugins' or the host's): name it in `namespaces` in its NAME.toml to grant it",
                w.plural
            ));
        }
    }
    if cluster_wide
        && !p.declared.iter().any(|r| r.namespaced)
        && p.watches.iter().any(|w| w.namespaced)
    {
        warnings.push(format!(
            "{}: events in every namespace (--all-namespaces {}), {protected} included",
            d.name, d.name
        ));
    }
    for risk in risks(p, cluster_wide) {
        if allow.risky.covers(&d.name) {
            warnings.push(format!(
                "{}: {risk} (printed because of --allow-risky {})",
                d.name, d.name
            ));
        } else {
            problems.push(format!(
                "{risk}: pass --allow-risky {} to print it anyway",
                d.name
            ));
        }
    }
    if !problems.is_empty() {
        return Err(format!("plugin {}: {}", d.name, problems.join("; ")));
    }
    // Reads follow the watches; events (writes) go where it acts, as its other writes do.
    watch_rules(&mut rules, &p.watches, false);
    let events = |rules: &mut Rules, ns: Option<&str>| {
        add(rules, ns, "events.k8s.io", "events", &["create", "patch"]);
    };
    if p.watches.iter().any(|w| !w.namespaced) {
        // Events about cluster-scoped objects go to "default", as client-go writes them.
        events(&mut rules, Some("default"));
    }
    if p.watches.iter().any(|w| w.namespaced) {
        match &p.scope {
            Scope::Namespaces { namespaces, .. } => {
                for ns in namespaces {
                    events(&mut rules, Some(ns));
                }
            }
            Scope::AllExcept(_) if cluster_wide => events(&mut rules, None),
            Scope::AllExcept(_) => warnings.push(format!(
                "{}: watches a kind in every namespace, but its events are granted nowhere there (the API server refuses them): name where it acts with `namespaces = [...]` in its NAME.toml, or pass --all-namespaces {}",
                d.name, d.name
            )),
        }
    }
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
    Ok(PluginGrant {
        objects: out,
        warnings,
    })
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
    use crate::cluster::scope::WatchScope;
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
            schedules: vec![],
            metrics: vec![],
            propagate_trace_context: false,
        }
    }

    fn configmaps(verbs: &[&str]) -> DeclaredRule {
        DeclaredRule {
            group: String::new(),
            resource: "configmaps".into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            namespaced: true,
        }
    }

    fn watch_of(plural: &str, namespace: Option<&str>) -> WatchedResource {
        WatchedResource {
            group: String::new(),
            plural: plural.into(),
            namespace: namespace.map(str::to_string),
            namespaced: true,
        }
    }

    fn scope_of(watches: &[WatchedResource], operator: Option<&[String]>) -> Scope {
        let ws: Vec<WatchScope<'_>> = watches
            .iter()
            .map(|w| WatchScope {
                namespace: w.namespace.as_deref(),
                namespaced: w.namespaced,
            })
            .collect();
        Scope::resolve(
            operator,
            &ws,
            &IdentitySettings::default().protected_namespaces(),
        )
    }

    #[test]
    fn a_plugin_gets_its_declaration_in_the_namespace_it_watches_and_nowhere_else() {
        let d = description();
        let watches = vec![watch_of("configmaps", Some("team-a"))];
        let p = PluginRbac {
            description: &d,
            scope: scope_of(&watches, None),
            watches,
            declared: vec![configmaps(&["get", "patch"])],
            secrets: vec![SecretRef {
                namespace: "team-a".into(),
                name: "creds".into(),
                key: "password".into(),
            }],
        };
        let ids = IdentitySettings::default();
        let objs = plugin_objects(&ids, &p, &Allowances::default())
            .expect("grantable")
            .objects;
        let kinds: Vec<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding"
            ],
            "no ClusterRole: everything it declares is namespaced"
        );
        let ns_role = &objs[3];
        assert_eq!(ns_role["metadata"]["namespace"], "team-a");
        let text = ns_role["rules"].to_string();
        assert!(
            text.contains("\"get\",\"list\",\"patch\",\"watch\""),
            "its declaration and its watch, in team-a: {text}"
        );
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

    #[test]
    fn a_plugin_acting_everywhere_is_never_granted_the_hosts_namespace_unasked() {
        let d = description();
        let watches = vec![watch_of("configmaps", None)];
        let p = PluginRbac {
            description: &d,
            scope: scope_of(&watches, None),
            watches: watches.clone(),
            declared: vec![DeclaredRule {
                group: "apps".into(),
                resource: "deployments".into(),
                verbs: vec!["get".into(), "patch".into()],
                namespaced: true,
            }],
            secrets: vec![],
        };
        let ids = IdentitySettings {
            protected: vec!["host-ns".into()],
            ..IdentitySettings::default()
        };
        let err = plugin_objects(&ids, &p, &Allowances::default())
            .err()
            .expect("refused without a choice of namespaces");
        assert!(err.contains("namespaces = [...]"), "{err}");
        assert!(
            err.contains("host-ns, kube-node-lease, kube-public, kube-system, wcm-system"),
            "{err}"
        );

        // The operator names the namespaces: Roles there only.
        let named = ["team-a".to_string(), "team-b".to_string()];
        let p2 = PluginRbac {
            scope: scope_of(&watches, Some(&named)),
            declared: p.declared.clone(),
            watches: watches.clone(),
            description: &d,
            secrets: vec![],
        };
        let objs = plugin_objects(&ids, &p2, &Allowances::default())
            .expect("grantable")
            .objects;
        let deploy_grants: Vec<(&str, Option<&str>)> = objs
            .iter()
            .filter(|o| o["rules"].to_string().contains("deployments"))
            .map(|o| {
                (
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["namespace"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            deploy_grants,
            [("Role", Some("team-a")), ("Role", Some("team-b"))]
        );

        // Or asks for every namespace, with a warning naming the protected ones.
        let other = Allowances {
            all_namespaces: Allow::plugins(["another".to_string()]),
            ..Allowances::default()
        };
        assert!(
            plugin_objects(&ids, &p, &other).is_err(),
            "the allowance is per plugin"
        );
        // Asked, but a Deployment patch in every namespace (other controllers' among them) is a
        // risky right too: printed only with --allow-risky, and then with both warnings.
        let asked = Allowances {
            all_namespaces: Allow::plugins(["demo".to_string()]),
            ..Allowances::default()
        };
        let err = plugin_objects(&ids, &p, &asked)
            .err()
            .expect("risky cluster-wide");
        assert!(err.contains("--allow-risky demo"), "{err}");
        let asked = Allowances {
            all_namespaces: Allow::plugins(["demo".to_string()]),
            risky: Allow::plugins(["demo".to_string()]),
        };
        let grant = plugin_objects(&ids, &p, &asked).expect("grantable when asked");
        assert!(
            grant
                .objects
                .iter()
                .any(|o| o["kind"] == "ClusterRole"
                    && o["rules"].to_string().contains("deployments"))
        );
        assert!(grant.warnings[0].contains("kube-system, wcm-system included"));
        assert!(grant.warnings[1].contains("other controllers'"));
    }

    #[test]
    fn a_watch_in_a_protected_namespace_is_granted_only_when_named() {
        let d = description();
        let watches = vec![watch_of("configmaps", Some("wcm-system"))];
        let p = PluginRbac {
            description: &d,
            scope: scope_of(&watches, None),
            watches: watches.clone(),
            declared: vec![],
            secrets: vec![],
        };
        let ids = IdentitySettings::default();
        let err = plugin_objects(&ids, &p, &Allowances::default())
            .err()
            .expect("refused");
        assert!(err.contains("protected namespace"), "{err}");
        let named = ["wcm-system".to_string()];
        let p2 = PluginRbac {
            scope: scope_of(&watches, Some(&named)),
            ..p
        };
        assert!(plugin_objects(&ids, &p2, &Allowances::default()).is_ok());
    }

    #[test]
    fn rights_that_lead_to_others_are_refused_unless_allowed_and_then_named() {
        let d = description();
        let watches = vec![
            watch_of("configmaps", Some("team-a")),
            watch_of("secrets", None),
        ];
        let rule = |group: &str, resource: &str, verbs: &[&str]| DeclaredRule {
            group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            namespaced: true,
        };
        let p = PluginRbac {
            description: &d,
            scope: Scope::Namespaces {
                namespaces: ["team-a".to_string()].into_iter().collect(),
                by_operator: true,
            },
            watches,
            declared: vec![
                rule("", "configmaps", &["*"]),
                rule("apps", "*", &["get"]),
                rule("rbac.authorization.k8s.io", "roles", &["escalate", "bind"]),
                rule("", "serviceaccounts/token", &["create"]),
                rule("", "pods/exec", &["create"]),
                DeclaredRule {
                    namespaced: false,
                    ..rule("", "nodes/proxy", &["get"])
                },
                DeclaredRule {
                    namespaced: false,
                    ..rule(
                        "admissionregistration.k8s.io",
                        "mutatingwebhookconfigurations",
                        &["create"],
                    )
                },
                DeclaredRule {
                    namespaced: false,
                    ..rule(
                        "certificates.k8s.io",
                        "certificatesigningrequests/approval",
                        &["update"],
                    )
                },
                DeclaredRule {
                    namespaced: false,
                    ..rule("", "users", &["impersonate"])
                },
                rule("", "secrets", &["create"]),
            ]
            .into_iter()
            .chain(
                [
                    (
                        "certificates.k8s.io",
                        "certificatesigningrequests",
                        "create",
                    ),
                    ("apiextensions.k8s.io", "customresourcedefinitions", "patch"),
                    ("rbac.authorization.k8s.io", "clusterrolebindings", "delete"),
                    ("", "persistentvolumes", "create"),
                    ("apiregistration.k8s.io", "apiservices", "update"),
                    ("flowcontrol.apiserver.k8s.io", "flowschemas", "create"),
                ]
                .map(|(g, r, v)| DeclaredRule {
                    namespaced: false,
                    ..rule(g, r, &[v])
                }),
            )
            .collect(),
            secrets: vec![],
        };
        let ids = IdentitySettings::default();
        let err = plugin_objects(&ids, &p, &Allowances::default())
            .err()
            .expect("refused");
        for risk in [
            "verb \"*\"",
            "resource \"*\"",
            "escalate on roles",
            "bind on roles",
            "impersonate on users",
            "mints tokens",
            "runs commands in",
            "kubelet's API",
            "rewrites API requests",
            "approves certificates",
            "a watch of Secrets in every namespace",
            "service-account-token Secret",
            "a node's among them",
            "conversion webhook",
            "other plugins' and the host's",
            "hostPath",
            "a whole API group",
            "whose API requests wait",
        ] {
            assert!(err.contains(risk), "{risk} not named in: {err}");
        }
        let grant = plugin_objects(
            &ids,
            &p,
            &Allowances {
                risky: Allow::plugins(["demo".to_string()]),
                ..Allowances::default()
            },
        )
        .expect("printed when allowed");
        assert_eq!(grant.warnings.len(), 18, "{:?}", grant.warnings);
    }
}
