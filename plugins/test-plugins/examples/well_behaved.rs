//! `well-behaved`: annotates each ConfigMap with `wcm.test/reconciled` = its `data.value` (or
//! `"yes"`), so a test can check that the plugin converges on the object's final state. On
//! deletion it logs `deleted` with the key and creates a ConfigMap `NAME-deleted` beside it, so a
//! test can see that every deletion reached the plugin.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Permission, Reconciler, Request};

const ANNOTATION: &str = "wcm.test/reconciled";

struct WellBehaved;

impl Reconciler for WellBehaved {
    fn describe() -> Description {
        test_plugins::configmap_plugin("well-behaved")
            .permission(Permission::of::<ConfigMap>(&["get", "patch", "create"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            ctx.log().info("deleted", &[("key", &req.key.to_string())]);
            let marker: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("{}-deleted", req.name())},
                "data": {"deleted": "true"}
            }))
            .map_err(|e| Error::terminal(e.to_string()))?;
            let api = ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default());
            return match api.create(&marker) {
                Ok(_) => Ok(Action::done()),
                // Another plugin instance (or an earlier try) made it already.
                Err(e) if e.is_already_exists() => Ok(Action::done()),
                Err(e) => Err(e.into()),
            };
        };
        test_plugins::annotate(ctx, &cm, ANNOTATION, test_plugins::value_of(&cm))?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(WellBehaved);
