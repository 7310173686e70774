//! The contract with plugins (`wit/reconciler.wit`, and the earlier versions still served): the
//! generated types that the sandbox, the
//! engine and the cluster side share, and the checks every value from a guest passes before it
//! shapes a request, a path, a metric label or a log line.
//!
//! It sits below every stage and depends on none of them.

mod bindings;
pub mod change_filter;
pub mod declared;
pub mod isolation;
pub mod mapping;
pub mod validate;

pub use bindings::wcm::reconciler::client::{
    DeleteOptions, ListOptions, PatchOptions, PatchType, Propagation,
};
pub use bindings::wcm::reconciler::events::EventType;
pub use bindings::{
    Action, ApiError, Child, Description, KindRef, Mapping, Metric, MetricKind, ObjectKey, Outcome,
    Permission, ReconcileError, Request, Schedule, Secondary, Watch,
};
// Only the sandbox implements and calls the generated interfaces.
pub(crate) use bindings::{Plugin, PluginPre, v0_1, v0_2, wcm};

/// group/version/kind as a comparable key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindKey {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl From<&KindRef> for KindKey {
    fn from(k: &KindRef) -> Self {
        KindKey {
            group: k.group.clone(),
            version: k.version.clone(),
            kind: k.kind.clone(),
        }
    }
}

impl KindKey {
    /// `group/version` as in `apiVersion` ("v1" for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

impl std::fmt::Display for KindKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version(), self.kind)
    }
}

/// A `describe` extension parsed as `T` (its default when the plugin did not declare it), and
/// checked to name at most one entry per secondary watch (`count` gives how many it names).
pub(crate) fn extension<T: serde::de::DeserializeOwned + Default>(
    d: &Description,
    key: &str,
    expected: &str,
    count: impl Fn(&T) -> usize,
) -> Result<T, String> {
    let declared = match d.extensions.iter().find(|(k, _)| k == key) {
        None => T::default(),
        Some((_, v)) => serde_json::from_str::<T>(v)
            .map_err(|e| format!("extension {key}: {e} (expected {expected})"))?,
    };
    if count(&declared) > d.secondaries.len() {
        return Err(format!(
            "extension {key} names {} entries for {} secondaries",
            count(&declared),
            d.secondaries.len()
        ));
    }
    Ok(declared)
}

/// A description of a plugin on Pods with `secondaries` more Pod watches (same-key) and
/// `extension` = `value` when given: what the extensions' tests parse.
#[cfg(test)]
pub(crate) fn test_description(
    extension: &str,
    value: Option<&str>,
    secondaries: usize,
) -> Description {
    let w = Watch {
        kind: KindRef {
            group: "".into(),
            version: "v1".into(),
            kind: "Pod".into(),
        },
        namespace: None,
        label_selector: None,
        metadata_only: false,
    };
    Description {
        name: "p".into(),
        version: "1".into(),
        primary: w.clone(),
        secondaries: (0..secondaries)
            .map(|_| Secondary {
                watch: w.clone(),
                mapping: Mapping::SameKey,
            })
            .collect(),
        resync_seconds: None,
        workers: None,
        permissions: vec![],
        outbound_hosts: vec![],
        config_keys: vec![],
        extensions: value
            .map(|v| vec![(extension.to_string(), v.to_string())])
            .unwrap_or_default(),
        schedules: vec![],
        metrics: vec![],
        propagate_trace_context: false,
    }
}
