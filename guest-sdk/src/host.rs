//! The host calls a plugin can make, as an object-safe trait: the wasm build implements it with the
//! component imports, tests with [`MockHost`](crate::testing::MockHost).

use crate::http::{HttpError, HttpErrorKind, HttpRequest, HttpResponse};
use crate::metrics::Update;
use crate::params::{DeleteParams, ListParams, PatchParams};
use crate::types::{ApiError, EventType, KindRef, Level, ObjectKey, ObjectRef, PatchType};

/// Everything a plugin can ask of its host, one method per import of the contract (and one that
/// says how HTTP is sent).
///
/// Plugin code normally goes through [`Context`](crate::Context) and its typed wrappers; this trait
/// is the raw, JSON-in/JSON-out layer beneath them ([`Context::host`](crate::Context::host)).
pub trait Host {
    /// GET one object; its JSON.
    fn get(&self, kind: &KindRef, key: &ObjectKey) -> Result<String, ApiError>;
    /// LIST objects (namespace `None`: all namespaces); the List's JSON.
    fn list(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<String, ApiError>;
    /// POST an object (JSON); the created object.
    fn create(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, ApiError>;
    /// PUT an object (JSON, with its resourceVersion for optimistic concurrency); the stored object.
    fn replace(&self, kind: &KindRef, key: &ObjectKey, body: &str) -> Result<String, ApiError>;
    /// PATCH an object; the patched object.
    fn patch(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError>;
    /// PATCH the status subresource; the patched object.
    fn patch_status(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        patch_type: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError>;
    /// DELETE an object.
    fn delete(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        params: &DeleteParams,
    ) -> Result<(), ApiError>;

    /// One cached object's JSON (`None` when absent, or when the kind is not watched).
    fn cache_get(&self, kind: &KindRef, key: &ObjectKey) -> Option<String>;
    /// The keys of cached objects (namespace `None`: all), filtered by a label selector.
    fn cache_keys(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<ObjectKey>, String>;
    /// The cached objects' JSON, filtered like [`Host::cache_keys`].
    fn cache_list(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<String>, String>;

    /// Records a Kubernetes event; never fails.
    fn record_event(
        &self,
        regarding: &ObjectRef,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    );
    /// Writes a structured log line to the host's log.
    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]);

    /// A configuration value from the plugin's `NAME.toml`.
    fn config(&self, key: &str) -> Option<String>;
    /// A secret value referenced in the plugin's `NAME.toml`, resolved by the host.
    fn secret(&self, key: &str) -> Option<String>;

    /// Updates one of the plugin's declared metrics (contract 0.3); the reason when refused.
    /// A host that keeps no metrics refuses every update.
    fn metric(
        &self,
        update: Update,
        name: &str,
        labels: &[&str],
        value: f64,
    ) -> Result<(), String> {
        let _ = (update, labels, value);
        Err(format!("this host keeps no metrics (metric {name:?})"))
    }

    /// Whether requests are sent over the component's own `wasi:http` imports (the real host)
    /// instead of through [`Host::http`]. Keeping that path out of the trait's vtable keeps
    /// `wasi:http` out of a component's imports unless the plugin sends a request.
    #[doc(hidden)]
    fn sends_over_wasi_http(&self) -> bool {
        false
    }

    /// Sends an HTTP request and reads the whole response. A host without outbound HTTP refuses
    /// every request. In a plugin, send with `ctx.http()`: the wasm host sends from there, and
    /// answers this method with an error that says so.
    fn http(&self, req: &HttpRequest) -> Result<HttpResponse, HttpError> {
        Err(HttpError::new(
            HttpErrorKind::Denied,
            format!(
                "this host has no outbound HTTP ({} {})",
                req.method, req.url
            ),
        ))
    }
}
