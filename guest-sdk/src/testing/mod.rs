//! An in-memory host for unit tests on the native target: `cargo test`, no cluster, no wasm.
//!
//! [`MockHost`] holds two stores, as the real world has two: the informer **cache** (what
//! [`Cache`](crate::Cache) reads and what a request's object comes from) and the **API server**
//! (what [`Api`](crate::Api) calls read and write). [`MockHost::seed`] puts an object in both;
//! API writes change only the API store, as they would until the watch catches up —
//! [`MockHost::sync_cache`] plays that catch-up.
//!
//! What it checks like the real host, once it knows the plugin ([`MockHost::for_reconciler`]):
//! every API call against the declared permissions (403 `NotDeclared`) and against the namespaces
//! where it acts (403 `OutOfScope`; [`MockHost::acting_in`]), cache reads against the
//! declared watches (not watched: an error from `keys`/`list`, `None` from `get`; objects outside
//! a watch's namespace or label selector are invisible; metadata-only watches hand out
//! `PartialObjectMetadata`, as the API server sends it).
//!
//! How the API store behaves: `get` of an absent object is 404 `NotFound`; `create` of an existing
//! name is 409 `AlreadyExists` (and sets `uid`, `resourceVersion`, `creationTimestamp`); a
//! `replace` or a patch carrying a stale `resourceVersion` is 409 `Conflict`; merge patches are
//! applied exactly (RFC 7386), JSON patches exactly (RFC 6902; one that does not apply is the API server's
//! 422 `Invalid`, which [`Api::patch`](crate::Api::patch) turns into a 409 conflict).
//! Like the API server, every kind has a status subresource: a `create` drops `status`, a write of
//! the main resource (`replace`, `patch`) keeps the stored `status` whatever it sent, and
//! `patch_status` changes only `status`. `metadata.generation` starts at 1 and goes up when a
//! write changes anything outside `metadata` and `status` (for objects with a `spec`: the mock
//! knows no schemas).
//! A `list` applies label and field selectors (`a.b=c`, `==`, `!=` on any field) and pages
//! (`limit`, `continue`); a dry run (patch, delete) is answered and not stored; a delete checks its
//! UID and resourceVersion preconditions (409).
//! A strategic merge patch merges the lists of the built-in kinds by their merge keys
//! (containers, env, volumes, ports, conditions, owner references, ...; `finalizers` as a set;
//! `$patch: delete`, `$deleteFromPrimitiveList`, `$setElementOrder`; the patch's items first, as
//! there), and is refused (415) for a custom resource; `$retainKeys` and `$patch: replace` are
//! refused (400) rather than applied differently.
//! Approximations: merge keys are known by field name, not from the schema; server-side apply is a merge patch that creates the object when it is absent
//! (no field ownership, no conflicts); `delete` of an object with finalizers sets
//! `deletionTimestamp`, and the object goes when a write leaves it with no finalizers.
//!
//! [`MockHost::run_controller`] runs the host's controller loop over the two stores: changes wake
//! keys through the watch filters and mappings, retries, requeues and the terminal-error event.
//!
//! Outbound HTTP goes to the handler given to [`MockHost::on_http`] (none: every request fails
//! with a connection error), after the same check as the host's: a plugin described with
//! [`MockHost::for_reconciler`] reaches only the hosts it declares (else `Denied`). Every request
//! is kept for [`MockHost::http_requests`].

mod children;
mod cluster;
mod controller;
mod patch;
mod selector;
mod validation;

pub use cluster::ClusterOps;
pub use controller::{ControllerRun, ControllerStep, MAX_MOCK_RETRIES};

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::context::Context;
use crate::describe::{Description, Watch};
use crate::host::Host;
use crate::http::{HttpError, HttpErrorKind, HttpRequest, HttpResponse, split_url};
use crate::reconcile::{Action, Error, Reconciler, Request};
use kube_core::{ApiResource, Resource};
use serde::de::DeserializeOwned;

use crate::params::{DeleteParams, ListParams, PatchParams};
use crate::resource::{decode, plural_of};
use crate::types::{ApiError, EventType, KindRef, Level, ObjectKey, ObjectRef, PatchType};
use selector::Selector;

thread_local! {
    /// What [`MockHost::set_config`] set last on this thread, for [`crate::describe_config`].
    static DESCRIBE_CONFIG: RefCell<BTreeMap<String, String>> = const { RefCell::new(BTreeMap::new()) };
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn describe_config(key: &str) -> Option<String> {
    DESCRIBE_CONFIG.with(|c| c.borrow().get(key).cloned())
}

/// The timestamp the mock writes into `creationTimestamp` and `deletionTimestamp`.
pub const MOCK_TIME: &str = "2026-01-01T00:00:00Z";

/// The API verbs, as recorded in [`ApiCall`] and matched by [`MockHost::fail_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `client.get`
    Get,
    /// `client.list`
    List,
    /// `client.create`
    Create,
    /// `client.replace` (RBAC verb `update`)
    Replace,
    /// `client.patch`
    Patch,
    /// `client.patch-status` (RBAC verb `patch` on `<plural>/status`)
    PatchStatus,
    /// `client.delete`
    Delete,
}

impl Verb {
    /// The RBAC verb the permission check uses.
    pub fn rbac(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Replace => "update",
            Verb::Patch | Verb::PatchStatus => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// One API call the plugin made, with its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    /// What was called.
    pub verb: Verb,
    /// The kind it was called on.
    pub kind: KindRef,
    /// The namespace argument (or the key's namespace).
    pub namespace: Option<String>,
    /// The object's name (`None` for `list` and `create`).
    pub name: Option<String>,
    /// The label selector of a `list`.
    pub label_selector: Option<String>,
    /// The field selector of a `list`.
    pub field_selector: Option<String>,
    /// A dry run (patch, delete): answered, nothing stored.
    pub dry_run: bool,
    /// The patch type of a patch.
    pub patch_type: Option<PatchType>,
    /// The body sent (`create`, `replace`, patches), parsed (a string when it was not JSON).
    pub body: Option<Value>,
    /// The error the call returned, if it failed.
    pub error: Option<ApiError>,
}

/// One patch (or status patch) the plugin sent.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedPatch {
    /// The patched kind.
    pub kind: KindRef,
    /// The patched object.
    pub key: ObjectKey,
    /// The patch type.
    pub patch_type: PatchType,
    /// The patch body, parsed (a string when it was not JSON).
    pub body: Value,
    /// Whether it went to the status subresource.
    pub status: bool,
    /// The error it returned, if it failed.
    pub error: Option<ApiError>,
}

/// One event the plugin recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// The object it is about.
    pub regarding: ObjectRef,
    /// Normal or Warning.
    pub event_type: EventType,
    /// The reason (`"SuccessCalculatePod"`).
    pub reason: String,
    /// The action (`"Count"`).
    pub action: String,
    /// The note (`"pod count is 3"`).
    pub note: String,
}

/// One log line the plugin wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Its message.
    pub message: String,
    /// Its `key=value` fields.
    pub fields: Vec<(String, String)>,
}

impl LogLine {
    /// The value of field `key`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type GroupKind = (String, String);
type HttpHandler = Rc<RefCell<dyn FnMut(&HttpRequest) -> Result<HttpResponse, HttpError>>>;
type Store = BTreeMap<GroupKind, BTreeMap<ObjectKey, Value>>;

#[derive(Default)]
struct State {
    declared: Option<Description>,
    /// Where the plugin acts, as `namespaces` in its NAME.toml (`acting_in`); None: the host's
    /// default.
    acting_in: Option<Vec<String>>,
    /// Custom kinds that live outside namespaces (`with_cluster_scope`).
    cluster_scoped: std::collections::BTreeSet<GroupKind>,
    /// Values that replace the plugin's own in the context of every run (`inject`).
    injected: Vec<Rc<dyn std::any::Any>>,
    plurals: BTreeMap<GroupKind, String>,
    cache: Store,
    api: Store,
    config: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
    calls: Vec<ApiCall>,
    events: Vec<RecordedEvent>,
    logs: Vec<LogLine>,
    failures: Vec<(Verb, ApiError)>,
    http_handler: Option<HttpHandler>,
    http_requests: Vec<HttpRequest>,
    revision: u64,
    uids: u64,
    /// The plugin's metrics (declared ones), as the host keeps them.
    metrics: Option<wcm_rules::metrics::Series>,
    max_metric_series: Option<usize>,
}

/// An in-memory [`Host`] for unit tests; see the [module docs](self) for what it models.
///
/// Cloning gives another handle on the same state, so a test keeps one to seed and inspect while
/// the [`Context`] it hands to the reconcile holds another.
///
/// ```
/// use wcm_sdk::testing::MockHost;
/// use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
/// use wcm_sdk::{ObjectKey, Patch};
/// use serde_json::json;
///
/// let host = MockHost::new();
/// host.seed(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}));
///
/// let ctx = host.context();
/// let api = ctx.api_namespaced::<ConfigMap>("ns");
/// api.patch("c", &Patch::Merge(json!({"data": {"k": "v"}}))).expect("patched");
/// assert!(api.get("missing").is_err_and(|e| e.is_not_found()));
///
/// let stored: ConfigMap = host.object(Some("ns"), "c").expect("exists");
/// assert_eq!(stored.data.unwrap_or_default()["k"], "v");
/// assert_eq!(host.patches().len(), 1);
/// ```
#[derive(Clone, Default)]
pub struct MockHost {
    state: Rc<RefCell<State>>,
}

impl std::fmt::Debug for MockHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHost").finish_non_exhaustive()
    }
}

/// The namespace the host protects by default (`--plugin-identity-namespace`).
const PROTECTED_NAMESPACE: &str = "wcm-system";

/// Built-in kinds that live outside namespaces (a watch of one covers no namespace).
fn cluster_scoped(kind: &KindRef) -> bool {
    matches!(
        (kind.group.as_str(), kind.kind.as_str()),
        (
            "",
            "Node" | "Namespace" | "PersistentVolume" | "ComponentStatus"
        ) | (
            "rbac.authorization.k8s.io",
            "ClusterRole" | "ClusterRoleBinding"
        ) | ("apiextensions.k8s.io", "CustomResourceDefinition")
            | (
                "storage.k8s.io",
                "StorageClass" | "CSIDriver" | "CSINode" | "VolumeAttachment"
            )
            | ("scheduling.k8s.io", "PriorityClass")
            | ("node.k8s.io", "RuntimeClass")
            | ("networking.k8s.io", "IngressClass")
            | ("certificates.k8s.io", "CertificateSigningRequest")
            | (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration"
                    | "MutatingWebhookConfiguration"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            )
            | ("apiregistration.k8s.io", "APIService")
            | (
                "flowcontrol.apiserver.k8s.io",
                "FlowSchema" | "PriorityLevelConfiguration"
            )
    )
}

fn group_kind(kind: &KindRef) -> GroupKind {
    (kind.group.clone(), kind.kind.clone())
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    obj["metadata"][field] = value;
}

fn parse_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()))
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError {
        code: 400,
        reason: "BadRequest".into(),
        message: message.into(),
    }
}

impl MockHost {
    /// A host that checks nothing: every API call is allowed, every kind is cached. Prefer
    /// [`MockHost::for_reconciler`], which checks like the real host.
    pub fn new() -> Self {
        Self::default()
    }

    /// A host for plugin `R`: its description is validated like the host does at load time
    /// (panics with the reason if it is invalid), then API calls are checked against its
    /// permissions and cache reads against its watches.
    pub fn for_reconciler<R: Reconciler>() -> Self {
        let host = Self::new();
        host.declare(R::describe());
        host
    }

    /// Checks calls against this description from now on (see [`MockHost::for_reconciler`]).
    ///
    /// # Panics
    /// If the description is invalid ([`Description::validate`]).
    pub fn declare(&self, description: Description) -> &Self {
        if let Err(e) = description.validate() {
            panic!("invalid plugin description: {e}");
        }
        let decls: Vec<_> = description
            .metrics
            .iter()
            .map(crate::metrics::Metric::decl)
            .collect();
        let mut st = self.state.borrow_mut();
        let max = st
            .max_metric_series
            .unwrap_or(wcm_rules::metrics::DEFAULT_MAX_SERIES);
        st.metrics = (!decls.is_empty()).then(|| wcm_rules::metrics::Series::new(&decls, max));
        st.declared = Some(description);
        drop(st);
        self
    }

    /// Where the plugin acts, as the operator sets it with `namespaces = [...]` in its NAME.toml:
    /// a call in any other namespace is refused (403 `OutOfScope`). Without it, as the host: the
    /// namespaces its watches name, or, when a watch covers every namespace, every namespace
    /// except `wcm-system` (the default protected namespace, where the host and the plugins'
    /// identities live).
    pub fn acting_in(&self, namespaces: &[&str]) -> &Self {
        self.state.borrow_mut().acting_in =
            Some(namespaces.iter().map(|n| n.to_string()).collect());
        self
    }

    /// Declares a custom kind cluster-scoped (built-in kinds are known): a call on it names no
    /// namespace, and a watch of it covers none.
    pub fn with_cluster_scope(&self, group: &str, kind: &str) -> &Self {
        self.state
            .borrow_mut()
            .cluster_scoped
            .insert((group.to_string(), kind.to_string()));
        self
    }

    /// The plural resource name of a kind, for the permission check, when the usual English plural
    /// (`Policy` → `policies`) is wrong for it.
    pub fn with_plural(&self, group: &str, kind: &str, plural: &str) -> &Self {
        self.state
            .borrow_mut()
            .plurals
            .insert((group.to_string(), kind.to_string()), plural.to_string());
        self
    }

    /// Puts an object in the cache and in the API server. Anything that serializes to an object
    /// with `apiVersion`, `kind` and `metadata.name` will do: a k8s-openapi type, a `json!` value,
    /// a [`DynamicObject`](crate::DynamicObject).
    ///
    /// An object without a `resourceVersion` or `uid` gets them, as every object the API server
    /// stores has (so a write from a stale read conflicts, as in the cluster).
    ///
    /// # Panics
    /// If the object lacks `apiVersion`, `kind` or `metadata.name`.
    pub fn seed(&self, obj: &impl Serialize) -> &Self {
        let value = self.stamped(obj);
        self.seed_cache(&value).seed_api(&value)
    }

    /// `obj` as JSON, with a `resourceVersion` and a `uid` of the mock's sequences when it has
    /// none (every object the API server stores has both).
    fn stamped(&self, obj: &impl Serialize) -> Value {
        let (_, _, mut value) = Self::identify(obj);
        let mut st = self.state.borrow_mut();
        if meta_str(&value, "resourceVersion").is_none() {
            let rv = st.next_revision();
            set_meta(&mut value, "resourceVersion", Value::String(rv));
        }
        if meta_str(&value, "uid").is_none() {
            st.uids += 1;
            let uid = format!("mock-uid-{}", st.uids);
            set_meta(&mut value, "uid", Value::String(uid));
        }
        value
    }

    /// Puts an object in the cache only (the API server does not have it, or not yet).
    ///
    /// # Panics
    /// As [`MockHost::seed`].
    pub fn seed_cache(&self, obj: &impl Serialize) -> &Self {
        let (gk, key, value) = Self::identify(obj);
        self.state
            .borrow_mut()
            .cache
            .entry(gk)
            .or_default()
            .insert(key, value);
        self
    }

    /// Puts an object in the API server only (the cache has not seen it); it gets a
    /// `resourceVersion` as with [`MockHost::seed`].
    ///
    /// # Panics
    /// As [`MockHost::seed`].
    pub fn seed_api(&self, obj: &impl Serialize) -> &Self {
        let (gk, key, value) = Self::identify(&self.stamped(obj));
        self.state
            .borrow_mut()
            .api
            .entry(gk)
            .or_default()
            .insert(key, value);
        self
    }

    fn identify(obj: &impl Serialize) -> (GroupKind, ObjectKey, Value) {
        let value = serde_json::to_value(obj)
            .unwrap_or_else(|e| panic!("seeded object does not serialize: {e}"));
        let api_version = value.get("apiVersion").and_then(Value::as_str);
        let kind = value.get("kind").and_then(Value::as_str);
        let (Some(api_version), Some(kind), Some(name)) =
            (api_version, kind, meta_str(&value, "name"))
        else {
            panic!("a seeded object needs apiVersion, kind and metadata.name: {value}");
        };
        let kind = KindRef::from_api_version(api_version, kind);
        let key = ObjectKey::new(meta_str(&value, "namespace"), name);
        (group_kind(&kind), key, value)
    }

    /// Makes the cache show what the API server holds now (the watch caught up).
    pub fn sync_cache(&self) -> &Self {
        let mut st = self.state.borrow_mut();
        st.cache = st.api.clone();
        self
    }

    /// Sets a configuration value (`[config]` of `NAME.toml`).
    pub fn set_config(&self, key: &str, value: &str) -> &Self {
        DESCRIBE_CONFIG.with(|c| c.borrow_mut().insert(key.to_string(), value.to_string()));
        self.state
            .borrow_mut()
            .config
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Sets a secret value (`[secrets]` of `NAME.toml`, resolved).
    pub fn set_secret(&self, key: &str, value: &str) -> &Self {
        self.state
            .borrow_mut()
            .secrets
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Makes the next API call with `verb` fail with `error` (once), e.g.
    /// `ApiError::new(500, "InternalError", "etcd timeout")`. The call is still recorded.
    pub fn fail_next(&self, verb: Verb, error: ApiError) -> &Self {
        self.state.borrow_mut().failures.push((verb, error));
        self
    }

    /// Answers the plugin's outbound HTTP with `handler` from now on (a fake of the remote API:
    /// canned answers, or a small in-memory model of it).
    pub fn on_http(
        &self,
        handler: impl FnMut(&HttpRequest) -> Result<HttpResponse, HttpError> + 'static,
    ) -> &Self {
        self.state.borrow_mut().http_handler = Some(Rc::new(RefCell::new(handler)));
        self
    }

    /// Every outbound HTTP request the plugin made, in order (refused ones included).
    pub fn http_requests(&self) -> Vec<HttpRequest> {
        self.state.borrow().http_requests.clone()
    }

    /// Puts `value` in the context of every later [`MockHost::run`], replacing what the plugin's
    /// [`Reconciler::setup`] put in for its type: a fake of an outside API, test settings.
    pub fn inject<T: 'static>(&self, value: T) -> &Self {
        let value: Rc<dyn std::any::Any> = Rc::new(value);
        let id = (*value).type_id();
        let mut state = self.state.borrow_mut();
        state.injected.retain(|v| (**v).type_id() != id);
        state.injected.push(value);
        drop(state);
        self
    }

    /// A [`Context`] over this host.
    pub fn context(&self) -> Context {
        Context::new(self.clone())
    }

    /// Reconciles `key` with plugin `R`, as the host does: the request carries the cached object
    /// of `R`'s primary kind (`None` when the cache does not have it).
    pub fn run<R: Reconciler>(&self, key: ObjectKey) -> Result<Action, Error> {
        let kind = R::describe()
            .primary
            .map(|w| w.kind)
            .unwrap_or_else(|| KindRef::new("", "", ""));
        let object = self.cache_get(&kind, &key);
        self.run_request::<R>(Request::new(key, object))
    }

    /// Reconciles a request made by the test.
    pub fn run_request<R: Reconciler>(&self, request: Request) -> Result<Action, Error> {
        let mut ctx = self.context();
        let _log = crate::logging::enter(ctx.host_rc());
        R::setup(&mut ctx)?;
        for value in self.state.borrow().injected.iter() {
            ctx.insert_rc(value.clone());
        }
        let action = R::reconcile(&ctx, request.clone())?;
        // As the host: the children returned are applied and pruned before the reconcile counts
        // as done, and a child that fails makes it an error.
        if let Some(children) = action.children() {
            self.settle_children(&request, children.to_vec())?;
        }
        Ok(action)
    }

    /// Every API call so far, in order.
    pub fn calls(&self) -> Vec<ApiCall> {
        self.state.borrow().calls.clone()
    }

    /// Every patch and status patch so far, in order.
    pub fn patches(&self) -> Vec<RecordedPatch> {
        self.state
            .borrow()
            .calls
            .iter()
            .filter(|c| matches!(c.verb, Verb::Patch | Verb::PatchStatus))
            .map(|c| RecordedPatch {
                kind: c.kind.clone(),
                key: ObjectKey {
                    namespace: c.namespace.clone(),
                    name: c.name.clone().unwrap_or_default(),
                },
                patch_type: c.patch_type.unwrap_or(PatchType::Merge),
                body: c.body.clone().unwrap_or(Value::Null),
                status: c.verb == Verb::PatchStatus,
                error: c.error.clone(),
            })
            .collect()
    }

    /// Every event recorded so far, in order.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.state.borrow().events.clone()
    }

    /// Every log line so far, in order.
    pub fn logs(&self) -> Vec<LogLine> {
        self.state.borrow().logs.clone()
    }

    /// Forgets the recorded calls, events, logs and HTTP requests (between the steps of a test).
    pub fn clear_records(&self) -> &Self {
        let mut st = self.state.borrow_mut();
        st.calls.clear();
        st.events.clear();
        st.logs.clear();
        st.http_requests.clear();
        self
    }

    /// An object as the API server holds it now, typed; `None` when absent.
    ///
    /// # Panics
    /// If the stored object does not read as `K`.
    pub fn object<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        let resource = ApiResource::erase::<K>(&());
        let value =
            self.object_value(&KindRef::from(&resource), &ObjectKey::new(namespace, name))?;
        let json = value.to_string();
        Some(decode(&json, &resource).unwrap_or_else(|e| {
            panic!(
                "stored {} {name} does not read as the type: {e}",
                resource.kind
            )
        }))
    }

    /// Whether the writes made to the primary object `key` since it was put in the cache (by
    /// [`MockHost::seed`] or [`MockHost::sync_cache`]) would wake the plugin again, with its
    /// primary watch's change filter applied as the host applies it. A reconcile that writes its
    /// own status behind [`Watch::ignore_status_changes`](crate::Watch::ignore_status_changes)
    /// does not; one that bumps a label on every run does, and would loop.
    ///
    /// # Panics
    /// Without a declared description ([`MockHost::for_reconciler`]).
    pub fn wakes_itself(&self, key: &ObjectKey) -> bool {
        let st = self.state.borrow();
        let Some(primary) = st.declared.as_ref().and_then(|d| d.primary.as_ref()) else {
            panic!("wakes_itself needs a declared plugin: use MockHost::for_reconciler");
        };
        let gk = group_kind(&primary.kind);
        let seen = st.cache.get(&gk).and_then(|objs| objs.get(key));
        let now = st.api.get(&gk).and_then(|objs| objs.get(key));
        match (seen, now) {
            (Some(seen), Some(now)) => {
                content(seen) != content(now) && primary.changes.wakes(seen, now)
            }
            // Created or deleted: always delivered.
            (None, Some(_)) | (Some(_), None) => true,
            (None, None) => false,
        }
    }

    /// An object as the API server holds it now, as JSON; `None` when absent.
    pub fn object_value(&self, kind: &KindRef, key: &ObjectKey) -> Option<Value> {
        self.state
            .borrow()
            .api
            .get(&group_kind(kind))
            .and_then(|objs| objs.get(key))
            .cloned()
    }
}

impl State {
    /// Records `manager` among the managers of a stored object that it applied; the object.
    fn note_applied(&mut self, kind: &KindRef, key: &ObjectKey, manager: &str) -> Option<String> {
        self.note_manager(kind, key, manager, "Apply")
    }

    /// Records `manager` among the managers of a stored object, for `operation` (`Apply`, or
    /// `Update` for a create, as the API server does); the object.
    fn note_manager(
        &mut self,
        kind: &KindRef,
        key: &ObjectKey,
        manager: &str,
        operation: &str,
    ) -> Option<String> {
        let obj = self
            .api
            .get_mut(&group_kind(kind))
            .and_then(|objects| objects.get_mut(key))?;
        let entry = serde_json::json!({"manager": manager, "operation": operation});
        let fields = &mut obj["metadata"]["managedFields"];
        match fields.as_array_mut() {
            Some(list) if list.contains(&entry) => {}
            Some(list) => list.push(entry),
            None => *fields = Value::Array(vec![entry]),
        }
        let out = obj.to_string();
        if let Some(cached) = self
            .cache
            .get_mut(&group_kind(kind))
            .and_then(|objects| objects.get_mut(key))
        {
            cached["metadata"]["managedFields"] = obj["metadata"]["managedFields"].clone();
        }
        Some(out)
    }

    fn plural(&self, kind: &KindRef) -> String {
        self.plurals
            .get(&group_kind(kind))
            .cloned()
            .unwrap_or_else(|| plural_of(&kind.kind))
    }

    fn check_permission(&self, verb: Verb, kind: &KindRef) -> Result<(), ApiError> {
        let Some(d) = &self.declared else {
            return Ok(());
        };
        let mut resource = self.plural(kind);
        if verb == Verb::PatchStatus {
            resource.push_str("/status");
        }
        if d.permissions
            .iter()
            .any(|p| p.allows(&kind.group, &resource, verb.rbac()))
        {
            return Ok(());
        }
        Err(ApiError {
            code: 403,
            reason: ApiError::NOT_DECLARED.into(),
            message: format!(
                "plugin {} did not declare permission to {} {resource} in API group {:?}: add Permission::new({:?}, {resource:?}, &[{:?}]) to its description",
                d.name,
                verb.rbac(),
                kind.group,
                kind.group,
                verb.rbac()
            ),
        })
    }

    /// Whether the plugin acts in the call's namespace, as the host decides it; a write of the
    /// protected namespace's own Namespace object is refused the same way.
    fn check_scope(&self, call: &ApiCall) -> Result<(), ApiError> {
        let namespace_object = call.kind.group.is_empty()
            && call.kind.kind == "Namespace"
            && !matches!(call.verb, Verb::Get | Verb::List);
        let Some(d) = &self.declared else {
            return Ok(());
        };
        let namespace = call.namespace.as_deref().filter(|n| !n.is_empty());
        // As the host: a create names its object in the body.
        let created = (call.verb == Verb::Create)
            .then(|| {
                call.body
                    .as_ref()
                    .and_then(|b| b["metadata"]["name"].as_str().map(str::to_string))
            })
            .flatten();
        let name = call.name.clone().or(created);
        let target = match (namespace, &name) {
            (Some(ns), _) => ns,
            (None, Some(name)) if namespace_object && name == PROTECTED_NAMESPACE => name.as_str(),
            // A namespaced kind across all namespaces would reach the protected ones: the host
            // refuses it (reads across namespaces come from the cache).
            (None, _)
                if !cluster_scoped(&call.kind)
                    && !self.cluster_scoped.contains(&group_kind(&call.kind)) =>
            {
                return Err(ApiError {
                    code: 403,
                    reason: ApiError::OUT_OF_SCOPE.into(),
                    message: format!(
                        "plugin {} may not {} {} across all namespaces: name a namespace (read across namespaces from the cache)",
                        d.name,
                        call.verb.rbac(),
                        self.plural(&call.kind)
                    ),
                });
            }
            (None, _) => return Ok(()),
        };
        let ns = target;
        let allowed = match &self.acting_in {
            Some(list) => list.iter().any(|n| n == ns),
            None => {
                let watches: Vec<&Watch> = d
                    .primary
                    .iter()
                    .chain(d.secondaries.iter().map(|s| &s.watch))
                    .collect();
                let everywhere = watches.iter().any(|w| {
                    w.namespace.is_none()
                        && !cluster_scoped(&w.kind)
                        && !self.cluster_scoped.contains(&group_kind(&w.kind))
                });
                if everywhere {
                    ns != PROTECTED_NAMESPACE
                } else {
                    ns != PROTECTED_NAMESPACE
                        && watches.iter().any(|w| w.namespace.as_deref() == Some(ns))
                }
            }
        };
        if allowed {
            return Ok(());
        }
        Err(ApiError {
            code: 403,
            reason: ApiError::OUT_OF_SCOPE.into(),
            message: format!(
                "plugin {} may act only where it watches (or where its NAME.toml's `namespaces` says), not in namespace {ns}",
                d.name
            ),
        })
    }

    /// The watches of `kind`, or `None` when nothing is declared (everything visible).
    /// Why the host would drop an event about `regarding`: its kind is neither watched (in its
    /// namespace) nor declared, or its namespace is not one where the plugin acts. `None`: kept
    /// (and always without a declaration).
    fn event_refusal(&self, regarding: &ObjectRef) -> Option<String> {
        let d = self.declared.as_ref()?;
        let kind = &regarding.kind;
        let ns = regarding.key.namespace.as_deref();
        let watched = self.watches(kind).is_some_and(|ws| {
            ws.iter()
                .any(|w| w.namespace.is_none() || w.namespace.as_deref() == ns)
        });
        let plural = self.plural(kind);
        let declared = d
            .permissions
            .iter()
            .any(|p| p.group == kind.group && (p.resource == plural || p.resource == "*"));
        let acts_there = ns.is_none_or(|ns| {
            self.check_scope(&MockHost::record(Verb::Create, kind, Some(ns), None))
                .is_ok()
        });
        if (watched || declared) && acts_there {
            return None;
        }
        Some(format!(
            "{kind} is neither watched (there) nor declared by the plugin, or the namespace is not one where it acts"
        ))
    }

    fn watches(&self, kind: &KindRef) -> Option<Vec<&Watch>> {
        let d = self.declared.as_ref()?;
        let all = d
            .primary
            .iter()
            .chain(d.secondaries.iter().map(|s| &s.watch));
        Some(all.filter(|w| w.kind == *kind).collect())
    }

    /// What the cache hands out for `obj`: `None` when no watch covers it; metadata only when
    /// every watch covering it is metadata-only.
    fn cached_view(&self, kind: &KindRef, obj: &Value) -> Option<Value> {
        let Some(watches) = self.watches(kind) else {
            return Some(obj.clone());
        };
        let metadata = obj.get("metadata").cloned().unwrap_or(Value::Null);
        let covering: Vec<&&Watch> = watches.iter().filter(|w| covers(w, obj)).collect();
        if covering.is_empty() {
            return None;
        }
        if covering.iter().all(|w| w.metadata_only) {
            return Some(
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata}),
            );
        }
        Some(obj.clone())
    }

    fn cache_select(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<(ObjectKey, Value)>, String> {
        if self.watches(kind).is_some_and(|w| w.is_empty()) {
            return Err(format!(
                "{}/{} is not watched by this plugin: declare it in describe to read it from the cache",
                kind.version, kind.kind
            ));
        }
        let selector = Selector::parse(label_selector.unwrap_or(""))?;
        let Some(objects) = self.cache.get(&group_kind(kind)) else {
            return Ok(Vec::new());
        };
        Ok(objects
            .iter()
            .filter(|(key, _)| namespace.is_none() || key.namespace.as_deref() == namespace)
            .filter(|(_, obj)| selector.matches(obj.get("metadata").unwrap_or(&Value::Null)))
            .filter_map(|(key, obj)| Some((key.clone(), self.cached_view(kind, obj)?)))
            .collect())
    }

    fn next_revision(&mut self) -> String {
        self.revision += 1;
        (1000 + self.revision).to_string()
    }

    fn not_found(&self, kind: &KindRef, key: &ObjectKey) -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound".into(),
            message: format!("{} {:?} not found", self.plural(kind), key.name),
        }
    }

    fn conflict(&self, kind: &KindRef, key: &ObjectKey) -> ApiError {
        ApiError {
            code: 409,
            reason: "Conflict".into(),
            message: format!(
                "Operation cannot be fulfilled on {} {:?}: the object has been modified; please apply your changes to the latest version and try again",
                self.plural(kind),
                key.name
            ),
        }
    }

    /// Stores `obj` after a write: new resourceVersion; gone when it is being deleted and no
    /// finalizer is left.
    /// Runs `op` and, for a dry run, puts the API store back as it was: answered, nothing stored.
    fn maybe_dry<T>(
        &mut self,
        dry_run: bool,
        op: impl FnOnce(&mut Self) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        if !dry_run {
            return op(self);
        }
        let (api, revision, uids) = (self.api.clone(), self.revision, self.uids);
        let out = op(self);
        (self.api, self.revision, self.uids) = (api, revision, uids);
        out
    }

    fn store(&mut self, kind: &KindRef, key: &ObjectKey, mut obj: Value) -> Value {
        let rv = self.next_revision();
        set_meta(&mut obj, "resourceVersion", Value::String(rv));
        let finalizers_left = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let objects = self.api.entry(group_kind(kind)).or_default();
        if meta_str(&obj, "deletionTimestamp").is_some() && !finalizers_left {
            objects.remove(key);
        } else {
            objects.insert(key.clone(), obj.clone());
        }
        obj
    }

    fn stored(&self, kind: &KindRef, key: &ObjectKey) -> Option<&Value> {
        self.api
            .get(&group_kind(kind))
            .and_then(|objs| objs.get(key))
    }

    fn get(&self, kind: &KindRef, key: &ObjectKey) -> Result<String, ApiError> {
        self.stored(kind, key)
            .map(Value::to_string)
            .ok_or_else(|| self.not_found(kind, key))
    }

    fn list(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<String, ApiError> {
        let selector =
            Selector::parse(params.label_selector.as_deref().unwrap_or("")).map_err(bad_request)?;
        let fields = field_selector(params.field_selector.as_deref().unwrap_or(""))?;
        for f in &fields {
            let label = f.path.join(".");
            if !field_label_supported(kind, &label) {
                return Err(bad_request(format!(
                    "field label not supported: {label} (on {}; the API server answers the same)",
                    kind.kind
                )));
            }
        }
        if let Some(limit) = params.limit
            && !(1..=10_000).contains(&limit)
        {
            return Err(bad_request(format!(
                "limit {limit}: must be 1 to 10000 (the host refuses it too)"
            )));
        }
        let items: Vec<Value> = self
            .api
            .get(&group_kind(kind))
            .into_iter()
            .flatten()
            .filter(|(key, _)| namespace.is_none() || key.namespace.as_deref() == namespace)
            .filter(|(_, obj)| selector.matches(obj.get("metadata").unwrap_or(&Value::Null)))
            .filter(|(_, obj)| fields.iter().all(|f| f.matches(obj)))
            .map(|(_, obj)| obj.clone())
            .collect();
        // Pages: the token is the index of the next item (the API server's is opaque too).
        let start = match params.continue_token.as_deref() {
            None => 0,
            Some(t) => t
                .strip_prefix("mock-continue-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| bad_request(format!("not a continue token of this list: {t:?}")))?,
        };
        let end = match params.limit {
            Some(limit) => start.saturating_add(limit as usize).min(items.len()),
            None => items.len(),
        };
        let page: Vec<Value> = items.get(start..end).unwrap_or_default().to_vec();
        let mut metadata = json!({"resourceVersion": (1000 + self.revision).to_string()});
        if end < items.len() {
            metadata["continue"] = Value::String(format!("mock-continue-{end}"));
        }
        let list = json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind),
            "metadata": metadata,
            "items": page,
        });
        Ok(list.to_string())
    }

    fn create(
        &mut self,
        kind: &KindRef,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, ApiError> {
        let mut obj: Value = serde_json::from_str(body)
            .map_err(|e| bad_request(format!("the body is not JSON: {e}")))?;
        if !obj.is_object() {
            return Err(bad_request("the body is not a JSON object"));
        }
        let namespace = match (namespace, meta_str(&obj, "namespace")) {
            (Some(a), Some(b)) if a != b => {
                return Err(bad_request(
                    "the namespace of the object does not match the namespace of the request",
                ));
            }
            (Some(ns), _) | (None, Some(ns)) => Some(ns.to_string()),
            (None, None) => None,
        };
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(name), _) if !name.is_empty() => name.to_string(),
            (_, Some(prefix)) => format!("{prefix}{:05}", self.revision + 1),
            _ => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.name or metadata.generateName is required",
                ));
            }
        };
        let key = ObjectKey {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        if self.stored(kind, &key).is_some() {
            return Err(ApiError {
                code: 409,
                reason: "AlreadyExists".into(),
                message: format!("{} {name:?} already exists", self.plural(kind)),
            });
        }
        self.uids += 1;
        obj["apiVersion"] = Value::String(kind.api_version());
        obj["kind"] = Value::String(kind.kind.clone());
        set_meta(&mut obj, "name", Value::String(name));
        if let Some(ns) = namespace {
            set_meta(&mut obj, "namespace", Value::String(ns));
        }
        set_meta(
            &mut obj,
            "uid",
            Value::String(format!("mock-uid-{}", self.uids)),
        );
        set_meta(
            &mut obj,
            "creationTimestamp",
            Value::String(MOCK_TIME.into()),
        );
        // The status subresource: a create does not set the status.
        if let Value::Object(m) = &mut obj {
            m.remove("status");
        }
        if tracks_generation(&obj) {
            set_meta(&mut obj, "generation", json!(1));
        }
        Ok(self.store(kind, &key, obj).to_string())
    }

    /// Carries identity fields over from the stored object and checks a stale resourceVersion.
    fn keep_identity(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        stored: &Value,
        updated: &mut Value,
    ) -> Result<(), ApiError> {
        if let (Some(sent), Some(current)) = (
            meta_str(updated, "resourceVersion"),
            meta_str(stored, "resourceVersion"),
        ) && sent != current
        {
            return Err(self.conflict(kind, key));
        }
        // As the API server's validation of an update: the UID is immutable (an update, or a
        // patch of any type, naming another UID is refused; the host's children rely on it).
        if let (Some(sent), Some(current)) = (meta_str(updated, "uid"), meta_str(stored, "uid"))
            && sent != current
        {
            return Err(ApiError::new(
                422,
                "Invalid",
                &format!(
                    "{} {:?} is invalid: metadata.uid: Invalid value: {sent:?}: field is immutable",
                    kind.kind, key.name
                ),
            ));
        }
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
        ] {
            match stored.get("metadata").and_then(|m| m.get(field)) {
                Some(v) => set_meta(updated, field, v.clone()),
                None => {
                    if let Some(Value::Object(m)) = updated.get_mut("metadata") {
                        m.remove(field);
                    }
                }
            }
        }
        Ok(())
    }

    fn replace(&mut self, kind: &KindRef, key: &ObjectKey, body: &str) -> Result<String, ApiError> {
        let stored = self
            .stored(kind, key)
            .cloned()
            .ok_or_else(|| self.not_found(kind, key))?;
        let mut obj: Value = serde_json::from_str(body)
            .map_err(|e| bad_request(format!("the body is not JSON: {e}")))?;
        if meta_str(&obj, "name").is_some_and(|n| n != key.name) {
            return Err(bad_request(
                "the name of the object does not match the name of the request",
            ));
        }
        self.keep_identity(kind, key, &stored, &mut obj)?;
        main_resource_write(&stored, &mut obj);
        Ok(self.store(kind, key, obj).to_string())
    }

    fn patch(
        &mut self,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        status: bool,
    ) -> Result<String, ApiError> {
        let patch: Value = serde_json::from_str(body)
            .map_err(|e| bad_request(format!("the patch is not JSON: {e}")))?;
        let stored = match self.stored(kind, key) {
            Some(obj) => obj.clone(),
            // Server-side apply creates what is absent, and the API server asks RBAC for
            // `create` then: the host grants only what the plugin declares.
            None if patch_type == PatchType::Apply && !status => {
                if let Some(d) = &self.declared {
                    let resource = self.plural(kind);
                    if !d
                        .permissions
                        .iter()
                        .any(|p| p.allows(&kind.group, &resource, "create"))
                    {
                        let user =
                            format!("system:serviceaccount:wcm-system:wcm-plugin-{}", d.name);
                        let place = match &key.namespace {
                            Some(ns) => format!(" in the namespace {ns:?}"),
                            None => String::new(),
                        };
                        return Err(ApiError::new(
                            403,
                            "Forbidden",
                            &format!(
                                "{resource} {:?} is forbidden: User {user:?} cannot create resource {resource:?} in API group {:?}{place} (server-side apply of an absent object creates it: declare \"create\")",
                                key.name, kind.group
                            ),
                        ));
                    }
                }
                let mut obj = patch.clone();
                if !obj.is_object() {
                    return Err(bad_request("an apply patch must be a JSON object"));
                }
                set_meta(&mut obj, "name", Value::String(key.name.clone()));
                if let Some(ns) = &key.namespace {
                    set_meta(&mut obj, "namespace", Value::String(ns.clone()));
                }
                return self.create(kind, key.namespace.as_deref(), &obj.to_string());
            }
            None => return Err(self.not_found(kind, key)),
        };
        let mut patched = stored.clone();
        match patch_type {
            // The API server takes strategic merge patches for built-in kinds only.
            PatchType::Strategic if !is_built_in(kind) => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            PatchType::Strategic => patch::strategic(&mut patched, &patch).map_err(bad_request)?,
            PatchType::Merge | PatchType::Apply => patch::merge(&mut patched, &patch),
            // The API server's answer, word for word (the mock adds what failed).
            PatchType::Json => patch::json(&mut patched, &patch).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    &format!("{} (mock: {e})", ApiError::PATCH_NOT_APPLIED),
                )
            })?,
        }
        self.keep_identity(kind, key, &stored, &mut patched)?;
        if !status {
            main_resource_write(&stored, &mut patched);
        }
        if status {
            let mut only_status = stored;
            match patched.get("status") {
                Some(s) => only_status["status"] = s.clone(),
                None => {
                    if let Value::Object(m) = &mut only_status {
                        m.remove("status");
                    }
                }
            }
            patched = only_status;
        }
        Ok(self.store(kind, key, patched).to_string())
    }

    fn delete(
        &mut self,
        kind: &KindRef,
        key: &ObjectKey,
        params: &DeleteParams,
    ) -> Result<(), ApiError> {
        let mut obj = self
            .stored(kind, key)
            .cloned()
            .ok_or_else(|| self.not_found(kind, key))?;
        for (field, wanted) in [
            ("uid", &params.precondition_uid),
            ("resourceVersion", &params.precondition_resource_version),
        ] {
            if let Some(wanted) = wanted
                && meta_str(&obj, field) != Some(wanted.as_str())
            {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    &format!(
                        "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {}",
                        meta_str(&obj, field).unwrap_or_default()
                    ),
                ));
            }
        }
        if meta_str(&obj, "deletionTimestamp").is_none() {
            set_meta(
                &mut obj,
                "deletionTimestamp",
                Value::String(MOCK_TIME.into()),
            );
        }
        self.store(kind, key, obj);
        Ok(())
    }
}

/// Whether the API server keeps `metadata.generation` for an object: custom resources and the
/// built-in kinds with a `spec` (an approximation: the mock knows no schemas).
fn tracks_generation(obj: &Value) -> bool {
    obj.get("spec").is_some() || obj.pointer("/metadata/generation").is_some()
}

/// What the API server does to a write of the main resource (not `/status`): the status stays as
/// stored (the status subresource owns it), and `generation` goes up by one when anything outside
/// `metadata` and `status` changed.
fn main_resource_write(stored: &Value, updated: &mut Value) {
    let Value::Object(new) = updated else {
        return;
    };
    match stored.get("status") {
        Some(s) => {
            new.insert("status".into(), s.clone());
        }
        None => {
            new.remove("status");
        }
    }
    let content = |m: &Map<String, Value>| -> Map<String, Value> {
        m.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let old = stored.as_object().map(content).unwrap_or_default();
    if !tracks_generation(stored) && new.get("spec").is_none() {
        return;
    }
    let generation = stored
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let next = if content(new) != old {
        generation + 1
    } else {
        generation
    };
    set_meta(updated, "generation", json!(next));
}

impl MockHost {
    /// Records the call, then answers it: an injected failure, the permission check, `op`.
    fn call<T>(
        &self,
        record: ApiCall,
        op: impl FnOnce(&mut State) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.call_with(record, Ok(()), op)
    }

    /// [`MockHost::call`] with the check of the call's options (`options`), made as the host
    /// makes it: after the names, before the permission and scope checks.
    fn call_with<T>(
        &self,
        mut record: ApiCall,
        options: Result<(), ApiError>,
        op: impl FnOnce(&mut State) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut st = self.state.borrow_mut();
        let injected = st
            .failures
            .iter()
            .position(|(v, _)| *v == record.verb)
            .map(|i| st.failures.remove(i).1);
        let result = match injected {
            Some(e) => Err(e),
            None => validation::call(&record)
                .and(options)
                .and_then(|()| st.check_permission(record.verb, &record.kind))
                .and_then(|()| st.check_scope(&record))
                .and_then(|()| op(&mut st)),
        };
        record.error = result.as_ref().err().cloned();
        st.calls.push(record);
        result
    }

    fn record(verb: Verb, kind: &KindRef, namespace: Option<&str>, name: Option<&str>) -> ApiCall {
        ApiCall {
            verb,
            kind: kind.clone(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            label_selector: None,
            field_selector: None,
            dry_run: false,
            patch_type: None,
            body: None,
            error: None,
        }
    }
}

impl MockHost {
    /// A patch of the object ([`Verb::Patch`]) or of its status ([`Verb::PatchStatus`]).
    fn patch_call(
        &self,
        verb: Verb,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError> {
        let record = ApiCall {
            body: Some(parse_body(body)),
            patch_type: Some(patch_type),
            dry_run: params.dry_run,
            ..Self::record(verb, kind, key.namespace.as_deref(), Some(&key.name))
        };
        let status = verb == Verb::PatchStatus;
        let manager = self.field_manager(params.field_manager_suffix.as_deref());
        self.call_with(record, validation::patch(patch_type, params), |st| {
            let out = st.maybe_dry(params.dry_run, |st| {
                st.patch(kind, key, patch_type, body, status)
            })?;
            // As the API server: a server-side apply makes its field manager one of the
            // object's managers (what a prune of children checks).
            if patch_type == PatchType::Apply && !params.dry_run {
                return Ok(st.note_applied(kind, key, &manager).unwrap_or(out));
            }
            Ok(out)
        })
    }

    /// The name the host knows the plugin by (its declared name; `mock` when none is declared).
    pub(crate) fn plugin_name(&self) -> String {
        self.state
            .borrow()
            .declared
            .as_ref()
            .map_or_else(|| "mock".to_string(), |d| d.name.clone())
    }
}

impl Host for MockHost {
    fn get(&self, kind: &KindRef, key: &ObjectKey) -> Result<String, ApiError> {
        let record = Self::record(Verb::Get, kind, key.namespace.as_deref(), Some(&key.name));
        self.call(record, |st| st.get(kind, key))
    }

    fn list(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<String, ApiError> {
        let record = ApiCall {
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            ..Self::record(Verb::List, kind, namespace, None)
        };
        self.call_with(record, validation::list(params), |st| {
            st.list(kind, namespace, params)
        })
    }

    fn create(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, ApiError> {
        let record = ApiCall {
            body: Some(parse_body(body)),
            ..Self::record(Verb::Create, kind, namespace, None)
        };
        let manager = self.field_manager(None);
        self.call(record, |st| {
            let out = st.create(kind, namespace, body)?;
            // As the API server: the creator's field manager owns the fields, an `Update` entry.
            let created: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
            let key = ObjectKey::new(
                meta_str(&created, "namespace"),
                meta_str(&created, "name").unwrap_or_default(),
            );
            Ok(st
                .note_manager(kind, &key, &manager, "Update")
                .unwrap_or(out))
        })
    }

    fn replace(&self, kind: &KindRef, key: &ObjectKey, body: &str) -> Result<String, ApiError> {
        let record = ApiCall {
            body: Some(parse_body(body)),
            ..Self::record(
                Verb::Replace,
                kind,
                key.namespace.as_deref(),
                Some(&key.name),
            )
        };
        self.call(record, |st| st.replace(kind, key, body))
    }

    fn patch(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError> {
        self.patch_call(Verb::Patch, kind, key, patch_type, body, params)
    }

    fn patch_status(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError> {
        self.patch_call(Verb::PatchStatus, kind, key, patch_type, body, params)
    }

    fn delete(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        params: &DeleteParams,
    ) -> Result<(), ApiError> {
        let record = ApiCall {
            dry_run: params.dry_run,
            ..Self::record(
                Verb::Delete,
                kind,
                key.namespace.as_deref(),
                Some(&key.name),
            )
        };
        self.call_with(record, validation::delete(params), |st| {
            st.maybe_dry(params.dry_run, |st| st.delete(kind, key, params))
        })
    }

    fn cache_get(&self, kind: &KindRef, key: &ObjectKey) -> Option<String> {
        let st = self.state.borrow();
        let obj = st.cache.get(&group_kind(kind))?.get(key)?;
        st.cached_view(kind, obj).map(|v| v.to_string())
    }

    fn cache_keys(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<ObjectKey>, String> {
        let st = self.state.borrow();
        Ok(st
            .cache_select(kind, namespace, label_selector)?
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    fn cache_list(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let st = self.state.borrow();
        Ok(st
            .cache_select(kind, namespace, label_selector)?
            .into_iter()
            .map(|(_, obj)| obj.to_string())
            .collect())
    }

    fn record_event(
        &self,
        regarding: &ObjectRef,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let refused = validation::event(regarding, reason, action)
            .err()
            .or_else(|| self.state.borrow().event_refusal(regarding));
        if let Some(why) = refused {
            // As the host: the event is dropped, with a warning.
            self.log(Level::Warn, &format!("event refused: {why}"), &[]);
            return;
        }
        // As the host: a note is cut to 1 KiB (at a character boundary).
        let mut end = note.len().min(1024);
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        self.state.borrow_mut().events.push(RecordedEvent {
            regarding: regarding.clone(),
            event_type,
            reason: reason.to_string(),
            action: action.to_string(),
            note: note[..end].to_string(),
        });
    }

    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        // Printed too: the test harness shows it when a test fails.
        let rendered: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!("[plugin {level:?}] {message} {}", rendered.join(" "));
        self.state.borrow_mut().logs.push(LogLine {
            level,
            message: message.to_string(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
    }

    fn config(&self, key: &str) -> Option<String> {
        self.state.borrow().config.get(key).cloned()
    }

    fn secret(&self, key: &str) -> Option<String> {
        self.state.borrow().secrets.get(key).cloned()
    }

    fn metric(
        &self,
        update: crate::metrics::Update,
        name: &str,
        labels: &[&str],
        value: f64,
    ) -> Result<(), String> {
        self.update_metric(update, name, labels, value)
    }

    fn http(&self, req: &HttpRequest) -> Result<HttpResponse, HttpError> {
        let handler = {
            let mut st = self.state.borrow_mut();
            st.http_requests.push(req.clone());
            if let Some(d) = &st.declared
                && !declares_host(&d.outbound_hosts, &req.url)
            {
                return Err(HttpError::new(
                    HttpErrorKind::Denied,
                    format!("{}: HttpRequestDenied (host not declared)", req.url),
                ));
            }
            st.http_handler.clone()
        };
        // Called with the state released: the handler may inspect the mock.
        match handler {
            Some(h) => (h.borrow_mut())(req),
            None => Err(HttpError::new(
                HttpErrorKind::Connection,
                format!(
                    "{}: no HTTP handler in the mock (MockHost::on_http)",
                    req.url
                ),
            )),
        }
    }
}

/// Whether `url`'s authority matches a declared outbound host: `host` (any port) or `host:port`.
fn declares_host(declared: &[String], url: &str) -> bool {
    let Some((scheme, authority, _)) = split_url(url) else {
        return false;
    };
    let authority = authority.to_ascii_lowercase();
    let default_port = if scheme.eq_ignore_ascii_case("https") {
        "443"
    } else {
        "80"
    };
    // `[v6]` and `name` have no port; `[v6]:p` and `name:p` do.
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h.to_string(), p.to_string()),
        _ => (authority.clone(), default_port.to_string()),
    };
    declared.iter().any(|d| {
        let d = d.to_ascii_lowercase();
        d == host || d == format!("{host}:{port}")
    })
}

/// One requirement of a field selector: a dotted path (`metadata.name`, `spec.nodeName`) equal or
/// not equal to a value, as the API server reads `a=b`, `a==b`, `a!=b`.
struct FieldRequirement {
    path: Vec<String>,
    value: String,
    equal: bool,
}

impl FieldRequirement {
    fn matches(&self, obj: &Value) -> bool {
        let mut node = obj;
        for part in &self.path {
            node = node.get(part.as_str()).unwrap_or(&Value::Null);
        }
        let actual = match node {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        (actual == self.value) == self.equal
    }
}

fn field_selector(s: &str) -> Result<Vec<FieldRequirement>, ApiError> {
    s.split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (path, value, equal) = if let Some((p, v)) = part.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, v, true)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, v, true)
            } else {
                return Err(bad_request(format!(
                    "not a field selector requirement: {part:?}"
                )));
            };
            Ok(FieldRequirement {
                path: path.trim().split('.').map(str::to_string).collect(),
                value: value.trim().to_string(),
                equal,
            })
        })
        .collect()
}

/// Whether the API server selects `kind` by this field: `metadata.name` and
/// `metadata.namespace` always, a few more for some built-in kinds, anything for a custom
/// resource (a CRD declares its `selectableFields`; the mock does not know them).
fn field_label_supported(kind: &KindRef, label: &str) -> bool {
    if matches!(label, "metadata.name" | "metadata.namespace") {
        return true;
    }
    if !is_built_in(kind) {
        return true;
    }
    let extra: &[&str] = match (kind.group.as_str(), kind.kind.as_str()) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["spec.unschedulable"],
        ("", "Namespace") => &["status.phase"],
        ("", "Secret") => &["type"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => &["status.replicas"],
        ("batch", "Job") => &["status.successful"],
        _ => &[],
    };
    extra.contains(&label)
}

/// A kind of the API server itself, by its group (a CRD may take a `*.k8s.io` group with
/// approval, as `samplecrd.k8s.io` does: it is not one of these).
fn is_built_in(kind: &KindRef) -> bool {
    matches!(
        kind.group.as_str(),
        "" | "apps"
            | "batch"
            | "autoscaling"
            | "policy"
            | "admissionregistration.k8s.io"
            | "apiextensions.k8s.io"
            | "apiregistration.k8s.io"
            | "authentication.k8s.io"
            | "authorization.k8s.io"
            | "certificates.k8s.io"
            | "coordination.k8s.io"
            | "discovery.k8s.io"
            | "events.k8s.io"
            | "flowcontrol.apiserver.k8s.io"
            | "internal.apiserver.k8s.io"
            | "networking.k8s.io"
            | "node.k8s.io"
            | "rbac.authorization.k8s.io"
            | "resource.k8s.io"
            | "scheduling.k8s.io"
            | "storage.k8s.io"
            | "storagemigration.k8s.io"
    )
}

/// An object as a watch event compares it: a write that changed nothing but the resourceVersion
/// (or managed fields) sends no event.
fn content(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

/// Whether `w` sees `obj`: its namespace and its label selector.
fn covers(w: &Watch, obj: &Value) -> bool {
    let namespace_ok =
        w.namespace.is_none() || w.namespace.as_deref() == meta_str(obj, "namespace");
    let metadata = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let labels_ok = w
        .label_selector
        .as_deref()
        .is_none_or(|s| Selector::parse(s).is_ok_and(|sel| sel.matches(&metadata)));
    namespace_ok && labels_ok
}
