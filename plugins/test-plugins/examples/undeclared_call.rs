//! `undeclared-call`: declares only `configmaps get`, then patches a Node. The host must refuse
//! with 403 Forbidden before anything reaches the API server; the plugin logs the refusal and
//! fails the reconcile (terminal) with an error that contains the API error's reason.
//!
//! The node's name is the ConfigMap's `data.node`, else `wcm-test-node`.

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use serde_json::json;
use wcm_sdk::{
    Action, Context, Description, Error, PartialObjectMeta, Patch, Permission, Reconciler, Request,
};

struct UndeclaredCall;

impl Reconciler for UndeclaredCall {
    fn describe() -> Description {
        test_plugins::configmap_plugin("undeclared-call")
            .permission(Permission::of::<ConfigMap>(&["get"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let node = cm
            .data
            .as_ref()
            .and_then(|d| d.get("node"))
            .map_or("wcm-test-node", String::as_str);
        let patch =
            Patch::Merge(json!({"metadata": {"labels": {"wcm.test/undeclared": "patched"}}}));
        match ctx.api::<PartialObjectMeta<Node>>().patch(node, &patch) {
            Ok(_) => Err(Error::terminal(format!(
                "patching node {node} was allowed although nodes patch was never declared"
            ))),
            Err(e) => {
                let code = e.code.to_string();
                ctx.log().error(
                    "undeclared node patch refused",
                    &[("node", node), ("reason", &e.reason), ("code", &code)],
                );
                Err(Error::terminal(format!(
                    "undeclared node patch refused: {e}"
                )))
            }
        }
    }
}

wcm_sdk::export_plugin!(UndeclaredCall);
