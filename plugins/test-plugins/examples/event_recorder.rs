//! `event-recorder`: records a Normal `Seen` event about each ConfigMap it reconciles ("value is
//! X") and annotates it with `wcm.test/reconciled` = its `data.value`, so a test sees reconciles
//! and event writes apart.

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{
    Action, Context, Description, Error, EventType, ObjectRef, Permission, Reconciler, Request,
    Watch,
};

const ANNOTATION: &str = "wcm.test/reconciled";

struct EventRecorder;

impl Reconciler for EventRecorder {
    fn describe() -> Description {
        Description::new("event-recorder", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>())
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let value = test_plugins::value_of(&cm);
        let note = format!("value is {value}");
        if test_plugins::annotate(ctx, &cm, ANNOTATION, value)? {
            ctx.recorder().publish(
                &ObjectRef::from_obj(&cm),
                EventType::Normal,
                "Seen",
                "Observe",
                &note,
            );
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(EventRecorder);
