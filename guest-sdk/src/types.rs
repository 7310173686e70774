//! The plain data types of the contract (`wit/reconciler.wit`), in a form that exists on every
//! target: the wasm build converts them to and from the generated bindings, `MockHost` uses them
//! directly.

use std::fmt;

/// The kind of an API object: group, version and kind. The group is `""` for the core group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindRef {
    /// API group; `""` for the core group (Pods, Nodes, ...).
    pub group: String,
    /// API version within the group, e.g. `"v1"`.
    pub version: String,
    /// Kind, e.g. `"Pod"`.
    pub kind: String,
}

impl KindRef {
    /// A kind from its group, version and kind.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        KindRef {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
        }
    }

    /// The kind of a typed resource: `KindRef::of::<Pod>()`.
    pub fn of<K: kube_core::Resource<DynamicType = ()>>() -> Self {
        KindRef::new(&K::group(&()), &K::version(&()), &K::kind(&()))
    }

    /// Parses an `apiVersion` (`"v1"`, `"apps/v1"`) and a kind.
    pub fn from_api_version(api_version: &str, kind: &str) -> Self {
        let (group, version) = split_api_version(api_version);
        KindRef::new(group, version, kind)
    }

    /// The `apiVersion` of the kind: `"v1"` for core, `"group/version"` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

impl From<&kube_core::ApiResource> for KindRef {
    fn from(resource: &kube_core::ApiResource) -> Self {
        KindRef::new(&resource.group, &resource.version, &resource.kind)
    }
}

impl fmt::Display for KindRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version(), self.kind)
    }
}

/// Splits an `apiVersion` into group and version (`"v1"` → `("", "v1")`).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// A namespace (`None` for cluster-scoped objects) and a name: how the host names one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The namespace; `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key of a cluster-scoped object (a Node, a Namespace, ...).
    pub fn cluster(name: &str) -> Self {
        ObjectKey {
            namespace: None,
            name: name.to_string(),
        }
    }

    /// The key of a namespaced object.
    pub fn namespaced(namespace: &str, name: &str) -> Self {
        ObjectKey {
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        }
    }

    /// A key from an optional namespace and a name (an empty namespace counts as none).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey {
            namespace: namespace.filter(|ns| !ns.is_empty()).map(str::to_string),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// An error from an API call, as the API server (or the host's permission check) gave it.
///
/// The SDK adds one case of its own: `code` 0 with `reason` [`ApiError::SERIALIZATION`] when an
/// object could not be turned into JSON or a response could not be read as the requested type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code: 404, 409, 403, ...; 0 when no answer came (timeout, connection).
    pub code: u16,
    /// Machine-readable reason: `"NotFound"`, `"Conflict"`, `"Forbidden"`, `"Timeout"`, ...
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// The `reason` of an error the SDK raises itself when (de)serializing an object fails.
    pub const SERIALIZATION: &'static str = "SerializationError";
    /// `reason` of a 403 from the host itself: the plugin never declared this call in `describe`
    /// (no request reached the API server; trying again cannot help until a new version declares it).
    pub const NOT_DECLARED: &'static str = "NotDeclared";
    /// `reason` of a 403 from the host itself: the call is declared, but names a namespace where
    /// the plugin does not act (the operator sets them: `namespaces` in its NAME.toml).
    pub const OUT_OF_SCOPE: &'static str = "OutOfScope";

    /// An error with the given code, reason and message.
    pub fn new(code: u16, reason: &str, message: &str) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }

    pub(crate) fn serialization(message: impl fmt::Display) -> Self {
        ApiError {
            code: 0,
            reason: Self::SERIALIZATION.to_string(),
            message: message.to_string(),
        }
    }

    /// 404: the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code == 404
    }

    /// 409 with reason `Conflict`: the object changed since it was read (stale resourceVersion).
    pub fn is_conflict(&self) -> bool {
        self.code == 409 && self.reason != "AlreadyExists"
    }

    /// 409 with reason `AlreadyExists`: a create found an object of that name.
    pub fn is_already_exists(&self) -> bool {
        self.code == 409 && self.reason == "AlreadyExists"
    }

    /// The message of the API server's 422 for a JSON patch that does not apply to the object as
    /// stored (a `test` failed, a path is missing); a real validation error names the field instead.
    pub const PATCH_NOT_APPLIED: &'static str = wcm_rules::applyset::PATCH_NOT_APPLIED;

    /// A JSON patch that did not apply to the object as it is now, as a conflict: the object
    /// changed since it was read, and the next attempt works on fresh state (the same rule as a
    /// stale `resourceVersion`, so one rule holds for every caller).
    pub(crate) fn json_patch_conflict(self) -> Self {
        if wcm_rules::applyset::patch_not_applied(self.code, &self.message) {
            ApiError {
                code: 409,
                reason: "Conflict".into(),
                message: format!(
                    "the JSON patch does not apply to the object as it is now (a test failed or a \
                     path is missing): {}",
                    self.message
                ),
            }
        } else {
            self
        }
    }

    /// 403: refused by the host (permission not declared) or by RBAC.
    pub fn is_forbidden(&self) -> bool {
        self.code == 403
    }

    /// Whether trying again later can help. Terminal: 400 BadRequest, 405 MethodNotAllowed,
    /// 413 RequestEntityTooLarge, 415 UnsupportedMediaType, 422 Invalid (but a JSON patch that
    /// does not apply to the object as it is now comes back as a 409 conflict), a call the plugin never
    /// declared (403 `NotDeclared`) or one outside the namespaces where the plugin acts (403
    /// `OutOfScope`), both refused by the host, and the SDK's serialization errors.
    /// Everything else is retryable: no answer (0), 403 from the API server (a grant can come
    /// later, and a restarted API server refuses for a moment until its RBAC cache has synced),
    /// 404 (the cache may lag behind the API server), 409 conflicts, 410, 429 and 5xx.
    pub fn is_retryable(&self) -> bool {
        if self.reason == Self::SERIALIZATION
            || self.reason == Self::NOT_DECLARED
            || self.reason == Self::OUT_OF_SCOPE
        {
            return false;
        }
        !matches!(self.code, 400 | 405 | 413 | 415 | 422)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The kinds of patch the API server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json` (built-in kinds only).
    Strategic,
    /// Server-side apply, with the plugin's field manager (`wcm:NAME`).
    Apply,
}

/// The type of a Kubernetes event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something an operator may need to look at.
    Warning,
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// The object's kind.
    pub kind: KindRef,
    /// The object's namespace and name.
    pub key: ObjectKey,
    /// The object's UID, when known (makes the event point at this incarnation of the object).
    pub uid: Option<String>,
}

impl ObjectRef {
    /// A reference without a UID.
    pub fn new(kind: KindRef, key: ObjectKey) -> Self {
        ObjectRef {
            kind,
            key,
            uid: None,
        }
    }

    /// The same reference with a UID.
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// A reference to a typed object: kind from its type, namespace, name and UID from its metadata.
    pub fn from_obj<K: kube_core::Resource<DynamicType = ()>>(obj: &K) -> Self {
        Self::from_obj_with(obj, &())
    }

    /// Like [`ObjectRef::from_obj`], for types whose kind is known at run time
    /// ([`DynamicObject`](crate::DynamicObject)).
    pub fn from_obj_with<K: kube_core::Resource>(obj: &K, dt: &K::DynamicType) -> Self {
        let meta = obj.meta();
        ObjectRef {
            kind: KindRef::new(&K::group(dt), &K::version(dt), &K::kind(dt)),
            key: ObjectKey::new(
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or_default(),
            ),
            uid: meta.uid.clone(),
        }
    }
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}
