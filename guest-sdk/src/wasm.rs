//! The wasm side: the real host behind the component imports, and the export glue that
//! [`export_plugin!`](crate::export_plugin) instantiates for a [`Reconciler`].

use crate::bindings::exports::wcm::reconciler::reconciler as export;
use crate::bindings::wcm::reconciler::{cache, client, config, events, log, metrics, types as wit};
use crate::describe::{Description, Mapping, Watch};
use crate::host::Host;
use crate::metrics::{MetricKind, Update};
use crate::params::{DeleteParams, ListParams, PatchParams, Propagation};
use crate::reconcile::{Action, Error, Reconciler, Request};
use crate::types::{ApiError, EventType, KindRef, Level, ObjectKey, ObjectRef, PatchType};
use crate::{__private::Component, Context};

/// The host behind the component's imports.
pub(crate) struct WasmHost;

fn kind(k: &KindRef) -> wit::KindRef {
    wit::KindRef {
        group: k.group.clone(),
        version: k.version.clone(),
        kind: k.kind.clone(),
    }
}

fn key(k: &ObjectKey) -> wit::ObjectKey {
    wit::ObjectKey {
        namespace: k.namespace.clone(),
        name: k.name.clone(),
    }
}

fn api_error(e: wit::ApiError) -> ApiError {
    ApiError {
        code: e.code,
        reason: e.reason,
        message: e.message,
    }
}

fn patch_type(p: PatchType) -> client::PatchType {
    match p {
        PatchType::Merge => client::PatchType::Merge,
        PatchType::Json => client::PatchType::Json,
        PatchType::Strategic => client::PatchType::Strategic,
        PatchType::Apply => client::PatchType::Apply,
    }
}

fn patch_options(p: &PatchParams) -> client::PatchOptions {
    client::PatchOptions {
        field_manager_suffix: p.field_manager_suffix.clone(),
        force: p.force,
        dry_run: p.dry_run,
    }
}

impl Host for WasmHost {
    fn get(&self, k: &KindRef, o: &ObjectKey) -> Result<String, ApiError> {
        client::get(&kind(k), &key(o)).map_err(api_error)
    }

    fn list(
        &self,
        k: &KindRef,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<String, ApiError> {
        let options = client::ListOptions {
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            limit: params.limit,
            continue_token: params.continue_token.clone(),
        };
        client::list(&kind(k), namespace, &options).map_err(api_error)
    }

    fn create(&self, k: &KindRef, namespace: Option<&str>, body: &str) -> Result<String, ApiError> {
        client::create(&kind(k), namespace, body).map_err(api_error)
    }

    fn replace(&self, k: &KindRef, o: &ObjectKey, body: &str) -> Result<String, ApiError> {
        client::replace(&kind(k), &key(o), body).map_err(api_error)
    }

    fn patch(
        &self,
        k: &KindRef,
        o: &ObjectKey,
        p: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError> {
        client::patch(
            &kind(k),
            &key(o),
            patch_type(p),
            body,
            &patch_options(params),
        )
        .map_err(api_error)
    }

    fn patch_status(
        &self,
        k: &KindRef,
        o: &ObjectKey,
        p: PatchType,
        body: &str,
        params: &PatchParams,
    ) -> Result<String, ApiError> {
        client::patch_status(
            &kind(k),
            &key(o),
            patch_type(p),
            body,
            &patch_options(params),
        )
        .map_err(api_error)
    }

    fn delete(&self, k: &KindRef, o: &ObjectKey, params: &DeleteParams) -> Result<(), ApiError> {
        let options = client::DeleteOptions {
            propagation: params.propagation.map(|p| match p {
                Propagation::Background => client::Propagation::Background,
                Propagation::Foreground => client::Propagation::Foreground,
                Propagation::Orphan => client::Propagation::Orphan,
            }),
            precondition_uid: params.precondition_uid.clone(),
            precondition_resource_version: params.precondition_resource_version.clone(),
            dry_run: params.dry_run,
        };
        client::delete(&kind(k), &key(o), &options).map_err(api_error)
    }

    fn cache_get(&self, k: &KindRef, o: &ObjectKey) -> Option<String> {
        cache::get(&kind(k), &key(o))
    }

    fn cache_keys(
        &self,
        k: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<ObjectKey>, String> {
        let keys = cache::keys(&kind(k), namespace, label_selector)?;
        Ok(keys
            .into_iter()
            .map(|k| ObjectKey {
                namespace: k.namespace,
                name: k.name,
            })
            .collect())
    }

    fn cache_list(
        &self,
        k: &KindRef,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<String>, String> {
        cache::list(&kind(k), namespace, label_selector)
    }

    fn record_event(
        &self,
        regarding: &ObjectRef,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let regarding = events::ObjectRef {
            kind: kind(&regarding.kind),
            key: key(&regarding.key),
            uid: regarding.uid.clone(),
        };
        let event_type = match event_type {
            EventType::Normal => events::EventType::Normal,
            EventType::Warning => events::EventType::Warning,
        };
        events::record(&regarding, event_type, reason, action, note);
    }

    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        let level = match level {
            Level::Trace => log::Level::Trace,
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        log::log(level, message, &fields);
    }

    fn config(&self, k: &str) -> Option<String> {
        config::get(k)
    }

    fn secret(&self, k: &str) -> Option<String> {
        config::secret(k)
    }

    fn metric(
        &self,
        update: Update,
        name: &str,
        labels: &[&str],
        value: f64,
    ) -> Result<(), String> {
        let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        match update {
            Update::Add => metrics::add(name, &labels, value),
            Update::Set => metrics::set(name, &labels, value),
            Update::Observe => metrics::observe(name, &labels, value),
        }
    }

    fn sends_over_wasi_http(&self) -> bool {
        true
    }

    // Not `wasm_http::send` here: a vtable entry would import wasi:http into every plugin.
    fn http(
        &self,
        req: &crate::http::HttpRequest,
    ) -> Result<crate::http::HttpResponse, crate::http::HttpError> {
        Err(crate::http::HttpError::new(
            crate::http::HttpErrorKind::InvalidRequest,
            format!(
                "send HTTP requests with ctx.http() (...).send(), not Host::http ({} {})",
                req.method,
                crate::http::shorten(&req.url)
            ),
        ))
    }
}

fn watch(w: Watch) -> wit::Watch {
    wit::Watch {
        kind: kind(&w.kind),
        namespace: w.namespace,
        label_selector: w.label_selector,
        metadata_only: w.metadata_only,
    }
}

fn description(d: Description) -> wit::Description {
    let mut extensions = d.extensions.clone();
    for derived in [d.change_filters_extension(), d.mappings_extension()]
        .into_iter()
        .flatten()
    {
        extensions.retain(|(k, _)| *k != derived.0);
        extensions.push(derived);
    }
    wit::Description {
        name: d.name,
        version: d.version,
        // A missing primary watch goes out as an empty kind, which the host refuses at load time
        // with a message naming the plugin (describe itself has no way to fail).
        primary: watch(
            d.primary
                .unwrap_or_else(|| Watch::kind(KindRef::new("", "", ""))),
        ),
        secondaries: d
            .secondaries
            .into_iter()
            .map(|s| wit::Secondary {
                watch: watch(s.watch),
                mapping: match s.mapping {
                    // The extended mappings travel in the `mappings` extension; the 0.1 field
                    // holds what a host that predates it should do instead.
                    Mapping::ControllerOwner | Mapping::AnyOwner => wit::Mapping::ControllerOwner,
                    Mapping::FixedKey(k) => wit::Mapping::FixedKey(key(&k)),
                    Mapping::SameKey | Mapping::Label(_) => wit::Mapping::SameKey,
                },
            })
            .collect(),
        resync_seconds: d.resync_seconds,
        workers: d.workers,
        permissions: d
            .permissions
            .into_iter()
            .map(|p| wit::Permission {
                group: p.group,
                resource: p.resource,
                verbs: p.verbs,
            })
            .collect(),
        outbound_hosts: d.outbound_hosts,
        config_keys: d.config_keys,
        extensions,
        schedules: d
            .schedules
            .into_iter()
            .map(|s| wit::Schedule {
                name: s.name,
                cron: s.cron,
                time_zone: s.time_zone,
                key: s.key.as_ref().map(key),
                jitter_seconds: s.jitter_seconds,
                catch_up_seconds: s.catch_up_seconds,
            })
            .collect(),
        metrics: d
            .metrics
            .into_iter()
            .map(|m| wit::Metric {
                name: m.name,
                help: m.help,
                kind: match m.kind {
                    MetricKind::Counter => wit::MetricKind::Counter,
                    MetricKind::Gauge => wit::MetricKind::Gauge,
                    MetricKind::Histogram => wit::MetricKind::Histogram,
                },
                labels: m.labels,
                buckets: m.buckets,
            })
            .collect(),
        propagate_trace_context: d.propagate_trace_context,
    }
}

fn outcome(mut a: Action) -> wit::Outcome {
    let children = a.take_children().map(|children| {
        children
            .into_iter()
            .map(|c| wit::Child {
                kind: kind(&c.kind),
                object: c.object,
                force: c.force,
            })
            .collect()
    });
    let action = match a.requeue_after() {
        None => wit::Action::Done,
        Some(after) => {
            wit::Action::RequeueAfter(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
        }
    };
    wit::Outcome { action, children }
}

fn reconcile_error(e: Error) -> wit::ReconcileError {
    wit::ReconcileError {
        terminal: e.is_terminal(),
        message: e.message().to_string(),
        retry_after_ms: e
            .retry_after_delay()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

impl<R: Reconciler> export::Guest for Component<R> {
    fn describe() -> wit::Description {
        description(R::describe())
    }

    fn reconcile(req: wit::Request) -> Result<wit::Outcome, wit::ReconcileError> {
        let mut ctx = Context::new(WasmHost);
        if let Err(e) = R::setup(&mut ctx) {
            return Err(reconcile_error(e));
        }
        let req = Request {
            key: ObjectKey {
                namespace: req.key.namespace,
                name: req.key.name,
            },
            object: req.object,
            attempt: req.attempt,
            scheduled: req.scheduled,
        };
        let _log = crate::logging::enter(ctx.host_rc());
        R::reconcile(&ctx, req)
            .map(outcome)
            .map_err(reconcile_error)
    }
}
