//! The contract with plugins (`wit/reconciler.wit`): the generated types that the sandbox, the
//! engine and the cluster side share, and the checks every value from a guest passes before it
//! shapes a request, a path, a metric label or a log line.
//!
//! It sits below every stage and depends on none of them.

mod bindings;
pub mod change_filter;
pub mod validate;

pub use bindings::wcm::reconciler::client::PatchType;
pub use bindings::wcm::reconciler::events::EventType;
pub use bindings::{
    Action, ApiError, Description, KindRef, Mapping, ObjectKey, Permission, ReconcileError,
    Request, Secondary, Watch,
};
// Only the sandbox implements and calls the generated interfaces.
pub(crate) use bindings::{Plugin, PluginPre, wcm};

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
