//! `event-outside`: watches the ConfigMaps of namespace `wcm-eo` and declares `configmaps get`.
//! For each ConfigMap it records three events: one about the ConfigMap itself (allowed), one
//! about a ConfigMap in namespace `wcm-eo-other`, which it does not watch (its identity may not
//! write events there: the API server must refuse it), and one about a Secret, a kind it neither
//! watches nor declared (the host must refuse it before any request).

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use wcm_sdk::{
    Action, Context, Description, Error, EventType, ObjectKey, ObjectRef, Permission, Reconciler,
    Request, Resource, Watch,
};

struct EventOutside;

fn kind_of<K: Resource<DynamicType = ()>>() -> wcm_sdk::KindRef {
    wcm_sdk::KindRef::of::<K>()
}

impl Reconciler for EventOutside {
    fn describe() -> Description {
        Description::new("event-outside", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace("wcm-eo"))
            .permission(Permission::of::<ConfigMap>(&["get"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let rec = ctx.recorder();
        rec.publish(
            &ObjectRef::from_obj(&cm),
            EventType::Normal,
            "Seen",
            "Observe",
            "inside",
        );
        let outside = ObjectRef::new(
            kind_of::<ConfigMap>(),
            ObjectKey::namespaced("wcm-eo-other", "victim"),
        );
        rec.publish(
            &outside,
            EventType::Warning,
            "Spoofed",
            "Observe",
            "outside",
        );
        let secret = ObjectRef::new(kind_of::<Secret>(), ObjectKey::namespaced("wcm-eo", "x"));
        rec.publish(
            &secret,
            EventType::Warning,
            "Spoofed",
            "Observe",
            "undeclared",
        );
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(EventOutside);
