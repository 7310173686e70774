//! What a controller writes again and again, done once: owner references as upstream's
//! `metav1.NewControllerRef` makes them and the "is controlled by" check, create-or-update
//! (server-side apply, or read-modify-write), and "write the status only if it changed".
//!
//! ```
//! use wcm_sdk::helpers;
//! use wcm_sdk::k8s_openapi::api::apps::v1::Deployment;
//! use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
//! use wcm_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//!
//! let owner = ConfigMap {
//!     metadata: ObjectMeta { name: Some("foo".into()), uid: Some("u-1".into()), ..Default::default() },
//!     ..Default::default()
//! };
//! let child = Deployment {
//!     metadata: ObjectMeta {
//!         name: Some("foo".into()),
//!         owner_references: helpers::controller_ref(&owner).map(|r| vec![r]),
//!         ..Default::default()
//!     },
//!     ..Default::default()
//! };
//! assert!(helpers::is_controlled_by(&child, &owner));
//! let r = &child.metadata.owner_references.as_ref().unwrap()[0];
//! assert_eq!((r.controller, r.block_owner_deletion), (Some(true), Some(true)));
//! ```

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_core::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::api::{Api, Patch};
use crate::params::PatchParams;
use crate::types::ApiError;

/// The controller owner reference to `owner`, as upstream's `metav1.NewControllerRef` makes it:
/// `controller: true` and `blockOwnerDeletion: true` (a foreground deletion of the owner waits for
/// this child). `None` when `owner` has no name or uid yet (it was never stored).
/// kube-core's `controller_owner_ref` leaves `blockOwnerDeletion` unset.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    let mut r = owner.controller_owner_ref(&())?;
    r.block_owner_deletion = Some(true);
    Some(r)
}

/// The owner reference of `obj` with `controller: true`, if any (there is at most one).
pub fn controller_of<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    obj.meta()
        .owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// Whether `child`'s controller is `owner`: its controller reference names `owner`'s uid
/// (upstream's `metav1.IsControlledBy`). An owner without a uid controls nothing.
pub fn is_controlled_by<C: Resource, O: Resource>(child: &C, owner: &O) -> bool {
    match (controller_of(child), owner.meta().uid.as_deref()) {
        (Some(r), Some(uid)) => r.uid == uid,
        _ => false,
    }
}

/// Creates or updates `obj` in one server-side apply under the plugin's field manager (forced:
/// the plugin's fields win over other managers'). Send only the fields the plugin owns: a field
/// it applied before and leaves out now is removed. `apiVersion` and `kind` are set from `K`.
/// Needs the `patch` permission on the kind.
///
/// An object read back from the cluster or the cache (it has a `resourceVersion` or
/// `managedFields`) is refused with 400: applied whole and forced, it would make the plugin the
/// owner of every field in it (other controllers' finalizers, labels and status), and a later
/// apply without them would remove them. Build the object fresh, with only the plugin's fields.
pub fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, ApiError>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    apply_with(api, obj, &PatchParams::default().force())
}

/// [`apply`] with explicit patch options (a field manager suffix, no force, a dry run).
pub fn apply_with<K>(api: &Api<K>, obj: &K, params: &PatchParams) -> Result<K, ApiError>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or_else(|| ApiError::new(400, "BadRequest", "the object to apply has no name"))?;
    let meta = obj.meta();
    if meta.resource_version.is_some() || meta.managed_fields.is_some() {
        return Err(ApiError::new(
            400,
            "BadRequest",
            &format!(
                "{} {name:?} was read from the cluster (it has a resourceVersion or managedFields): apply only the fields the plugin owns, in an object built for the apply",
                K::kind(&())
            ),
        ));
    }
    let mut body = serde_json::to_value(obj).map_err(ApiError::serialization)?;
    if let Value::Object(m) = &mut body {
        m.insert(
            "apiVersion".into(),
            Value::String(K::api_version(&()).into()),
        );
        m.insert("kind".into(), Value::String(K::kind(&()).into()));
        // What only the server writes is not the plugin's to apply.
        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
            for f in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
                "generation",
            ] {
                meta.remove(f);
            }
        }
    }
    api.patch_with(&name, params, &Patch::Apply(body))
}

/// Create-or-update by read-modify-write (controller-runtime's `CreateOrUpdate`): reads `name`,
/// or starts from `K::default()` with that name (and the `Api`'s namespace); lets `mutate` change
/// it; then creates it, replaces it when `mutate` changed it, or does nothing. Returns the object
/// and what was done. A replace races with other writers (409 conflict, retryable); prefer
/// [`apply`] when the plugin owns a set of fields.
///
/// The replace sends the object as `K` read it: a field `K` does not know (a newer field of a
/// built-in kind than the SDK's k8s-openapi has, a custom resource field missing from the struct)
/// is not sent and so is cleared. Use it for kinds whose every field `K` holds.
pub fn create_or_update<K>(
    api: &Api<K>,
    name: &str,
    mutate: impl FnOnce(&mut K),
) -> Result<(K, Outcome), ApiError>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Default + Clone,
{
    match api.get_opt(name)? {
        None => {
            let mut obj = K::default();
            obj.meta_mut().name = Some(name.to_string());
            obj.meta_mut().namespace = api.namespace().map(str::to_string);
            mutate(&mut obj);
            Ok((api.create(&obj)?, Outcome::Created))
        }
        Some(current) => {
            let mut obj = current.clone();
            mutate(&mut obj);
            let before = serde_json::to_value(&current).map_err(ApiError::serialization)?;
            let after = serde_json::to_value(&obj).map_err(ApiError::serialization)?;
            if before == after {
                return Ok((current, Outcome::Unchanged));
            }
            Ok((api.replace(name, &obj)?, Outcome::Updated))
        }
    }
}

/// What [`create_or_update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The object did not exist and was created.
    Created,
    /// The object existed and was replaced with the mutated one.
    Updated,
    /// `mutate` changed nothing: no write.
    Unchanged,
}

/// Writes `status` to `obj`'s status subresource only when it differs from what `obj` has, as a
/// merge patch that also clears what the new status leaves out (`null` for each removed field).
/// Returns whether it wrote. Needs the `patch` permission on `"<plural>/status"`.
///
/// As controller-runtime's `Status().Patch(MergeFrom(obj))`, the patch carries no
/// `resourceVersion`: a plugin's own last status write, not yet back in its cache, does not make
/// every next write a 409 and a retry. What `obj` (a read a moment behind) did not hold is left as
/// it is; only fields `obj` held and `status` leaves out are cleared. Build `status` from `obj`'s
/// status, and keep fields other writers own out of it. A plugin that must not overwrite a
/// concurrent writer's status sends its own merge patch with `metadata.resourceVersion`.
pub fn write_status_if_changed<K, S>(api: &Api<K>, obj: &K, status: &S) -> Result<bool, ApiError>
where
    K: Resource + Serialize + DeserializeOwned,
    S: Serialize,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or_else(|| ApiError::new(400, "BadRequest", "the object has no name"))?;
    let old = serde_json::to_value(obj)
        .map_err(ApiError::serialization)?
        .get("status")
        .cloned()
        .unwrap_or(Value::Null);
    let new = serde_json::to_value(status).map_err(ApiError::serialization)?;
    if old == new {
        return Ok(false);
    }
    let mut patch = Map::new();
    patch.insert("status".into(), merge_diff(&old, &new));
    api.patch_status(&name, &Patch::Merge(Value::Object(patch)))?;
    Ok(true)
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`.
pub fn merge_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) if ov == v => {}
                    Some(ov) => {
                        out.insert(k.clone(), merge_diff(ov, v));
                    }
                    None => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}
