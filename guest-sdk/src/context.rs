//! What a reconcile gets to talk to the host with.

use std::any::{Any, TypeId};
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;

use kube_core::{ApiResource, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::Api;
use crate::cache::Cache;
use crate::host::Host;
use crate::http::Http;
use crate::metrics::Metrics;
use crate::reconcile::Error;
use crate::types::{EventType, Level, ObjectRef};

/// The handle a reconcile uses for everything outside the plugin: API calls ([`Context::api`]),
/// cache reads ([`Context::cache`]), events ([`Context::recorder`]), logs ([`Context::log`]) and
/// configuration ([`Context::config`]).
///
/// In the wasm build the host behind it is the real one; in tests it is a
/// [`MockHost`](crate::testing::MockHost). Cloning is cheap.
#[derive(Clone)]
pub struct Context {
    host: Rc<dyn Host>,
    /// What the plugin put in ([`Context::insert`]): its own clients and settings, replaced by
    /// fakes in tests (kube-rs's `Arc<Ctx>`).
    data: Vec<(TypeId, Rc<dyn Any>)>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// A context over any [`Host`] (tests pass a [`MockHost`](crate::testing::MockHost)).
    pub fn new(host: impl Host + 'static) -> Self {
        Context {
            host: Rc::new(host),
            data: Vec::new(),
        }
    }

    /// Puts a value of the plugin's own in the context (replacing one of the same type): a client
    /// of an outside API, parsed settings. [`Reconciler::setup`](crate::Reconciler::setup) puts
    /// the real ones in; a test replaces them with fakes through
    /// [`MockHost::inject`](crate::testing::MockHost::inject).
    pub fn insert<T: 'static>(&mut self, value: T) {
        self.insert_rc(Rc::new(value));
    }

    pub(crate) fn insert_rc(&mut self, value: Rc<dyn Any>) {
        let id = (*value).type_id();
        self.data.retain(|(t, _)| *t != id);
        self.data.push((id, value));
    }

    /// The value of type `T` put in with [`Context::insert`], if any.
    pub fn data<T: 'static>(&self) -> Option<&T> {
        self.data
            .iter()
            .find(|(t, _)| *t == TypeId::of::<T>())
            .and_then(|(_, v)| v.downcast_ref::<T>())
    }

    /// [`Context::data`], or a terminal error naming the missing type (a plugin whose `setup`
    /// did not put it in cannot work, however often it is retried).
    pub fn require<T: 'static>(&self) -> Result<&T, Error> {
        self.data::<T>().ok_or_else(|| {
            Error::terminal(format!(
                "the context holds no {}: put it in in Reconciler::setup",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The raw host calls, JSON text in and out: for what the typed wrappers do not cover (a body
    /// built as text, say, to avoid a copy of a large object).
    pub fn host(&self) -> &dyn Host {
        &*self.host
    }

    pub(crate) fn host_rc(&self) -> Rc<dyn Host> {
        self.host.clone()
    }

    /// API calls for a cluster-scoped kind, or for a namespaced kind across all namespaces
    /// (list only: single objects need [`Context::api_namespaced`]).
    pub fn api<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned>(&self) -> Api<K> {
        Api::new(self.host.clone(), ApiResource::erase::<K>(&()), None)
    }

    /// API calls for a namespaced kind in `namespace`.
    pub fn api_namespaced<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned>(
        &self,
        namespace: &str,
    ) -> Api<K> {
        Api::new(
            self.host.clone(),
            ApiResource::erase::<K>(&()),
            Some(namespace),
        )
    }

    /// [`Context::api`] for a kind known at run time, e.g.
    /// `ctx.api_with::<DynamicObject>(&ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network")))`.
    pub fn api_with<K: Resource + Serialize + DeserializeOwned>(
        &self,
        dt: &K::DynamicType,
    ) -> Api<K> {
        Api::new(self.host.clone(), ApiResource::erase::<K>(dt), None)
    }

    /// [`Context::api_namespaced`] for a kind known at run time.
    pub fn api_namespaced_with<K: Resource + Serialize + DeserializeOwned>(
        &self,
        namespace: &str,
        dt: &K::DynamicType,
    ) -> Api<K> {
        Api::new(
            self.host.clone(),
            ApiResource::erase::<K>(dt),
            Some(namespace),
        )
    }

    /// Cache reads of a watched kind.
    pub fn cache<K: Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Cache<K> {
        Cache::new(self.host.clone(), ApiResource::erase::<K>(&()))
    }

    /// [`Context::cache`] for a kind known at run time.
    pub fn cache_with<K: Resource + DeserializeOwned>(&self, dt: &K::DynamicType) -> Cache<K> {
        Cache::new(self.host.clone(), ApiResource::erase::<K>(dt))
    }

    /// The event recorder.
    pub fn recorder(&self) -> Recorder {
        Recorder {
            host: self.host.clone(),
        }
    }

    /// The HTTP client, for the hosts the plugin declares with
    /// [`Description::outbound_host`](crate::Description::outbound_host) and the operator allows.
    pub fn http(&self) -> Http {
        Http::new(self.host.clone())
    }

    /// The plugin's own metrics, as declared with
    /// [`Description::metric`](crate::Description::metric).
    pub fn metrics(&self) -> Metrics<'_> {
        Metrics {
            host: self.host.as_ref(),
        }
    }

    /// The plugin's logger (lines go to the host's log, tagged with the plugin's name). The
    /// [`info!`](crate::info) family of macros is shorter.
    pub fn log(&self) -> Logger {
        Logger {
            host: self.host.clone(),
        }
    }

    /// A configuration value from the `[config]` table of the plugin's `NAME.toml`.
    pub fn config(&self, key: &str) -> Option<String> {
        self.host.config(key)
    }

    /// A configuration value parsed as `T`; `None` when unset. A value that does not parse is a
    /// terminal error (the operator must fix `NAME.toml`).
    pub fn config_parse<T>(&self, key: &str) -> Result<Option<T>, Error>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.config(key)
            .map(|raw| {
                raw.trim()
                    .parse::<T>()
                    .map_err(|e| Error::terminal(format!("configuration {key:?} = {raw:?}: {e}")))
            })
            .transpose()
    }

    /// A secret value: the `[secrets]` table of `NAME.toml` names a Secret key, the host resolves it.
    pub fn secret(&self, key: &str) -> Option<String> {
        self.host.secret(key)
    }
}

/// Records Kubernetes events (events.k8s.io/v1). The host correlates repeats into series and
/// rate-limits them, so recording the same event on every reconcile is fine.
#[derive(Clone)]
pub struct Recorder {
    host: Rc<dyn Host>,
}

impl Recorder {
    /// Records an event about `regarding`. `reason` is a short UpperCamelCase word
    /// (`"SuccessCalculatePod"`), `action` what the plugin did (`"Count"`), `note` a sentence for
    /// people. Never fails and never blocks the reconcile.
    pub fn publish(
        &self,
        regarding: &ObjectRef,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.host
            .record_event(regarding, event_type, reason, action, note);
    }

    /// An event about `regarding` with `reason`, built field by field and sent by
    /// [`EventBuilder::publish`]: Normal unless [`EventBuilder::warning`], `action` and `note`
    /// empty unless set.
    ///
    /// ```
    /// # use wcm_sdk::{ObjectKey, ObjectRef, KindRef};
    /// # let host = wcm_sdk::testing::MockHost::new();
    /// # let ctx = host.context();
    /// let ns = ObjectRef::new(KindRef::new("", "v1", "Namespace"), ObjectKey::cluster("shop"));
    /// ctx.recorder().event(&ns, "TeamAssigned").action("Label").note("team platform").publish();
    /// assert_eq!(host.events()[0].action, "Label");
    /// ```
    pub fn event(&self, regarding: &ObjectRef, reason: &str) -> EventBuilder {
        EventBuilder {
            recorder: self.clone(),
            regarding: regarding.clone(),
            event_type: EventType::Normal,
            reason: reason.to_string(),
            action: String::new(),
            note: String::new(),
        }
    }
}

/// An event being built; see [`Recorder::event`].
#[must_use = "an event is recorded only by publish()"]
pub struct EventBuilder {
    recorder: Recorder,
    regarding: ObjectRef,
    event_type: EventType,
    reason: String,
    action: String,
    note: String,
}

impl EventBuilder {
    /// A Warning event (something an operator may need to look at).
    pub fn warning(mut self) -> Self {
        self.event_type = EventType::Warning;
        self
    }

    /// What the plugin did (`"Label"`, `"Create"`).
    pub fn action(mut self, action: &str) -> Self {
        self.action = action.to_string();
        self
    }

    /// A sentence for people.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// Records the event (never fails, never blocks the reconcile).
    pub fn publish(self) {
        self.recorder.publish(
            &self.regarding,
            self.event_type,
            &self.reason,
            &self.action,
            &self.note,
        );
    }
}

/// Structured logging to the host's log.
#[derive(Clone)]
pub struct Logger {
    host: Rc<dyn Host>,
}

impl Logger {
    /// A line at `level` with `key=value` fields.
    pub fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        self.host.log(level, message, fields);
    }

    /// A trace line.
    pub fn trace(&self, message: &str, fields: &[(&str, &str)]) {
        self.log(Level::Trace, message, fields);
    }

    /// A debug line.
    pub fn debug(&self, message: &str, fields: &[(&str, &str)]) {
        self.log(Level::Debug, message, fields);
    }

    /// An info line.
    pub fn info(&self, message: &str, fields: &[(&str, &str)]) {
        self.log(Level::Info, message, fields);
    }

    /// A warning line.
    pub fn warn(&self, message: &str, fields: &[(&str, &str)]) {
        self.log(Level::Warn, message, fields);
    }

    /// An error line.
    pub fn error(&self, message: &str, fields: &[(&str, &str)]) {
        self.log(Level::Error, message, fields);
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:expr, $ctx:expr, $fmt:literal $(, $arg:expr)* $(,)? ; $($key:expr => $value:expr),+ $(,)?) => {{
        let values = [$(($key, ::std::string::ToString::to_string(&$value))),+];
        let fields: ::std::vec::Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ($ctx).log().log($level, &::std::format!($fmt $(, $arg)*), &fields);
    }};
    ($level:expr, $ctx:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {
        ($ctx).log().log($level, &::std::format!($fmt $(, $arg)*), &[])
    };
}

/// Logs at trace level: `trace!(ctx, "format {}", args; "key" => value, ...)` (fields optional).
#[macro_export]
macro_rules! trace {
    ($ctx:expr, $($rest:tt)+) => { $crate::__log!($crate::Level::Trace, $ctx, $($rest)+) };
}

/// Logs at debug level: `debug!(ctx, "format {}", args; "key" => value, ...)` (fields optional).
#[macro_export]
macro_rules! debug {
    ($ctx:expr, $($rest:tt)+) => { $crate::__log!($crate::Level::Debug, $ctx, $($rest)+) };
}

/// Logs at info level: `info!(ctx, "counted {} pods", n; "node" => name)` (fields optional).
#[macro_export]
macro_rules! info {
    ($ctx:expr, $($rest:tt)+) => { $crate::__log!($crate::Level::Info, $ctx, $($rest)+) };
}

/// Logs at warn level: `warn!(ctx, "format {}", args; "key" => value, ...)` (fields optional).
#[macro_export]
macro_rules! warn {
    ($ctx:expr, $($rest:tt)+) => { $crate::__log!($crate::Level::Warn, $ctx, $($rest)+) };
}

/// Logs at error level: `error!(ctx, "format {}", args; "key" => value, ...)` (fields optional).
#[macro_export]
macro_rules! error {
    ($ctx:expr, $($rest:tt)+) => { $crate::__log!($crate::Level::Error, $ctx, $($rest)+) };
}
