//! The host functions a plugin imports. Each call is counted and size-checked first (breaking a
//! limit traps the plugin), and its time is given back to the plugin's CPU deadline.

use super::call_ctx::CallCtx;
use crate::cluster::api::{ApiFailure, ApiRequest, PatchKind, Verb};
use crate::cluster::events::PluginEvent;
use crate::cluster::services::store_key;
use crate::contract::validate;
use crate::contract::wcm::reconciler::{cache, client, config, events, log, types};
use crate::contract::{ApiError, KindKey, KindRef, ObjectKey};
use crate::selector::Selector;

/// The API server keeps at most 1 kB of an event's note.
const MAX_NOTE: usize = 1024;
/// Bytes of a log message or field value kept; fields kept per line.
const MAX_LOG_TEXT: usize = 4096;
const MAX_LOG_FIELDS: usize = 32;

impl types::Host for CallCtx {}

impl From<ApiFailure> for ApiError {
    fn from(f: ApiFailure) -> Self {
        ApiError {
            code: f.code,
            reason: f.reason,
            message: f.message,
        }
    }
}

impl CallCtx {
    async fn api(
        &mut self,
        what: &str,
        req: ApiRequest<'_>,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        self.admit(
            what,
            [req.body, req.name, req.namespace].map(|s| s.map_or(0, str::len)),
        )?;
        // An empty namespace is no namespace (all namespaces, or a cluster-scoped kind).
        let req = ApiRequest {
            namespace: req.namespace.filter(|ns| !ns.is_empty()),
            ..req
        };
        // Tests make this panic to prove a host-side bug costs one retry, not a worker.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("host-api-call");
        let services = self.services.clone();
        let out = services.api_call(&req).await;
        Ok(out.map_err(ApiError::from))
    }
}

/// An API request on one object, or on a collection when `name` is None.
fn req<'a>(
    verb: Verb,
    kind: &'a KindRef,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    body: Option<&'a str>,
) -> ApiRequest<'a> {
    ApiRequest {
        verb,
        kind,
        namespace,
        name,
        subresource: None,
        body,
    }
}

impl client::Host for CallCtx {
    async fn get(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        self.api(
            "client.get",
            req(
                Verb::Get,
                &kind,
                key.namespace.as_deref(),
                Some(&key.name),
                None,
            ),
        )
        .await
    }

    async fn list(
        &mut self,
        kind: KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        // The selector travels in the body slot of the shared call path.
        self.api(
            "client.list",
            req(
                Verb::List,
                &kind,
                namespace.as_deref(),
                None,
                label_selector.as_deref(),
            ),
        )
        .await
    }

    async fn create(
        &mut self,
        kind: KindRef,
        namespace: Option<String>,
        body: String,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        self.api(
            "client.create",
            req(Verb::Create, &kind, namespace.as_deref(), None, Some(&body)),
        )
        .await
    }

    async fn replace(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
        body: String,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        self.api(
            "client.replace",
            req(
                Verb::Update,
                &kind,
                key.namespace.as_deref(),
                Some(&key.name),
                Some(&body),
            ),
        )
        .await
    }

    async fn patch(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
        patch_type: client::PatchType,
        body: String,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let verb = Verb::Patch(PatchKind::from(patch_type));
        self.api(
            "client.patch",
            req(
                verb,
                &kind,
                key.namespace.as_deref(),
                Some(&key.name),
                Some(&body),
            ),
        )
        .await
    }

    async fn patch_status(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
        patch_type: client::PatchType,
        body: String,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let verb = Verb::Patch(PatchKind::from(patch_type));
        self.api(
            "client.patch-status",
            ApiRequest {
                subresource: Some("status"),
                ..req(
                    verb,
                    &kind,
                    key.namespace.as_deref(),
                    Some(&key.name),
                    Some(&body),
                )
            },
        )
        .await
    }

    async fn delete(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
    ) -> wasmtime::Result<Result<(), ApiError>> {
        let out = self
            .api(
                "client.delete",
                req(
                    Verb::Delete,
                    &kind,
                    key.namespace.as_deref(),
                    Some(&key.name),
                    None,
                ),
            )
            .await?;
        Ok(out.map(|_| ()))
    }
}

impl cache::Host for CallCtx {
    async fn get(&mut self, kind: KindRef, key: ObjectKey) -> wasmtime::Result<Option<String>> {
        self.admit("cache.get", [key.name.len()])?;
        if let Err(e) = validate::kind(&kind).and_then(|_| validate::object_key(&key)) {
            self.services.invalid_call("cache.get", &e);
            return Ok(None);
        }
        let stores = self.services.cache_stores(&kind);
        if stores.is_empty() {
            self.services.warn(format_args!(
                "cache.get of {}, a kind the plugin does not watch",
                KindKey::from(&kind)
            ));
            return Ok(None);
        }
        let key = store_key(&key);
        Ok(stores
            .iter()
            .find_map(|s| s.get(&key))
            .map(|o| o.json.to_string()))
    }

    async fn keys(
        &mut self,
        kind: KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<ObjectKey>, String>> {
        self.admit(
            "cache.keys",
            [label_selector.as_ref().map_or(0, String::len)],
        )?;
        Ok(self
            .select(&kind, namespace.as_deref(), label_selector.as_deref())
            .map(|objs| {
                objs.iter()
                    .map(|o| ObjectKey {
                        namespace: o.key.namespace.clone(),
                        name: o.key.name.clone(),
                    })
                    .collect()
            }))
    }

    async fn list(
        &mut self,
        kind: KindRef,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<String>, String>> {
        self.admit(
            "cache.list",
            [label_selector.as_ref().map_or(0, String::len)],
        )?;
        Ok(self
            .select(&kind, namespace.as_deref(), label_selector.as_deref())
            .map(|objs| objs.iter().map(|o| o.json.to_string()).collect()))
    }
}

impl CallCtx {
    fn select(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: Option<&str>,
    ) -> Result<Vec<std::sync::Arc<crate::engine::cache::CachedObject>>, String> {
        // As for API calls: an empty namespace is all namespaces.
        let namespace = namespace.filter(|ns| !ns.is_empty());
        let checked = validate::kind(kind)
            .and_then(|_| namespace.map_or(Ok(()), validate::namespace))
            .and_then(|_| selector.map_or(Ok(()), validate::label_selector));
        if let Err(e) = checked {
            self.services.invalid_call("cache.list", &e);
            return Err(e.to_string());
        }
        let stores = self.services.cache_stores(kind);
        if stores.is_empty() {
            return Err(format!(
                "{} is not watched by this plugin: declare it in describe to read it from the cache",
                KindKey::from(kind)
            ));
        }
        let selector = Selector::parse(selector.unwrap_or(""))?;
        if let [one] = stores.as_slice() {
            return Ok(one.select(namespace, &selector));
        }
        // Several watches of the kind: each object once, in key order.
        let mut union = std::collections::BTreeMap::new();
        for s in stores {
            for o in s.select(namespace, &selector) {
                union.entry(o.key.clone()).or_insert(o);
            }
        }
        Ok(union.into_values().collect())
    }
}

impl events::Host for CallCtx {
    async fn record(
        &mut self,
        regarding: events::ObjectRef,
        event_type: events::EventType,
        reason: String,
        action: String,
        note: String,
    ) -> wasmtime::Result<()> {
        self.admit("events.record", [reason.len(), action.len(), note.len()])?;
        let k = regarding.kind;
        let event = PluginEvent {
            api_version: KindKey::from(&k).api_version(),
            kind: k.kind.clone(),
            namespace: regarding.key.namespace.filter(|ns| !ns.is_empty()),
            name: regarding.key.name,
            uid: regarding.uid,
            warning: matches!(event_type, events::EventType::Warning),
            reason,
            action,
            // The API server keeps at most 1 kB of a note.
            note: validate::truncate(&note, MAX_NOTE).to_string(),
        };
        self.services.record_event(event, &k);
        Ok(())
    }
}

impl log::Host for CallCtx {
    async fn log(
        &mut self,
        level: log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let fields_size: usize = fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.admit("log.log", [message.len(), fields_size])?;
        if !self.services.budgets.log_line() {
            return Ok(());
        }
        let plugin = self.services.plugin_name();
        // One line per call whatever the guest sent: control characters escaped, lengths cut.
        let message = validate::log_text(&message, MAX_LOG_TEXT);
        let fields = fields
            .iter()
            .take(MAX_LOG_FIELDS)
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    validate::log_text(k, 64),
                    validate::log_text(v, MAX_LOG_TEXT)
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        match level {
            log::Level::Trace => tracing::trace!(plugin, fields, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, fields, "{message}"),
            log::Level::Info => tracing::info!(plugin, fields, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, fields, "{message}"),
            log::Level::Error => tracing::error!(plugin, fields, "{message}"),
        }
        Ok(())
    }
}

impl config::Host for CallCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        self.admit("config.get", [key.len()])?;
        Ok(self.services.config.get(&key).cloned())
    }

    async fn secret(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        self.admit("config.secret", [key.len()])?;
        Ok(self.services.secret(&key).cloned())
    }
}
