//! Typed API calls, in the manner of kube-rs's `Api<K>`.

use std::marker::PhantomData;
use std::rc::Rc;

use kube_core::{ApiResource, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::host::Host;
use crate::params::{DeleteParams, ListParams, PatchParams};
use crate::resource::{decode, decode_value, encode};
use crate::types::{ApiError, KindRef, ObjectKey, PatchType};

/// A patch and its type, as in kube-rs. The payload is anything that serializes to the patch's
/// JSON: a `serde_json::json!` value, a typed object, a struct of your own.
///
/// ```
/// use wcm_sdk::Patch;
/// use serde_json::json;
/// let merge = Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}}));
/// let json = Patch::Json(json!([{"op": "remove", "path": "/metadata/labels/tier"}]));
/// # let _ = (merge, json);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Patch<T: Serialize> {
    /// JSON merge patch (RFC 7386): objects merge, `null` deletes a field, arrays are replaced.
    Merge(T),
    /// JSON patch (RFC 6902): a list of operations (`add`, `remove`, `replace`, `test`, ...).
    Json(T),
    /// Strategic merge patch: like a merge patch, but lists merge by key (built-in kinds only).
    Strategic(T),
    /// Server-side apply of a partial object; the host applies it with the plugin's name as field
    /// manager. The payload should carry `apiVersion` and `kind`.
    Apply(T),
}

impl<T: Serialize> Patch<T> {
    /// The patch type.
    pub fn patch_type(&self) -> PatchType {
        match self {
            Patch::Merge(_) => PatchType::Merge,
            Patch::Json(_) => PatchType::Json,
            Patch::Strategic(_) => PatchType::Strategic,
            Patch::Apply(_) => PatchType::Apply,
        }
    }

    /// The payload.
    pub fn body(&self) -> &T {
        match self {
            Patch::Merge(b) | Patch::Json(b) | Patch::Strategic(b) | Patch::Apply(b) => b,
        }
    }
}

/// One page of a LIST: its objects, and the token of the next page (`None`: this was the last).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectList<K> {
    /// The objects.
    pub items: Vec<K>,
    /// [`ListParams::continue_token`] for the next page.
    pub continue_token: Option<String>,
}

/// API calls for one kind, in one namespace or cluster-wide. Made by
/// [`Context::api`](crate::Context::api) and its siblings.
///
/// Every call goes to the API server through the host, which first checks it against the
/// permissions the plugin declared (403 `NotDeclared` otherwise). For reads that the informer cache
/// can answer, prefer [`Context::cache`](crate::Context::cache): it costs no API request.
pub struct Api<K> {
    host: Rc<dyn Host>,
    resource: ApiResource,
    kind: KindRef,
    namespace: Option<String>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api {
            host: self.host.clone(),
            resource: self.resource.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K: Resource + Serialize + DeserializeOwned> Api<K> {
    pub(crate) fn new(host: Rc<dyn Host>, resource: ApiResource, namespace: Option<&str>) -> Self {
        let kind = KindRef::from(&resource);
        Api {
            host,
            resource,
            kind,
            namespace: namespace.filter(|ns| !ns.is_empty()).map(str::to_string),
            _kind: PhantomData,
        }
    }

    pub(crate) fn in_namespace(&self, namespace: Option<&str>) -> Self {
        Api::new(self.host.clone(), self.resource.clone(), namespace)
    }

    /// The namespace this `Api` works in (`None`: cluster-scoped kind, or all namespaces).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The kind this `Api` works on.
    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }

    fn key(&self, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone(),
            name: name.to_string(),
        }
    }

    fn read(&self, json: &str) -> Result<K, ApiError> {
        decode(json, &self.resource).map_err(|e| {
            ApiError::serialization(format_args!("reading a {}: {e}", self.resource.kind))
        })
    }

    /// GET one object by name.
    pub fn get(&self, name: &str) -> Result<K, ApiError> {
        let json = self.host.get(&self.kind, &self.key(name))?;
        self.read(&json)
    }

    /// GET one object by name; `None` when it does not exist (404).
    pub fn get_opt(&self, name: &str) -> Result<Option<K>, ApiError> {
        match self.get(name) {
            Ok(obj) => Ok(Some(obj)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST the objects (of the namespace, or of all namespaces), filtered by a label selector
    /// such as `"app=web,tier!=db"`.
    pub fn list(&self, label_selector: Option<&str>) -> Result<Vec<K>, ApiError> {
        let params = ListParams {
            label_selector: label_selector.map(str::to_string),
            ..ListParams::default()
        };
        Ok(self.list_with(&params)?.items)
    }

    /// LIST with label and field selectors, one page at a time: follow
    /// [`ObjectList::continue_token`] with [`ListParams::continue_token`] until it is `None`.
    pub fn list_with(&self, params: &ListParams) -> Result<ObjectList<K>, ApiError> {
        let json = self
            .host
            .list(&self.kind, self.namespace.as_deref(), params)?;
        let mut list: Value = serde_json::from_str(&json).map_err(|e| {
            ApiError::serialization(format_args!("reading a {} list: {e}", self.resource.kind))
        })?;
        let continue_token = list
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        if let Value::Object(map) = &mut list {
            map.remove("metadata");
        }
        let items = match list {
            Value::Object(mut map) => match map.remove("items") {
                Some(Value::Array(items)) => items,
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(ApiError::serialization(format_args!(
                        "a {} list whose items are not an array",
                        self.resource.kind
                    )));
                }
            },
            _ => {
                return Err(ApiError::serialization(format_args!(
                    "a {} list that is not an object",
                    self.resource.kind
                )));
            }
        };
        let items = items
            .into_iter()
            .map(|item| {
                decode_value(item, &self.resource).map_err(|e| {
                    ApiError::serialization(format_args!("reading a {}: {e}", self.resource.kind))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ObjectList {
            items,
            continue_token,
        })
    }

    /// POST a new object; the object as stored. The namespace is the `Api`'s, else the object's.
    pub fn create(&self, obj: &K) -> Result<K, ApiError> {
        let body = encode(obj, &self.resource).map_err(ApiError::serialization)?;
        let namespace = self
            .namespace
            .as_deref()
            .or(obj.meta().namespace.as_deref());
        let json = self.host.create(&self.kind, namespace, &body)?;
        self.read(&json)
    }

    /// PUT an object over the stored one. Keep the `resourceVersion` you read: the API server
    /// answers 409 `Conflict` when the object changed since.
    pub fn replace(&self, name: &str, obj: &K) -> Result<K, ApiError> {
        let body = encode(obj, &self.resource).map_err(ApiError::serialization)?;
        let json = self.host.replace(&self.kind, &self.key(name), &body)?;
        self.read(&json)
    }

    /// PATCH an object; the patched object. Send only the fields you own (a merge patch of one
    /// label, not the whole object): it cannot overwrite concurrent changes to other fields. A
    /// JSON patch that does not apply to the object as it is now (a `test` failed) is a 409
    /// conflict, retryable like a stale `resourceVersion`.
    /// A server-side apply ([`Patch::Apply`]) through this method is forced (it takes over fields
    /// other managers own); [`Api::patch_with`] chooses.
    pub fn patch<P: Serialize>(&self, name: &str, patch: &Patch<P>) -> Result<K, ApiError> {
        self.patch_with(name, &Self::default_params(patch), patch)
    }

    /// PATCH with a field manager of the plugin's own, force (server-side apply) or a dry run.
    pub fn patch_with<P: Serialize>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, ApiError> {
        self.send_patch(name, params, patch, false)
    }

    fn default_params<P: Serialize>(patch: &Patch<P>) -> PatchParams {
        PatchParams {
            force: matches!(patch, Patch::Apply(_)),
            ..PatchParams::default()
        }
    }

    /// PATCH the status subresource; needs a permission on `"<plural>/status"`.
    pub fn patch_status<P: Serialize>(&self, name: &str, patch: &Patch<P>) -> Result<K, ApiError> {
        self.patch_status_with(name, &Self::default_params(patch), patch)
    }

    /// [`Api::patch_status`] with [`PatchParams`].
    pub fn patch_status_with<P: Serialize>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, ApiError> {
        self.send_patch(name, params, patch, true)
    }

    fn send_patch<P: Serialize>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
        status: bool,
    ) -> Result<K, ApiError> {
        let body = serde_json::to_string(patch.body()).map_err(ApiError::serialization)?;
        let (key, patch_type) = (self.key(name), patch.patch_type());
        let sent = if status {
            self.host
                .patch_status(&self.kind, &key, patch_type, &body, params)
        } else {
            self.host.patch(&self.kind, &key, patch_type, &body, params)
        };
        let json = sent.map_err(|e| Self::patch_error(patch_type, e))?;
        self.read(&json)
    }

    /// A JSON patch whose `test` failed is a conflict (retryable), as a stale resourceVersion is.
    fn patch_error(patch_type: PatchType, e: ApiError) -> ApiError {
        if patch_type == PatchType::Json {
            e.json_patch_conflict()
        } else {
            e
        }
    }

    /// DELETE an object. With finalizers on it, the API server only marks it for deletion.
    pub fn delete(&self, name: &str) -> Result<(), ApiError> {
        self.delete_with(name, &DeleteParams::default())
    }

    /// DELETE with a propagation policy, preconditions or a dry run.
    pub fn delete_with(&self, name: &str, params: &DeleteParams) -> Result<(), ApiError> {
        self.host.delete(&self.kind, &self.key(name), params)
    }
}
