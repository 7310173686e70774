//! A reconciler whose primary kind is a Rust type: the watch is made from the type and the object
//! arrives decoded, so a mismatch between the declared kind and the type read is a compile error,
//! not a terminal error at run time.

use std::marker::PhantomData;

use kube_core::Resource;
use serde::de::DeserializeOwned;

use crate::context::Context;
use crate::describe::{Description, Watch};
use crate::reconcile::{Action, Error, Reconciler, Request};

/// A plugin with a typed primary kind. Export it as `export_plugin!(Typed<MyController>)` (and
/// test it with `host.run::<Typed<MyController>>(key)`).
///
/// ```
/// use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
/// use wcm_sdk::{Action, Context, Controller, Description, Error, Request, Typed, Watch};
///
/// struct Tidy;
///
/// impl Controller for Tidy {
///     type Primary = ConfigMap;
///     fn describe() -> Description {
///         Description::new("tidy", "1.0.0") // the primary watch comes from `Primary`
///     }
///     fn watch() -> Watch {
///         Watch::of::<ConfigMap>().namespace("apps") // optional: narrow it
///     }
///     fn reconcile(_ctx: &Context, cm: Option<ConfigMap>, _req: Request) -> Result<Action, Error> {
///         let _data = cm.and_then(|c| c.data); // already a ConfigMap
///         Ok(Action::done())
///     }
/// }
///
/// wcm_sdk::export_plugin!(Typed<Tidy>);
/// let d = <Typed<Tidy> as wcm_sdk::Reconciler>::describe();
/// assert_eq!(d.primary.map(|w| w.kind.kind).as_deref(), Some("ConfigMap"));
/// ```
pub trait Controller {
    /// The kind reconciled.
    type Primary: Resource<DynamicType = ()> + DeserializeOwned;

    /// Everything but the primary watch, which [`Controller::watch`] gives.
    fn describe() -> Description;

    /// The primary watch: all objects of [`Controller::Primary`] by default; narrow it (a
    /// namespace, a label selector, a change filter, metadata only with a
    /// `PartialObjectMeta<K>` primary) but keep its kind — another kind, or a metadata-only watch
    /// of a type that needs more than metadata, makes `describe` panic, and the host refuses the
    /// plugin with that message.
    fn watch() -> Watch {
        Watch::of::<Self::Primary>()
    }

    /// As [`Reconciler::setup`].
    fn setup(ctx: &mut Context) -> Result<(), Error> {
        let _ = ctx;
        Ok(())
    }

    /// Reconciles one key; `object` is the cached object, decoded (`None` once it is deleted).
    fn reconcile(
        ctx: &Context,
        object: Option<Self::Primary>,
        req: Request,
    ) -> Result<Action, Error>;
}

/// The [`Reconciler`] of a [`Controller`].
pub struct Typed<C>(PhantomData<C>);

impl<C: Controller> Reconciler for Typed<C> {
    fn describe() -> Description {
        let watch = C::watch();
        let expected = Watch::of::<C::Primary>().kind;
        // The host reports a panic in `describe` with its message, and does not load the plugin.
        assert!(
            watch.kind == expected,
            "the primary watch is of {} but the Primary type is {}",
            watch.kind,
            expected
        );
        // A metadata-only watch hands out objects with nothing but metadata: the type must read
        // them (a `PartialObjectMeta<K>`, or a type whose other fields are all optional).
        if watch.metadata_only {
            let bare = serde_json::json!({
                "apiVersion": expected.api_version(), "kind": expected.kind, "metadata": {}
            });
            if let Err(e) = serde_json::from_value::<C::Primary>(bare) {
                panic!(
                    "the primary watch is metadata-only, but the Primary type cannot be read from \
                     metadata alone ({e}): use PartialObjectMeta<{}>",
                    expected.kind
                );
            }
        }
        C::describe().primary(watch)
    }

    fn setup(ctx: &mut Context) -> Result<(), Error> {
        C::setup(ctx)
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let object = req.object::<C::Primary>()?;
        C::reconcile(ctx, object, req)
    }
}
