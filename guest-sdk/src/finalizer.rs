//! Finalizers: cleanup that must run before an object goes away.

use serde_json::{Value, json};

use crate::api::{Api, Patch};
use crate::reconcile::{Action, Error};
use crate::types::ApiError;
use kube_core::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What [`finalizer`] asks the reconcile function to do.
#[derive(Debug, Clone, PartialEq)]
pub enum FinalizerEvent<K> {
    /// The object lives (and carries the finalizer): make the world match it.
    Apply(K),
    /// The object is being deleted: release what it holds. On success the finalizer is removed
    /// and the API server deletes the object; on error it stays and cleanup is retried.
    Cleanup(K),
}

/// Runs `reconcile` under a finalizer named `name` (a qualified name such as
/// `"example.com/cleanup"`), like kube-rs's `finalizer`:
///
/// - object alive without the finalizer: adds it (JSON patch on `metadata.finalizers`, guarded by
///   a `test` of the current list), then calls `reconcile(Apply(patched object))` right away;
/// - object alive with the finalizer: `reconcile(Apply(obj))`;
/// - object being deleted (`deletionTimestamp` set) with the finalizer: `reconcile(Cleanup(obj))`,
///   then removes the finalizer (JSON patch: `test` + `remove` at its index);
/// - object being deleted without the finalizer: nothing to do, [`Action::done`].
///
/// A JSON patch whose `test` fails (the list changed since the object was read) is a conflict,
/// retryable as for any [`Api::patch`], so the next attempt works on fresh state.
///
/// The plugin must declare `patch` on the object's resource. `api` may be cluster-wide: namespaced
/// objects are patched in their own namespace.
pub fn finalizer<K, F>(api: &Api<K>, name: &str, obj: K, reconcile: F) -> Result<Action, Error>
where
    K: Resource + Serialize + DeserializeOwned,
    F: FnOnce(FinalizerEvent<K>) -> Result<Action, Error>,
{
    let meta = obj.meta();
    let Some(obj_name) = meta.name.clone() else {
        return Err(Error::terminal(format!(
            "finalizer {name}: the object has no name"
        )));
    };
    let api = match (api.namespace(), meta.namespace.as_deref()) {
        (None, Some(ns)) => api.in_namespace(Some(ns)),
        _ => api.clone(),
    };
    let current: Option<&Vec<String>> = meta.finalizers.as_ref();
    let position = current.and_then(|list| list.iter().position(|f| f == name));
    let deleting = meta.deletion_timestamp.is_some();

    match (deleting, position) {
        (false, Some(_)) => reconcile(FinalizerEvent::Apply(obj)),
        (false, None) => {
            let patch = match current {
                None => json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": Value::Null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [name]},
                ]),
                Some(list) => json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": list},
                    {"op": "add", "path": "/metadata/finalizers/-", "value": name},
                ]),
            };
            let patched = api
                .patch(&obj_name, &Patch::Json(patch))
                .map_err(|e| patch_error(e, name, "adding"))?;
            reconcile(FinalizerEvent::Apply(patched))
        }
        (true, Some(index)) => {
            let action = reconcile(FinalizerEvent::Cleanup(obj))?;
            let path = format!("/metadata/finalizers/{index}");
            let patch = json!([
                {"op": "test", "path": path, "value": name},
                {"op": "remove", "path": path},
            ]);
            match api.patch(&obj_name, &Patch::Json(patch)) {
                Ok(_) => Ok(action),
                // Gone already: nothing left to release.
                Err(e) if e.is_not_found() => Ok(action),
                Err(e) => Err(patch_error(e, name, "removing")),
            }
        }
        (true, None) => Ok(Action::done()),
    }
}

fn patch_error(e: ApiError, name: &str, what: &str) -> Error {
    // A failed `test` already came back as a retryable conflict (`Api::patch`): one rule.
    Error::from(e).context(format!("{what} finalizer {name}"))
}
