//! The children a reconcile wants for its primary (contract 0.3).
//!
//! Return the **whole** set with [`Action::with_children`](crate::Action::with_children): the
//! host applies each child with server-side apply under the plugin's field manager (`wcm:NAME`),
//! makes the primary its controller owner (`blockOwnerDeletion` set), labels it as a member of
//! the primary's ApplySet (KEP-3659, so `kubectl` can see the set), and deletes the children it
//! applied earlier for this primary that are no longer in the set. It never deletes an object it
//! did not apply for this primary, even one with the same labels.
//!
//! Each child is an API call of the plugin's own: declare `create` (a server-side apply that
//! makes an object needs it), `patch`, `list` and `delete` on the child's resource and `patch` on
//! the primary's ([`Description::owns`] declares them and the
//! watch that wakes the primary when a child changes). A child that fails (a conflict, a kind
//! not declared, an invalid object) fails the reconcile with an error naming it, retried with
//! the key's backoff (not retried when no failure can mend by retrying), and a Warning event
//! `ChildFailed` on the primary. [`MockHost`](crate::testing::MockHost) applies and prunes the
//! same way.
//!
//! [`Description::owns`]: crate::Description::owns
//!
//! ```
//! use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
//! use wcm_sdk::{Action, Children};
//!
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! let action = Action::done().with_children(Children::new().add(&cm).expect("serializable"));
//! assert_eq!(action.children().map(|c| c.len()), Some(1));
//! ```

use kube_core::Resource;
use serde::Serialize;
use serde_json::Value;

use crate::reconcile::Error;
use crate::types::KindRef;

/// Children one reconcile may return (the host's bound).
pub const MAX_CHILDREN: usize = wcm_rules::applyset::MAX_CHILDREN;

/// One child: its kind and the object wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// The child's kind (its `apiVersion` and `kind`).
    pub kind: KindRef,
    /// The object as JSON, with `apiVersion`, `kind` and `metadata.name`.
    pub object: String,
    /// Take over fields another field manager owns (the default); `false`: a conflict is
    /// reported for this child instead.
    pub force: bool,
}

/// The full set of children wanted for a primary.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Children {
    items: Vec<Child>,
}

impl Children {
    /// No children: returned as it is, it deletes every child applied earlier.
    pub fn new() -> Self {
        Children::default()
    }

    /// Adds a typed object (its `apiVersion` and `kind` are set from its type).
    // Not `Add`: adding a child can fail (an object that does not serialize).
    #[allow(clippy::should_implement_trait)]
    pub fn add<K: Resource<DynamicType = ()> + Serialize>(self, object: &K) -> Result<Self, Error> {
        let kind = KindRef::of::<K>();
        let value = serde_json::to_value(object)
            .map_err(|e| Error::terminal(format!("serializing a {} child: {e}", kind.kind)))?;
        self.add_value(kind, value)
    }

    /// Adds an object of `kind` given as JSON (its `apiVersion` and `kind` are set from `kind`).
    pub fn add_value(mut self, kind: KindRef, mut object: Value) -> Result<Self, Error> {
        let Some(map) = object.as_object_mut() else {
            return Err(Error::terminal(format!(
                "a {} child must be a JSON object",
                kind.kind
            )));
        };
        map.insert("apiVersion".into(), Value::String(kind.api_version()));
        map.insert("kind".into(), Value::String(kind.kind.clone()));
        // Read-only and server-set fields are not the plugin's to apply.
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            for f in [
                "uid",
                "resourceVersion",
                "managedFields",
                "creationTimestamp",
                "generation",
            ] {
                meta.remove(f);
            }
        }
        if self.items.len() >= MAX_CHILDREN {
            return Err(Error::terminal(format!(
                "more than {MAX_CHILDREN} children (the host's bound)"
            )));
        }
        self.items.push(Child {
            kind,
            object: object.to_string(),
            force: true,
        });
        Ok(self)
    }

    /// The last child added does not force conflicts: another manager's fields stay its own and
    /// the child fails with 409 Conflict when it wants to change them.
    pub fn without_force(mut self) -> Self {
        if let Some(last) = self.items.last_mut() {
            last.force = false;
        }
        self
    }

    /// How many children.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// No children (returned as they are, every child applied earlier is deleted).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The children, in the order added.
    pub fn iter(&self) -> impl Iterator<Item = &Child> {
        self.items.iter()
    }

    pub(crate) fn into_vec(self) -> Vec<Child> {
        self.items
    }
}
