//! What a reconcile receives and returns, and the trait a plugin implements.

use std::fmt;
use std::time::Duration;

use crate::context::Context;
use crate::describe::Description;
use kube_core::{ApiResource, Resource};
use serde::de::DeserializeOwned;

use crate::children::{Child, Children};
use crate::resource::decode;
use crate::types::{ApiError, ObjectKey};

/// A plugin: its declaration and its reconcile function. Export it with
/// [`export_plugin!`](crate::export_plugin).
pub trait Reconciler {
    /// What the plugin watches, may call and reads; called once when the host loads the plugin.
    fn describe() -> Description;

    /// Prepares the context of a reconcile before it runs: put the plugin's own clients and
    /// settings in with [`Context::insert`], read them back with [`Context::data`]. In unit tests,
    /// what [`MockHost::inject`](crate::testing::MockHost::inject) holds replaces them. The
    /// default puts nothing in.
    fn setup(ctx: &mut Context) -> Result<(), Error> {
        let _ = ctx;
        Ok(())
    }

    /// Brings the world in line with one key of the primary kind.
    ///
    /// Called for every dequeued key: after a change of the object (or of a secondary object that
    /// maps to it), after a resync, after a requeue or a retryable error. It must be idempotent:
    /// look at the current state, change only what differs.
    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error>;
}

/// One dequeued key of the primary kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The object's namespace and name.
    pub key: ObjectKey,
    /// The cached object as JSON; `None` when it was deleted (or never existed: an aggregate key
    /// from a [`Mapping::FixedKey`](crate::Mapping::FixedKey) has no object).
    pub object: Option<String>,
    /// Failed attempts in a row for this key before this one (0 on a first try).
    pub attempt: u32,
    /// The schedule whose tick enqueued this key, when a tick did and no change came since
    /// (contract 0.3; see [`Schedule`](crate::Schedule)).
    pub scheduled: Option<String>,
}

impl Request {
    /// A first attempt for `key` with the given object JSON (for tests).
    pub fn new(key: ObjectKey, object: Option<String>) -> Self {
        Request {
            key,
            object,
            attempt: 0,
            scheduled: None,
        }
    }

    /// The same request as if the tick of schedule `name` had enqueued it (for tests).
    pub fn scheduled_by(mut self, name: &str) -> Self {
        self.scheduled = Some(name.into());
        self
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// The object's namespace.
    pub fn namespace(&self) -> Option<&str> {
        self.key.namespace.as_deref()
    }

    /// Whether the object is gone (deleted, or the key never had one).
    pub fn is_deleted(&self) -> bool {
        self.object.is_none()
    }

    /// The object, typed; `None` when it is gone. A body that does not read as `K` is a terminal
    /// error.
    pub fn object<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
    ) -> Result<Option<K>, Error> {
        self.object_with(&())
    }

    /// Like [`Request::object`], for kinds known at run time ([`DynamicObject`](crate::DynamicObject)).
    pub fn object_with<K: Resource + DeserializeOwned>(
        &self,
        dt: &K::DynamicType,
    ) -> Result<Option<K>, Error> {
        let resource = ApiResource::erase::<K>(dt);
        self.object
            .as_deref()
            .map(|json| {
                decode(json, &resource).map_err(|e| {
                    Error::terminal(format!("reading the {} {}: {e}", resource.kind, self.key))
                })
            })
            .transpose()
    }

    /// The object as untyped JSON; `None` when it is gone.
    pub fn object_value(&self) -> Result<Option<serde_json::Value>, Error> {
        self.object
            .as_deref()
            .map(|json| {
                serde_json::from_str(json)
                    .map_err(|e| Error::terminal(format!("reading the object {}: {e}", self.key)))
            })
            .transpose()
    }
}

/// What to do after a successful reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
    children: Option<Vec<Child>>,
}

impl Action {
    /// Reconciled; wait for the next change (or resync).
    pub fn done() -> Self {
        Action {
            requeue_after: None,
            children: None,
        }
    }

    /// Reconciled; look at the key again after `after` even if nothing changes (polling
    /// something outside the cluster, waiting for a deadline).
    pub fn requeue(after: Duration) -> Self {
        Action {
            requeue_after: Some(after),
            children: None,
        }
    }

    /// Reconciled, but not finished (waiting for something to settle): look again soon. The host
    /// applies the key's backoff (as for `Requeue: true` in controller-runtime), so a plugin that
    /// always asks for this does not spin; unlike an error, nothing is logged as a failure.
    pub fn requeue_now() -> Self {
        Action {
            requeue_after: Some(Duration::ZERO),
            children: None,
        }
    }

    /// The requeue delay, if any (zero: [`Action::requeue_now`]).
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }

    /// With the full set of children wanted for the primary (contract 0.3): the host applies
    /// them and deletes the ones it applied earlier that are not in the set (see
    /// [`Children`]). Without it, children are left alone.
    pub fn with_children(mut self, children: Children) -> Self {
        self.children = Some(children.into_vec());
        self
    }

    /// The children returned, if the action carries a set.
    pub fn children(&self) -> Option<&[Child]> {
        self.children.as_deref()
    }

    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub(crate) fn take_children(&mut self) -> Option<Vec<Child>> {
        self.children.take()
    }
}

/// A failed reconcile. Retryable errors are retried with backoff (the next [`Request::attempt`]
/// counts them); terminal ones are not retried: the host records a Warning event and a metric.
///
/// From an [`ApiError`] (so `?` works on API calls): terminal for 400, 405, 413, 415, 422, a call
/// the plugin never declared (403 `NotDeclared`) and the SDK's own serialization errors,
/// retryable for everything else (0 = no answer, 403 from the API server, 404, 409 conflicts,
/// 429, 5xx) — see [`ApiError::is_retryable`]. From a `serde_json::Error`: terminal (a
/// body that does not parse will not parse next time either). Either way the original error is
/// kept as its [`source`](std::error::Error::source), and [`Error::with_source`] keeps any other.
#[derive(Debug, Clone)]
pub struct Error {
    message: String,
    terminal: bool,
    api: Option<ApiError>,
    retry_after: Option<Duration>,
    source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

/// Equal when they say the same (message, kind, API error, delay); sources are not compared.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        (&self.message, self.terminal, &self.api, self.retry_after)
            == (
                &other.message,
                other.terminal,
                &other.api,
                other.retry_after,
            )
    }
}

impl Eq for Error {}

impl Error {
    /// An error worth retrying (with backoff).
    pub fn retryable(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            terminal: false,
            api: None,
            retry_after: None,
            source: None,
        }
    }

    /// An error retrying cannot fix (invalid spec, missing configuration...).
    pub fn terminal(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            terminal: true,
            api: None,
            retry_after: None,
            source: None,
        }
    }

    /// The same error with `context` in front of its message: `"context: message"`.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// The same error, keeping `source` as its cause ([`std::error::Error::source`]): the error of
    /// a library the plugin called, say. The message stays this error's own.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(std::sync::Arc::new(source));
        self
    }

    /// Retry no sooner than `delay` (an outside API said when to come back): the host waits the
    /// later of this and the key's backoff, at most an hour; still counted as a failure. Ignored
    /// for a terminal error.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// The delay set with [`Error::retry_after`], if any (none for a terminal error).
    pub fn retry_after_delay(&self) -> Option<Duration> {
        self.retry_after.filter(|_| !self.terminal)
    }

    /// Whether retrying is pointless.
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// The message, as the host will log it.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The API error this came from, if it came from one.
    pub fn api_error(&self) -> Option<&ApiError> {
        self.api.as_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error {
            message: e.to_string(),
            terminal: !e.is_retryable(),
            api: Some(e.clone()),
            retry_after: None,
            source: Some(std::sync::Arc::new(e)),
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::terminal(format!("JSON: {e}")).with_source(e)
    }
}
