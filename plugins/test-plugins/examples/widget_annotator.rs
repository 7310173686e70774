//! `widget-annotator`: watches Widgets (`faults.wcm.test/v1`, a CRD the fault tests install,
//! delete and re-create while it runs) and annotates each with `wcm.test/reconciled` = its
//! `spec.value`, so a test sees when the plugin reaches a Widget.

use serde_json::json;
use wcm_sdk::{
    Action, ApiResource, Context, Description, DynamicObject, Error, GroupVersionKind, Patch,
    Permission, Reconciler, Request, Watch,
};

const ANNOTATION: &str = "wcm.test/reconciled";

fn widgets() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("faults.wcm.test", "v1", "Widget"))
}

struct WidgetAnnotator;

impl Reconciler for WidgetAnnotator {
    fn describe() -> Description {
        Description::new("widget-annotator", test_plugins::VERSION)
            .primary(Watch::of_resource(&widgets()))
            .permission(Permission::of_resource(&widgets(), &["get", "patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let ar = widgets();
        let Some(widget) = req.object_with::<DynamicObject>(&ar)? else {
            return Ok(Action::done());
        };
        let want = widget.data["spec"]["value"]
            .as_str()
            .unwrap_or("yes")
            .to_string();
        let current = widget
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION));
        if current != Some(&want) {
            ctx.api_namespaced_with::<DynamicObject>(req.namespace().unwrap_or_default(), &ar)
                .patch(
                    req.name(),
                    &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: want}}})),
                )?;
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(WidgetAnnotator);
