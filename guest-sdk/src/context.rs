//! What a reconcile gets to talk to the host with.

use std::fmt;
use std::rc::Rc;
use std::str::FromStr;

use crate::api::Api;
use crate::cache::Cache;
use crate::host::Host;
use crate::http::Http;
use crate::reconcile::Error;
use crate::resource::Resource;
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
        }
    }

    /// The raw host calls, JSON text in and out: for what the typed wrappers do not cover (a body
    /// built as text, say, to avoid a copy of a large object).
    pub fn host(&self) -> &dyn Host {
        &*self.host
    }

    /// API calls for a cluster-scoped kind, or for a namespaced kind across all namespaces
    /// (list only: single objects need [`Context::api_namespaced`]).
    pub fn api<K: Resource<DynamicType = ()>>(&self) -> Api<K> {
        Api::new(self.host.clone(), K::api_resource(&()), None)
    }

    /// API calls for a namespaced kind in `namespace`.
    pub fn api_namespaced<K: Resource<DynamicType = ()>>(&self, namespace: &str) -> Api<K> {
        Api::new(self.host.clone(), K::api_resource(&()), Some(namespace))
    }

    /// [`Context::api`] for a kind known at run time, e.g.
    /// `ctx.api_with::<DynamicObject>(&ApiResource::new("samplecrd.k8s.io", "v1", "Network"))`.
    pub fn api_with<K: Resource>(&self, dt: &K::DynamicType) -> Api<K> {
        Api::new(self.host.clone(), K::api_resource(dt), None)
    }

    /// [`Context::api_namespaced`] for a kind known at run time.
    pub fn api_namespaced_with<K: Resource>(&self, namespace: &str, dt: &K::DynamicType) -> Api<K> {
        Api::new(self.host.clone(), K::api_resource(dt), Some(namespace))
    }

    /// Cache reads of a watched kind.
    pub fn cache<K: Resource<DynamicType = ()>>(&self) -> Cache<K> {
        Cache::new(self.host.clone(), K::api_resource(&()))
    }

    /// [`Context::cache`] for a kind known at run time.
    pub fn cache_with<K: Resource>(&self, dt: &K::DynamicType) -> Cache<K> {
        Cache::new(self.host.clone(), K::api_resource(dt))
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
