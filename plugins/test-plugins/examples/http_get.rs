//! `http-get`: for each ConfigMap labelled `wcm.test/http`, GETs `data.url` over `wasi:http` and
//! records the outcome in the annotation named by the config key `annotation`: the status code, or
//! `error: …` (e.g. when the host refuses a host that is not declared and allowed). Declares the
//! outbound hosts `127.0.0.1` and `localhost`; the config key `url-key` names the data key holding
//! the URL (default `url`). Asks for the trace context on its requests (`traceparent`, when the
//! host traces).

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Watch};

struct HttpGet;

impl Reconciler for HttpGet {
    fn describe() -> Description {
        Description::new("http-get", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/http"))
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
            .outbound_host("127.0.0.1")
            .outbound_host("localhost")
            .config_key("annotation")
            .config_key("url-key")
            .propagate_trace_context()
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let annotation = ctx
            .config("annotation")
            .unwrap_or_else(|| "wcm.test/http-status".into());
        let url_key = ctx.config("url-key").unwrap_or_else(|| "url".into());
        let url = cm
            .data
            .as_ref()
            .and_then(|d| d.get(&url_key))
            .cloned()
            .unwrap_or_default();
        let outcome = match ctx.http().get(url).send() {
            Ok(response) => response.status.to_string(),
            Err(e) => format!("error: {e}"),
        };
        let current = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&annotation));
        if current != Some(&outcome) {
            let api = ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default());
            api.patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {annotation: outcome}}})),
            )?;
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(HttpGet);
