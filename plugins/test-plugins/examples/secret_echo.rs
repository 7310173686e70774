//! `secret-echo`: annotates each ConfigMap with `wcm.test/token` = the value of its secret
//! setting `token` (from a Secret named in `secret-echo.toml`), so a test sees which value of a
//! rotated Secret the plugin runs with.
//! A test plugin only: a real plugin never writes a secret where others can read it.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request};

const ANNOTATION: &str = "wcm.test/token";

struct SecretEcho;

impl Reconciler for SecretEcho {
    fn describe() -> Description {
        test_plugins::configmap_plugin("secret-echo")
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let token = ctx
            .secret("token")
            .ok_or_else(|| Error::terminal("secret setting token is not set"))?;
        let current = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION));
        if current != Some(&token) {
            ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
                .patch(
                    req.name(),
                    &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: token}}})),
                )?;
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(SecretEcho);
