//! Write reconcilers for **wasm-controller-manager** as WebAssembly components, in the manner of
//! kube-rs.
//!
//! A plugin is one [`Reconciler`]: a [`Description`] of what it watches and may call, and a
//! `reconcile` function called for every dequeued key. The host owns informers, caches, work
//! queues, events and retries; the plugin only decides what to change, through a [`Context`]:
//! typed API calls ([`Context::api`]), informer-cache reads ([`Context::cache`]), events
//! ([`Context::recorder`]), logs ([`Context::log`], [`info!`]) and configuration
//! ([`Context::config`], [`Context::secret`]).
//!
//! [`export_plugin!`] turns the reconciler into the component's exports when building for
//! `wasm32-wasip2`; on other targets it only checks the type, so the same crate builds and runs its
//! unit tests natively against [`testing::MockHost`].
//!
//! ```
//! use std::time::Duration;
//! use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
//! use wcm_sdk::serde_json::json;
//! use wcm_sdk::testing::MockHost;
//! use wcm_sdk::{
//!     Action, Context, Description, Error, EventType, ObjectKey, ObjectRef, Patch, Permission,
//!     Reconciler, Request, Watch,
//! };
//!
//! /// Writes the number of keys of every ConfigMap into an annotation.
//! struct KeyCounter;
//!
//! const ANNOTATION: &str = "example.com/keys";
//!
//! impl Reconciler for KeyCounter {
//!     fn describe() -> Description {
//!         Description::new("key-counter", "0.1.0")
//!             .primary(Watch::of::<ConfigMap>())
//!             .permission(Permission::of::<ConfigMap>(&["patch"]))
//!     }
//!
//!     fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
//!         let Some(cm) = req.object::<ConfigMap>()? else {
//!             return Ok(Action::done()); // deleted: nothing to do
//!         };
//!         let count = cm.data.as_ref().map_or(0, |d| d.len()).to_string();
//!         let current = cm.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION));
//!         if current != Some(&count) {
//!             let api = ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default());
//!             // A merge patch of just the annotation: never a full update.
//!             api.patch(req.name(), &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: count}}})))?;
//!             let note = format!("{count} keys");
//!             ctx.recorder().publish(&ObjectRef::from_obj(&cm), EventType::Normal, "Counted", "Annotate", &note);
//!             wcm_sdk::info!(ctx, "annotated {}", req.key; "keys" => count);
//!         }
//!         Ok(Action::requeue(Duration::from_secs(300)))
//!     }
//! }
//!
//! wcm_sdk::export_plugin!(KeyCounter);
//!
//! // A unit test: seed the mock, run one reconcile, look at what the plugin did.
//! let host = MockHost::for_reconciler::<KeyCounter>();
//! host.seed(&json!({
//!     "apiVersion": "v1", "kind": "ConfigMap",
//!     "metadata": {"name": "app", "namespace": "web", "uid": "u1"},
//!     "data": {"a": "1", "b": "2"},
//! }));
//! let action = host.run::<KeyCounter>(ObjectKey::namespaced("web", "app")).expect("reconciled");
//! assert_eq!(action, Action::requeue(Duration::from_secs(300)));
//!
//! let patches = host.patches();
//! assert_eq!(patches.len(), 1);
//! assert_eq!(patches[0].body, json!({"metadata": {"annotations": {ANNOTATION: "2"}}}));
//! let events = host.events();
//! assert_eq!((events[0].reason.as_str(), events[0].note.as_str()), ("Counted", "2 keys"));
//! assert_eq!(events[0].regarding.uid.as_deref(), Some("u1"));
//!
//! // The API server now has the annotation; once the cache sees it, nothing more is patched.
//! host.sync_cache().clear_records();
//! host.run::<KeyCounter>(ObjectKey::namespaced("web", "app")).expect("reconciled");
//! assert!(host.patches().is_empty());
//! ```
//!
//! Build the component with `cargo build --target wasm32-wasip2 --release` (see
//! `docs/writing-a-plugin.md` in the repository for the whole walk-through).

#![deny(missing_docs)]

mod api;
mod cache;
mod children;
pub mod conditions;
mod context;
mod describe;
mod finalizer;
pub mod helpers;
mod host;
pub mod http;
pub mod logging;
pub mod metrics;
mod params;
mod reconcile;
mod resource;
mod schedule;
pub mod testing;
mod typed;
mod types;
#[cfg(target_arch = "wasm32")]
mod wasm;
#[cfg(target_arch = "wasm32")]
mod wasm_http;

pub use api::{Api, ObjectList, Patch};
pub use cache::Cache;
pub use children::{Child, Children};
pub use context::{Context, EventBuilder, Logger, Recorder};
pub use describe::{Changes, Description, Mapping, Permission, Secondary, Watch};
pub use finalizer::{FinalizerEvent, finalizer};
pub use host::Host;
pub use metrics::{Metric, MetricKind};
pub use params::{DeleteParams, ListParams, PatchParams, Propagation};
pub use reconcile::{Action, Error, Reconciler, Request};
pub use schedule::Schedule;
pub use typed::{Controller, Typed};
pub use types::{ApiError, EventType, KindRef, Level, ObjectKey, ObjectRef, PatchType};

/// The k8s-openapi this SDK is built with (API version 1.36): use its types for typed objects.
pub use k8s_openapi;
/// The kube-core this SDK is built with: its [`Resource`] is the SDK's, so kube's
/// `#[derive(CustomResource)]` types (from the `kube` crate with only its `derive` feature) work
/// with [`Api`], [`Cache`] and [`Request::object`].
pub use kube_core;
pub use kube_core::{
    ApiResource, CustomResourceExt, DynamicObject, GroupVersionKind, PartialObjectMeta,
    PartialObjectMetaExt, Resource, ResourceExt,
};
/// The serde_json this SDK is built with.
pub use serde_json;

/// The usual imports: `use wcm_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Action, Api, ApiError, ApiResource, Children, Context, Description, DynamicObject, Error,
        EventType, FinalizerEvent, GroupVersionKind, KindRef, Mapping, Metric, ObjectKey,
        ObjectRef, PartialObjectMeta, Patch, Permission, Reconciler, Request, Resource,
        ResourceExt, Schedule, Watch, finalizer,
    };
}

/// A configuration value from the plugin's `NAME.toml`, readable while describing: a plugin can
/// declare what depends on the operator's settings, such as the outbound host of an endpoint the
/// operator names (`outbound_host` of the configured URL). Natively it reads what
/// [`testing::MockHost::set_config`] last set on this thread.
pub fn describe_config(key: &str) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        bindings::wcm::reconciler::config::get(key)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        testing::describe_config(key)
    }
}

/// The bindings generated from `wit/reconciler.wit` (world `plugin`); used by [`export_plugin!`].
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        // The WIT lives in this crate (the top-level `wit/` links here), so a packaged or git copy of
        // the SDK builds on its own.
        path: "wit",
        world: "plugin",
        // The export macro must be usable from the plugin's crate, and find these bindings there.
        pub_export_macro: true,
        export_macro_name: "__export_wcm_component",
        default_bindings_module: "wcm_sdk::bindings",
    });
}

#[doc(hidden)]
pub mod __private {
    use std::marker::PhantomData;

    /// The component type [`export_plugin!`](crate::export_plugin) exports: the bindings' `Guest`
    /// trait is implemented for it once, here, for every reconciler.
    pub struct Component<R>(PhantomData<R>);

    /// Compile-time check that the exported type is a reconciler (native builds).
    pub const fn assert_reconciler<R: crate::Reconciler>() {}
}

/// Exports a [`Reconciler`] as the plugin component.
///
/// ```
/// use wcm_sdk::k8s_openapi::api::core::v1::Pod;
/// use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Watch};
///
/// struct MyPlugin;
///
/// impl Reconciler for MyPlugin {
///     fn describe() -> Description {
///         Description::new("my-plugin", env!("CARGO_PKG_VERSION")).primary(Watch::of::<Pod>())
///     }
///     fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
///         Ok(Action::done())
///     }
/// }
///
/// wcm_sdk::export_plugin!(MyPlugin);
/// ```
///
/// Use it once per component, at the crate root of the `cdylib`. When building for `wasm32` it
/// emits the component's exports (`describe`, `reconcile`); on other targets it only checks that
/// the type implements [`Reconciler`], so unit tests and `cargo clippy` work natively.
#[macro_export]
macro_rules! export_plugin {
    ($reconciler:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __WcmPluginComponent = $crate::__private::Component<$reconciler>;
            $crate::bindings::__export_wcm_component!(__WcmPluginComponent with_types_in $crate::bindings);
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = $crate::__private::assert_reconciler::<$reconciler>();
    };
}
