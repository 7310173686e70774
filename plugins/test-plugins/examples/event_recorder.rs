//! `event-recorder`: records a Normal `Seen` event about each ConfigMap it reconciles ("value is
//! X") and annotates it with `wcm.test/reconciled` = its `data.value`, so a test sees reconciles
//! and event writes apart.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{
    Action, Context, Description, Error, EventType, ObjectRef, Patch, Permission, Reconciler,
    Request, Watch,
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
        let value = cm
            .data
            .as_ref()
            .and_then(|d| d.get("value"))
            .map_or("yes", String::as_str);
        let current = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION));
        if current.map(String::as_str) != Some(value) {
            ctx.recorder().publish(
                &ObjectRef::from_obj(&cm),
                EventType::Normal,
                "Seen",
                "Observe",
                &format!("value is {value}"),
            );
            ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
                .patch(
                    req.name(),
                    &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: value}}})),
                )?;
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(EventRecorder);
