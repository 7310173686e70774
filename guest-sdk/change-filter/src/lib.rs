//! Which updates of a watched object wake a plugin: the change filters the host applies, shared
//! with the SDK's `MockHost` so a plugin's unit test sees exactly what the host will do.
//!
//! - `ignore-status`: an update that changes nothing but `status` (and the bookkeeping fields
//!   `resourceVersion`, `generation`, `managedFields`) is skipped: the plugin's own status writes
//!   do not wake it again (Metacontroller's `ignoreStatusChanges`).
//! - `generation`: an update is skipped unless `metadata.generation` changed, or the object's
//!   deletion began, its finalizers or owner references changed, or it is another object of the same
//!   name (another `uid`, seen as an update after a relist). Like controller-runtime's
//!   `GenerationChangedPredicate`, made safe for finalizers and owner mappings. For kinds without
//!   `generation`, it acts as `ignore-status`.
//!
//! Creations, deletions and resyncs always pass; only updates are filtered.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeFilter {
    /// Every change wakes the plugin.
    #[default]
    All,
    IgnoreStatus,
    Generation,
}

impl ChangeFilter {
    /// Whether an update from `old` to `new` (object JSON) wakes the plugin.
    pub fn passes(self, old: &str, new: &str) -> bool {
        match self {
            ChangeFilter::All => true,
            ChangeFilter::IgnoreStatus => differs_beyond_status(old, new),
            ChangeFilter::Generation => {
                let (Ok(o), Ok(n)) = (
                    serde_json::from_str::<Value>(old),
                    serde_json::from_str::<Value>(new),
                ) else {
                    return true;
                };
                let meta = |v: &Value, f: &str| v.pointer(&format!("/metadata/{f}")).cloned();
                if meta(&n, "generation").is_none() {
                    return differs_beyond_status(old, new);
                }
                [
                    "generation",
                    "deletionTimestamp",
                    "finalizers",
                    "ownerReferences",
                    "uid",
                ]
                .iter()
                .any(|f| meta(&o, f) != meta(&n, f))
            }
        }
    }
}

fn differs_beyond_status(old: &str, new: &str) -> bool {
    let strip = |s: &str| -> Option<Value> {
        let mut v: Value = serde_json::from_str(s).ok()?;
        let obj = v.as_object_mut()?;
        obj.remove("status");
        if let Some(Value::Object(m)) = obj.get_mut("metadata") {
            for f in ["resourceVersion", "generation", "managedFields"] {
                m.remove(f);
            }
        }
        Some(v)
    };
    match (strip(old), strip(new)) {
        (Some(o), Some(n)) => o != n,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(gen_: i64, rv: &str, spec: &str, status: &str, extra: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"n","resourceVersion":"{rv}","generation":{gen_}{extra}}},"spec":{{"cidr":"{spec}"}},"status":{{"phase":"{status}"}}}}"#
        )
    }

    #[test]
    fn status_only_updates_are_filtered() {
        let a = obj(1, "1", "10.0.0.0/24", "Pending", "");
        let status = obj(1, "2", "10.0.0.0/24", "Ready", "");
        let spec = obj(2, "3", "10.1.0.0/24", "Ready", "");
        let label = obj(1, "4", "10.0.0.0/24", "Pending", r#","labels":{"a":"b"}"#);
        let deleting = obj(
            1,
            "5",
            "10.0.0.0/24",
            "Pending",
            r#","deletionTimestamp":"t""#,
        );
        for f in [ChangeFilter::IgnoreStatus, ChangeFilter::Generation] {
            assert!(!f.passes(&a, &status), "{f:?}: status only");
            assert!(f.passes(&a, &spec), "{f:?}: spec");
            assert!(f.passes(&a, &deleting), "{f:?}: deletion began");
        }
        assert!(ChangeFilter::IgnoreStatus.passes(&a, &label));
        assert!(!ChangeFilter::Generation.passes(&a, &label));
        assert!(ChangeFilter::All.passes(&a, &status));
        assert!(ChangeFilter::IgnoreStatus.passes("not json", &a));
    }
}
