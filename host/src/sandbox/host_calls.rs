//! The host functions a plugin imports. Each call is counted and size-checked first (breaking a
//! limit traps the plugin), and its time is given back to the plugin's CPU deadline.

use super::call_ctx::CallCtx;
use crate::cluster::api::{ApiFailure, ApiRequest, CallOptions, PatchKind, Verb};
use crate::cluster::events::PluginEvent;
use crate::cluster::services::store_key;
use crate::contract::validate;
use crate::contract::wcm::reconciler::{cache, client, config, events, log, metrics, types};
use crate::contract::{ApiError, KindKey, KindRef, ObjectKey};
use crate::plugin_metrics::Update;
use crate::selector::Selector;
use serde_json::{Value, json};

/// The API server keeps at most 1 kB of an event's note.
const MAX_NOTE: usize = 1024;
/// Bytes of a log message or field value kept; fields kept per line.
const MAX_LOG_TEXT: usize = 4096;
const MAX_LOG_FIELDS: usize = 32;

impl types::Host for CallCtx {}

/// A child span of the reconcile for a host call that makes no API request (exported only with
/// --otlp-endpoint); the kind the plugin named is escaped and cut short.
fn host_span(call: &'static str, kind: &KindRef) -> tracing::Span {
    tracing::info_span!(
        target: crate::telemetry::TARGET,
        "host-call",
        otel.name = call,
        wcm.call = call,
        k8s.kind = %validate::log_text(&kind.kind, 63),
    )
}

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
        let o = req.options;
        // Every string from the guest counts, the options' too (they become query parameters).
        self.admit(
            what,
            [
                req.body,
                req.name,
                req.namespace,
                o.field_selector.as_deref(),
                o.continue_token.as_deref(),
                o.field_manager_suffix.as_deref(),
                o.precondition_uid.as_deref(),
                o.precondition_resource_version.as_deref(),
            ]
            .map(|s| s.map_or(0, str::len)),
        )?;
        // An empty namespace is no namespace (all namespaces, or a cluster-scoped kind).
        let req = ApiRequest {
            namespace: req.namespace.filter(|ns| !ns.is_empty()),
            ..req
        };
        let mut args = json!({
            "verb": format!("{:?}", req.verb),
            "kind": kind_json(req.kind),
            "namespace": req.namespace,
            "name": req.name,
            "subresource": req.subresource,
            "body": req.body,
        });
        // Only what differs from what the call meant before options existed (server-side apply
        // was always forced): recordings of such calls read as before.
        let implied = CallOptions {
            force: req.verb == Verb::Patch(PatchKind::Apply),
            ..CallOptions::default()
        };
        if *req.options != implied {
            let mut options = options_json(req.options);
            if implied.force && !req.options.force {
                options["force"] = json!(false);
            }
            args["options"] = options;
        }
        if let Some(answer) = self.replayed(what, &args) {
            return Ok(api_result_from_json(&answer));
        }
        // Tests make this panic to prove a host-side bug costs one retry, not a worker.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("host-api-call");
        let services = self.services.clone();
        // A child span of the reconcile (exported only with --otlp-endpoint); what the plugin
        // named is escaped and cut short.
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "api",
            otel.name = %format!("{} {}", req.verb.as_str(), validate::log_text(&req.kind.kind, 63)),
            otel.kind = "client",
            wcm.call = what,
            k8s.api_version = %validate::log_text(&KindKey::from(req.kind).api_version(), 128),
            k8s.namespace.name = %validate::log_text(req.namespace.unwrap_or(""), 63),
            k8s.object.name = %validate::log_text(req.name.unwrap_or(""), 253),
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let out = tracing::Instrument::instrument(services.api_call(&req), span.clone())
            .await
            .map_err(ApiError::from);
        if let Err(e) = &out {
            span.record("http.response.status_code", e.code);
            span.record("otel.status_code", "ERROR");
        } else {
            span.record("http.response.status_code", 200);
        }
        self.taped(what, args, || api_result_json(&out));
        Ok(out)
    }

    /// Replaying: the recorded answer to this call.
    pub(super) fn replayed(&mut self, call: &str, args: &Value) -> Option<Value> {
        self.tape.as_mut()?.answer(call, args)
    }

    /// Recording: notes the call and its answer (made only when recording).
    pub(super) fn taped(&mut self, call: &str, args: Value, answer: impl FnOnce() -> Value) {
        if let Some(tape) = self.tape.as_mut() {
            tape.note(call, args, answer());
        }
    }
}

/// The options that are set, as JSON (for recordings).
fn options_json(o: &CallOptions) -> Value {
    let mut v = serde_json::Map::new();
    let mut put = |k: &str, x: Value| {
        if !x.is_null() && x != Value::Bool(false) {
            v.insert(k.to_string(), x);
        }
    };
    put("fieldSelector", json!(o.field_selector));
    put("limit", json!(o.limit));
    put("continue", json!(o.continue_token));
    put("fieldManagerSuffix", json!(o.field_manager_suffix));
    put("force", json!(o.force));
    put("dryRun", json!(o.dry_run));
    put(
        "propagation",
        json!(o.propagation.map(|p| format!("{p:?}"))),
    );
    put("preconditionUid", json!(o.precondition_uid));
    put(
        "preconditionResourceVersion",
        json!(o.precondition_resource_version),
    );
    Value::Object(v)
}

fn kind_json(k: &KindRef) -> Value {
    json!({"group": k.group, "version": k.version, "kind": k.kind})
}

fn key_json(k: &ObjectKey) -> Value {
    json!({"namespace": k.namespace, "name": k.name})
}

fn api_result_json(r: &Result<String, ApiError>) -> Value {
    match r {
        Ok(body) => json!({"ok": body}),
        Err(e) => json!({"error": {"code": e.code, "reason": e.reason, "message": e.message}}),
    }
}

/// A recorded API answer; one missing from the recording is an error the plugin can see.
fn api_result_from_json(v: &Value) -> Result<String, ApiError> {
    if let Some(body) = v.get("ok").and_then(Value::as_str) {
        return Ok(body.to_string());
    }
    let e = &v["error"];
    match (
        e["code"].as_u64(),
        e["reason"].as_str(),
        e["message"].as_str(),
    ) {
        (Some(code), Some(reason), Some(message)) => Err(ApiError {
            code: u16::try_from(code).unwrap_or(0),
            reason: reason.to_string(),
            message: message.to_string(),
        }),
        _ => Err(ApiError {
            code: 0,
            reason: "NotRecorded".into(),
            message: "this call is not in the recording".into(),
        }),
    }
}

/// Keys as `Key` displays them back into keys: a namespace or a name never holds '/', so
/// "ns/name" splits unambiguously.
fn object_keys(keys: &[String]) -> Vec<ObjectKey> {
    keys.iter()
        .map(|k| match k.split_once('/') {
            Some((ns, name)) => ObjectKey {
                namespace: Some(ns.to_string()),
                name: name.to_string(),
            },
            None => ObjectKey {
                namespace: None,
                name: k.clone(),
            },
        })
        .collect()
}

fn strings_json(r: &Result<Vec<String>, String>) -> Value {
    match r {
        Ok(v) => json!({"ok": v}),
        Err(e) => json!({"error": e}),
    }
}

fn strings_from_json(v: &Value) -> Result<Vec<String>, String> {
    match v.get("ok") {
        Some(ok) => serde_json::from_value(ok.clone()).map_err(|e| e.to_string()),
        None => Err(v["error"]
            .as_str()
            .unwrap_or("this call is not in the recording")
            .to_string()),
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
        options: CallOptions::NONE,
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
        options: client::ListOptions,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let call = CallOptions {
            field_selector: options.field_selector,
            limit: options.limit,
            continue_token: options.continue_token,
            ..CallOptions::default()
        };
        // The label selector travels in the body slot of the shared call path.
        self.api(
            "client.list",
            ApiRequest {
                options: &call,
                ..req(
                    Verb::List,
                    &kind,
                    namespace.as_deref(),
                    None,
                    options.label_selector.as_deref(),
                )
            },
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
        options: client::PatchOptions,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        self.patch_call("client.patch", None, kind, key, patch_type, body, options)
            .await
    }

    async fn patch_status(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
        patch_type: client::PatchType,
        body: String,
        options: client::PatchOptions,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let status = Some("status");
        self.patch_call(
            "client.patch-status",
            status,
            kind,
            key,
            patch_type,
            body,
            options,
        )
        .await
    }

    async fn delete(
        &mut self,
        kind: KindRef,
        key: ObjectKey,
        options: client::DeleteOptions,
    ) -> wasmtime::Result<Result<(), ApiError>> {
        let call = CallOptions {
            propagation: options.propagation,
            precondition_uid: options.precondition_uid,
            precondition_resource_version: options.precondition_resource_version,
            dry_run: options.dry_run,
            ..CallOptions::default()
        };
        let out = self
            .api(
                "client.delete",
                ApiRequest {
                    options: &call,
                    ..req(
                        Verb::Delete,
                        &kind,
                        key.namespace.as_deref(),
                        Some(&key.name),
                        None,
                    )
                },
            )
            .await?;
        Ok(out.map(|_| ()))
    }
}

impl CallCtx {
    /// A patch of the object or of one of its subresources.
    #[allow(clippy::too_many_arguments)]
    async fn patch_call(
        &mut self,
        what: &str,
        subresource: Option<&str>,
        kind: KindRef,
        key: ObjectKey,
        patch_type: client::PatchType,
        body: String,
        options: client::PatchOptions,
    ) -> wasmtime::Result<Result<String, ApiError>> {
        let verb = Verb::Patch(PatchKind::from(patch_type));
        let call = patch_options(options);
        let name = Some(key.name.as_str());
        let request = req(verb, &kind, key.namespace.as_deref(), name, Some(&body));
        self.api(
            what,
            ApiRequest {
                subresource,
                options: &call,
                ..request
            },
        )
        .await
    }
}

fn patch_options(o: client::PatchOptions) -> CallOptions {
    CallOptions {
        field_manager_suffix: o.field_manager_suffix,
        force: o.force,
        dry_run: o.dry_run,
        ..CallOptions::default()
    }
}

impl cache::Host for CallCtx {
    async fn get(&mut self, kind: KindRef, key: ObjectKey) -> wasmtime::Result<Option<String>> {
        self.admit("cache.get", [key.name.len()])?;
        let args = json!({"kind": kind_json(&kind), "key": key_json(&key)});
        if let Some(answer) = self.replayed("cache.get", &args) {
            return Ok(answer.as_str().map(str::to_string));
        }
        let _span = host_span("cache.get", &kind).entered();
        let out = self.cache_get(kind, key);
        self.taped("cache.get", args, || json!(out));
        Ok(out)
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
        let args =
            json!({"kind": kind_json(&kind), "namespace": namespace, "selector": label_selector});
        if let Some(answer) = self.replayed("cache.keys", &args) {
            return Ok(strings_from_json(&answer).map(|keys| object_keys(&keys)));
        }
        let _span = host_span("cache.keys", &kind).entered();
        let out = self
            .select(&kind, namespace.as_deref(), label_selector.as_deref())
            .map(|objs| objs.iter().map(|o| o.key.to_string()).collect());
        self.taped("cache.keys", args, || strings_json(&out));
        Ok(out.map(|keys: Vec<String>| object_keys(&keys)))
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
        let args =
            json!({"kind": kind_json(&kind), "namespace": namespace, "selector": label_selector});
        if let Some(answer) = self.replayed("cache.list", &args) {
            return Ok(strings_from_json(&answer));
        }
        let _span = host_span("cache.list", &kind).entered();
        let out = self
            .select(&kind, namespace.as_deref(), label_selector.as_deref())
            .map(|objs| objs.iter().map(|o| o.json.to_string()).collect());
        self.taped("cache.list", args, || strings_json(&out));
        Ok(out)
    }
}

impl CallCtx {
    fn cache_get(&mut self, kind: KindRef, key: ObjectKey) -> Option<String> {
        if let Err(e) = validate::kind(&kind).and_then(|_| validate::object_key(&key)) {
            self.services.invalid_call("cache.get", &e);
            return None;
        }
        let stores = self.services.cache_stores(&kind);
        if stores.is_empty() {
            self.services.warn(format_args!(
                "cache.get of {}, a kind the plugin does not watch",
                KindKey::from(&kind)
            ));
            return None;
        }
        let key = store_key(&key);
        stores
            .iter()
            .find_map(|s| s.get(&key))
            .map(|o| o.json.to_string())
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
        if self.tape.is_some() {
            let args = json!({
                "regarding": {"kind": kind_json(&regarding.kind), "key": key_json(&regarding.key), "uid": regarding.uid},
                "type": format!("{event_type:?}"),
                "reason": reason,
                "action": action,
                "note": note,
            });
            let replaying = self.tape.as_ref().is_some_and(|t| t.is_replaying());
            self.taped("events.record", args, || Value::Null);
            if replaying {
                return Ok(());
            }
        }
        let k = regarding.kind;
        let _span = host_span("events.record", &k).entered();
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
        if let Some(tape) = &self.tape {
            // Recorded even when the budget drops the line (a replay compares it), but cut as the
            // line is, and only its level when the plugin holds secrets.
            let args = crate::sandbox::tape::log_args(
                &format!("{level:?}"),
                &message,
                &fields,
                tape.withholds_free_text(),
            );
            self.taped("log.log", args, || Value::Null);
        }
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
        // The key comes from the host (the object being reconciled), not from the guest.
        let key = self.key.as_str();
        match level {
            log::Level::Trace => tracing::trace!(plugin, key, fields, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, key, fields, "{message}"),
            log::Level::Info => tracing::info!(plugin, key, fields, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, key, fields, "{message}"),
            log::Level::Error => tracing::error!(plugin, key, fields, "{message}"),
        }
        Ok(())
    }
}

impl config::Host for CallCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        self.admit("config.get", [key.len()])?;
        let args = json!({"key": key});
        if let Some(answer) = self.replayed("config.get", &args) {
            return Ok(answer.as_str().map(str::to_string));
        }
        let out = self.services.config.get(&key).cloned();
        self.taped("config.get", args, || json!(out));
        Ok(out)
    }

    async fn secret(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        self.admit("config.secret", [key.len()])?;
        let args = json!({"key": key});
        // A secret value is never written to a recording: only whether there was one, as a
        // placeholder naming the setting (made from nothing of the value); a replay hands it.
        if let Some(answer) = self.replayed("config.secret", &args) {
            return Ok(answer
                .get("placeholder")
                .and_then(Value::as_str)
                .map(str::to_string));
        }
        let out = self.services.secret(&key).cloned();
        self.taped("config.secret", args, || match &out {
            Some(_) => json!({"placeholder": crate::sandbox::tape::secret_placeholder(&key)}),
            None => Value::Null,
        });
        Ok(out)
    }
}

impl CallCtx {
    /// A metric update: checked against the plugin's declarations and series budget
    /// (`plugin_metrics.rs`), recorded, and in a replay answered from the recording.
    fn metric(
        &mut self,
        update: Update,
        what: &str,
        name: String,
        labels: Vec<String>,
        value: f64,
    ) -> wasmtime::Result<Result<(), String>> {
        let size = name.len() + labels.iter().map(String::len).sum::<usize>();
        self.admit(what, [size])?;
        let args = json!({"name": name, "labels": labels, "value": value});
        if let Some(answer) = self.replayed(what, &args) {
            return Ok(match answer.get("refused").and_then(Value::as_str) {
                Some(why) => Err(why.to_string()),
                None => Ok(()),
            });
        }
        let out = match self.services.plugin_metrics() {
            Some(m) => m.update(update, &name, &labels, value),
            None => Err(format!(
                "metric {} is not declared (the plugin declares no metrics)",
                validate::shown(&name)
            )),
        };
        self.taped(what, args, || match &out {
            Ok(()) => json!({}),
            Err(why) => json!({"refused": why}),
        });
        Ok(out)
    }
}

impl metrics::Host for CallCtx {
    async fn add(
        &mut self,
        name: String,
        labels: Vec<String>,
        value: f64,
    ) -> wasmtime::Result<Result<(), String>> {
        self.metric(Update::Add, "metrics.add", name, labels, value)
    }

    async fn set(
        &mut self,
        name: String,
        labels: Vec<String>,
        value: f64,
    ) -> wasmtime::Result<Result<(), String>> {
        self.metric(Update::Set, "metrics.set", name, labels, value)
    }

    async fn observe(
        &mut self,
        name: String,
        labels: Vec<String>,
        value: f64,
    ) -> wasmtime::Result<Result<(), String>> {
        self.metric(Update::Observe, "metrics.observe", name, labels, value)
    }
}
