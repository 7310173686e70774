//! `flaky`: fails (retryable) while a ConfigMap has `data.fail = "true"`; otherwise annotates it
//! with `wcm.test/attempt` = `VALUE@ATTEMPT` (its `data.value` and the attempt number the host
//! passed), once per value, so a test sees failed attempts counted and forgotten after a success.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Watch};

struct Flaky;

impl Reconciler for Flaky {
    fn describe() -> Description {
        Description::new("flaky", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/flaky"))
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let data = cm.data.unwrap_or_default();
        if data.get("fail").map(String::as_str) == Some("true") {
            return Err(Error::retryable("asked to fail"));
        }
        let value = data.get("value").map_or("", String::as_str);
        // Once per value: its own annotation write comes back as a change, and must not overwrite
        // the attempt number the first success saw.
        let noted = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("wcm.test/attempt"))
            .is_some_and(|a| a.split_once('@').is_some_and(|(v, _)| v == value));
        if noted {
            return Ok(Action::done());
        }
        let seen = format!("{value}@{}", req.attempt);
        ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
            .patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {"wcm.test/attempt": seen}}})),
            )?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(Flaky);
