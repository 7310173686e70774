//! The plugin's declaration: what it watches, which API calls it may make, what it reads.

use std::time::Duration;

use serde_json::Value;

use crate::metrics::Metric;
use crate::schedule::Schedule;
use crate::types::{KindRef, ObjectKey};
use kube_core::{ApiResource, Resource};

/// Everything the host needs to know to run a plugin, built with chained calls:
///
/// ```
/// use std::time::Duration;
/// use wcm_sdk::{Description, Mapping, ObjectKey, Permission, Watch};
/// use wcm_sdk::k8s_openapi::api::core::v1::{Node, Pod};
///
/// let d = Description::new("pod-counter", "0.1.0")
///     .primary(Watch::of::<Node>().metadata_only())
///     .secondary(Watch::of::<Pod>().metadata_only(), Mapping::FixedKey(ObjectKey::cluster("pod-count")))
///     .resync(Duration::from_secs(10))
///     .permission(Permission::new("", "nodes", &["get", "patch"]))
///     .config_key("label-key");
/// assert!(d.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Description {
    /// Unique among loaded plugins; a DNS label (lowercase letters, digits, `-`).
    pub name: String,
    /// The plugin's own version, shown in logs and metrics.
    pub version: String,
    /// The kind reconciled: its events enqueue the object's own key. Required.
    pub primary: Option<Watch>,
    /// Other kinds whose changes wake the plugin, and how they map to primary keys.
    pub secondaries: Vec<Secondary>,
    /// Every key is reconciled again after this many seconds (`None`: only on changes).
    pub resync_seconds: Option<u32>,
    /// Concurrent reconciles (distinct keys); the operator may override it.
    pub workers: Option<u32>,
    /// The API calls the plugin may make; anything else is refused with 403 `NotDeclared`.
    pub permissions: Vec<Permission>,
    /// Hosts (`host` or `host:port`) the plugin may reach over wasi:http, if the operator allows
    /// them too.
    pub outbound_hosts: Vec<String>,
    /// The configuration keys the plugin reads from its `NAME.toml`.
    pub config_keys: Vec<String>,
    /// Forward-compatible declarations: key → JSON text.
    pub extensions: Vec<(String, String)>,
    /// Cron schedules (contract 0.3): each tick enqueues a key on the leading replica.
    pub schedules: Vec<Schedule>,
    /// The plugin's own metrics (contract 0.3), updated through [`Context::metrics`].
    ///
    /// [`Context::metrics`]: crate::Context::metrics
    pub metrics: Vec<Metric>,
    /// Outbound HTTP carries the W3C trace context of the reconcile's trace (`traceparent`)
    /// when the host traces.
    pub propagate_trace_context: bool,
}

impl Description {
    /// The `change-filters` extension for the watches' [`Changes`], if any watch filters.
    pub fn change_filters_extension(&self) -> Option<(String, String)> {
        let primary = self.primary.as_ref().map_or(Changes::All, |w| w.changes);
        let secondaries: Vec<Changes> = self.secondaries.iter().map(|s| s.watch.changes).collect();
        if primary == Changes::All && secondaries.iter().all(|c| *c == Changes::All) {
            return None;
        }
        let value = serde_json::json!({
            "primary": primary.as_str(),
            "secondaries": secondaries.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        });
        Some(("change-filters".to_string(), value.to_string()))
    }

    /// The `mappings` extension for [`Mapping::AnyOwner`] and [`Mapping::Label`], if any
    /// secondary uses one.
    pub fn mappings_extension(&self) -> Option<(String, String)> {
        let entries: Vec<Value> = self
            .secondaries
            .iter()
            .map(|s| match &s.mapping {
                Mapping::AnyOwner => Value::from("any-owner"),
                Mapping::Label(key) => serde_json::json!({ "label": key }),
                _ => Value::Null,
            })
            .collect();
        if entries.iter().all(Value::is_null) {
            return None;
        }
        let value = serde_json::json!({ "secondaries": entries });
        Some(("mappings".to_string(), value.to_string()))
    }

    /// A plugin called `name` (a DNS label), at `version` (`env!("CARGO_PKG_VERSION")` is handy).
    pub fn new(name: &str, version: &str) -> Self {
        Description {
            name: name.to_string(),
            version: version.to_string(),
            primary: None,
            secondaries: Vec::new(),
            resync_seconds: None,
            workers: None,
            permissions: Vec::new(),
            outbound_hosts: Vec::new(),
            config_keys: Vec::new(),
            extensions: Vec::new(),
            schedules: Vec::new(),
            metrics: Vec::new(),
            propagate_trace_context: false,
        }
    }

    /// The primary watch: the kind reconciled.
    pub fn primary(mut self, watch: Watch) -> Self {
        self.primary = Some(watch);
        self
    }

    /// A secondary watch and how its objects map to primary keys.
    pub fn secondary(mut self, watch: Watch, mapping: Mapping) -> Self {
        self.secondaries.push(Secondary { watch, mapping });
        self
    }

    /// Reconcile every key again at this interval (whole seconds, at least 1). The operator can
    /// override it with `resync_seconds` in the plugin's `NAME.toml`.
    pub fn resync(mut self, every: Duration) -> Self {
        self.resync_seconds = Some(u32::try_from(every.as_secs()).unwrap_or(u32::MAX).max(1));
        self
    }

    /// [`Description::resync`] in seconds.
    pub fn resync_seconds(mut self, seconds: u32) -> Self {
        self.resync_seconds = Some(seconds);
        self
    }

    /// Concurrent reconciles of distinct keys.
    pub fn workers(mut self, workers: u32) -> Self {
        self.workers = Some(workers);
        self
    }

    /// An API permission the plugin needs.
    pub fn permission(mut self, permission: Permission) -> Self {
        self.permissions.push(permission);
        self
    }

    /// A host (`host` or `host:port`) the plugin may reach over wasi:http.
    pub fn outbound_host(mut self, host: &str) -> Self {
        self.outbound_hosts.push(host.to_string());
        self
    }

    /// A configuration key the plugin reads with [`Context::config`](crate::Context::config).
    pub fn config_key(mut self, key: &str) -> Self {
        self.config_keys.push(key.to_string());
        self
    }

    /// A forward-compatible declaration the contract does not have a field for yet.
    pub fn extension(mut self, key: &str, value: Value) -> Self {
        self.extensions.push((key.to_string(), value.to_string()));
        self
    }

    /// Declares a cron schedule (contract 0.3).
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Declares a metric of the plugin's own (contract 0.3).
    pub fn metric(mut self, metric: Metric) -> Self {
        self.metrics.push(metric);
        self
    }

    /// Sends the W3C trace context of the reconcile's trace with outbound HTTP requests.
    pub fn propagate_trace_context(mut self) -> Self {
        self.propagate_trace_context = true;
        self
    }

    /// Declares children of kind `K` (returned with [`Action::with_children`]): a secondary watch
    /// of `K` mapped to its controller owner (a child's change wakes its primary), and the calls
    /// the host makes for them as the plugin: `list`, `create`, `patch`, `delete` on `K`'s resource
    /// (a server-side apply that makes an object needs `create`), and `get` for the plugin's own
    /// reads.
    /// Declare `patch` on the primary's resource too: the host records the ApplySet there.
    ///
    /// [`Action::with_children`]: crate::Action::with_children
    pub fn owns<K: Resource<DynamicType = ()>>(self) -> Self {
        self.secondary(Watch::of::<K>(), Mapping::ControllerOwner)
            .permission(Permission::of::<K>(&[
                "get", "list", "create", "patch", "delete",
            ]))
    }

    /// Checks what the host checks at load time, so a unit test can catch it: the name is a DNS
    /// label, a primary watch is set, kinds and permissions are complete, numbers are positive.
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        let dns_label = !n.is_empty()
            && n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !n.starts_with('-')
            && !n.ends_with('-');
        if !dns_label {
            return Err(format!(
                "plugin name {n:?} is not a DNS label (lowercase letters, digits, '-', at most 63)"
            ));
        }
        if self.version.is_empty() {
            return Err("the plugin version is empty".into());
        }
        let Some(primary) = &self.primary else {
            return Err("no primary watch: call .primary(Watch::of::<K>())".into());
        };
        primary.validate("primary watch")?;
        for s in &self.secondaries {
            s.watch.validate("secondary watch")?;
            if let Mapping::FixedKey(key) = &s.mapping
                && key.name.is_empty()
            {
                return Err(format!(
                    "secondary watch of {}: fixed key with an empty name",
                    s.watch.kind
                ));
            }
            if let Mapping::Label(key) = &s.mapping
                && !label_key(key)
            {
                return Err(format!(
                    "secondary watch of {}: {key:?} is not a label key",
                    s.watch.kind
                ));
            }
        }
        if self.resync_seconds == Some(0) {
            return Err("resync_seconds must be at least 1".into());
        }
        if self.workers == Some(0) {
            return Err("workers must be at least 1".into());
        }
        const VERBS: [&str; 7] = ["get", "list", "create", "update", "patch", "delete", "*"];
        for p in &self.permissions {
            if p.resource.is_empty() || p.verbs.is_empty() {
                return Err(format!("permission {p:?}: resource and verbs are required"));
            }
            if let Some(v) = p.verbs.iter().find(|v| !VERBS.contains(&v.as_str())) {
                return Err(format!(
                    "permission on {:?}: unknown verb {v:?} (expected one of {VERBS:?})",
                    p.resource
                ));
            }
        }
        for (key, value) in &self.extensions {
            serde_json::from_str::<Value>(value)
                .map_err(|e| format!("extension {key:?} is not JSON: {e}"))?;
        }
        let metrics: Vec<_> = self.metrics.iter().map(Metric::decl).collect();
        wcm_rules::metrics::declarations(&metrics)?;
        Schedule::check(&self.schedules)?;
        Ok(())
    }
}

/// A set of objects the host lists and watches for the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Watch {
    /// The kind watched.
    pub kind: KindRef,
    /// Only this namespace; `None`: all namespaces (or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// A label selector in the API server's syntax, e.g. `"app=web,tier!=db"`.
    pub label_selector: Option<String>,
    /// The plugin reads only metadata: far cheaper for the host (and the API server).
    pub metadata_only: bool,
    /// Which updates wake the plugin.
    pub changes: Changes,
}

/// Which updates of a watched object wake the plugin (creations, deletions and resyncs always do).
/// Skipped updates are counted by the host (`wcm_changes_filtered_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Changes {
    /// Every update.
    #[default]
    All,
    /// Not updates of `status` alone: the plugin's own status writes do not wake it again.
    IgnoreStatus,
    /// Only updates of `metadata.generation` (spec changes), of deletion, and of finalizers.
    Generation,
}

impl Changes {
    /// The name the host reads in the `change-filters` extension.
    pub fn as_str(self) -> &'static str {
        match self {
            Changes::All => "all",
            Changes::IgnoreStatus => "ignore-status",
            Changes::Generation => "generation",
        }
    }

    /// Whether an update of an object from `old` to `new` wakes the plugin, decided exactly as the
    /// host decides it (the same code).
    pub fn wakes(self, old: &Value, new: &Value) -> bool {
        let filter = match self {
            Changes::All => wcm_change_filter::ChangeFilter::All,
            Changes::IgnoreStatus => wcm_change_filter::ChangeFilter::IgnoreStatus,
            Changes::Generation => wcm_change_filter::ChangeFilter::Generation,
        };
        filter.passes(&old.to_string(), &new.to_string())
    }
}

impl Watch {
    /// All objects of a typed kind: `Watch::of::<Pod>()`.
    pub fn of<K: Resource<DynamicType = ()>>() -> Self {
        Self::of_resource(&ApiResource::erase::<K>(&()))
    }

    /// All objects of a kind known at run time.
    pub fn of_resource(resource: &ApiResource) -> Self {
        Self::kind(KindRef::from(resource))
    }

    /// All objects of a kind.
    pub fn kind(kind: KindRef) -> Self {
        Watch {
            kind,
            namespace: None,
            label_selector: None,
            metadata_only: false,
            changes: Changes::All,
        }
    }

    /// Only objects in `namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Only objects whose labels match `selector`.
    pub fn label_selector(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_string());
        self
    }

    /// Only metadata (name, namespace, labels, annotations, owners...): enough when the plugin
    /// does not read `spec` or `status`.
    pub fn metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// Updates of `status` alone do not wake the plugin (its own status writes among them).
    pub fn ignore_status_changes(mut self) -> Self {
        self.changes = Changes::IgnoreStatus;
        self
    }

    /// Only spec changes (`metadata.generation`), deletion and finalizer changes wake the plugin.
    pub fn generation_changes_only(mut self) -> Self {
        self.changes = Changes::Generation;
        self
    }

    fn validate(&self, what: &str) -> Result<(), String> {
        if self.kind.version.is_empty() || self.kind.kind.is_empty() {
            return Err(format!(
                "{what}: the kind needs a version and a kind: {:?}",
                self.kind
            ));
        }
        Ok(())
    }
}

/// How an event on a secondary object becomes a key of the primary kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// The object's controller owner reference, when it points at the primary kind (a Pod → its
    /// ReplicaSet).
    ControllerOwner,
    /// Always this one key: many changes coalesce into one reconcile of an aggregate ("count all
    /// pods"). The request for it usually has no object.
    FixedKey(ObjectKey),
    /// The primary object with the same namespace and name (a Service → its Endpoints).
    SameKey,
    /// Every owner reference that points at the primary kind, not only the controller one (a
    /// ConfigMap owned by two Deployments wakes both). Carried in the `mappings` extension; a
    /// host that predates it maps by the controller owner.
    AnyOwner,
    /// The value of this label names the primary object, in the object's namespace (for a
    /// namespaced primary): `Mapping::Label("app.kubernetes.io/instance".into())`. An object
    /// without the label maps to nothing. Carried in the `mappings` extension.
    Label(String),
}

impl Mapping {
    /// [`Mapping::FixedKey`] of a cluster-scoped name.
    pub fn fixed_key(name: &str) -> Self {
        Mapping::FixedKey(ObjectKey::cluster(name))
    }

    /// [`Mapping::Label`].
    pub fn label(key: &str) -> Self {
        Mapping::Label(key.to_string())
    }
}

/// A secondary watch and its mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secondary {
    /// What is watched.
    pub watch: Watch,
    /// How its objects map to primary keys.
    pub mapping: Mapping,
}

/// An API permission: verbs on a resource of a group, like an RBAC rule.
///
/// Verbs: `get`, `list`, `create`, `update` (replace), `patch` (every patch type, server-side
/// apply included), `delete`, or `*`. The status subresource is a resource of its own:
/// [`Api::patch_status`](crate::Api::patch_status) needs `patch` on `"<plural>/status"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// API group; `""` for core.
    pub group: String,
    /// Plural resource name, with `/subresource` where it applies: `"nodes"`, `"networks/status"`.
    pub resource: String,
    /// The verbs allowed.
    pub verbs: Vec<String>,
}

impl Permission {
    /// `Permission::new("", "nodes", &["get", "patch"])`.
    pub fn new(group: &str, resource: &str, verbs: &[&str]) -> Self {
        Permission {
            group: group.to_string(),
            resource: resource.to_string(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// A permission on a typed kind: `Permission::of::<Node>(&["get", "patch"])`.
    pub fn of<K: Resource<DynamicType = ()>>(verbs: &[&str]) -> Self {
        Self::of_resource(&ApiResource::erase::<K>(&()), verbs)
    }

    /// A permission on a kind known at run time.
    pub fn of_resource(resource: &ApiResource, verbs: &[&str]) -> Self {
        Self::new(&resource.group, &resource.plural, verbs)
    }

    /// The same permission on the status subresource (`"<plural>/status"`).
    pub fn status(mut self) -> Self {
        self.resource = format!("{}/status", self.resource);
        self
    }

    /// Whether it allows `verb` on `resource` of `group` (`*` matches any verb or resource).
    pub fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        self.group == group
            && (self.resource == resource || self.resource == "*")
            && self.verbs.iter().any(|v| v == verb || v == "*")
    }
}

/// `[prefix/]name`: the prefix a DNS subdomain, the name 1–63 letters, digits and `-_.`, starting
/// and ending with a letter or digit (the host checks the same).
fn label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(dns_label));
    prefix_ok
        && !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn with(mappings: Vec<Mapping>) -> Description {
        mappings.into_iter().fold(
            Description::new("p", "1").primary(Watch::of::<ConfigMap>()),
            |d, m| d.secondary(Watch::of::<ConfigMap>(), m),
        )
    }

    #[test]
    fn extended_mappings_travel_in_their_extension() {
        assert_eq!(with(vec![Mapping::SameKey]).mappings_extension(), None);
        let d = with(vec![
            Mapping::SameKey,
            Mapping::AnyOwner,
            Mapping::label("example.com/owner"),
        ]);
        assert_eq!(d.validate(), Ok(()));
        let (key, value) = d.mappings_extension().expect("an extension");
        assert_eq!(key, "mappings");
        assert_eq!(
            serde_json::from_str::<Value>(&value).expect("JSON"),
            serde_json::json!({"secondaries": [null, "any-owner", {"label": "example.com/owner"}]})
        );
    }

    #[test]
    fn a_label_mapping_needs_a_label_key() {
        for bad in ["", "a b", "-a", "Example.com/x", "x/", &"a".repeat(64)] {
            let err = with(vec![Mapping::label(bad)]).validate().expect_err(bad);
            assert!(err.contains("not a label key"), "{bad}: {err}");
        }
        assert_eq!(with(vec![Mapping::label("app")]).validate(), Ok(()));
    }
}
