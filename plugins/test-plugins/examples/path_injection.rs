//! `path-injection`: a hostile plugin. It declares only `configmaps get, patch` and watches the
//! ConfigMaps of namespace `wcm-pi`; for a ConfigMap with `data.target` (the name of a Secret in
//! that namespace) it tries to reach the Secret through crafted namespaces, names, kinds and
//! selectors, and writes each attempt's answer (HTTP code, 0 for success) into its annotation
//! `wcm.test/attacks` as JSON, so a test can compare what the plugin saw with what the API server
//! received.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;
use test_plugins::code;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Watch};

pub const NAMESPACE: &str = "wcm-pi";

struct PathInjection;

impl Reconciler for PathInjection {
    fn describe() -> Description {
        Description::new("path-injection", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace(NAMESPACE))
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
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
        let ns = NAMESPACE;
        let cms = |namespace: &str| ctx.api_namespaced::<ConfigMap>(namespace);
        let attacks = [
            (
                "namespace with path and query",
                code(cms(&format!("{ns}/secrets/{target}?")).get("x")),
            ),
            (
                "namespace percent-encoded",
                code(cms(&format!("{ns}%2Fsecrets%2F{target}")).get("x")),
            ),
            ("namespace dot-dot", code(cms("..").get(&target))),
            (
                "name with path",
                code(cms(ns).get(&format!("../secrets/{target}"))),
            ),
            (
                "name percent-encoded",
                code(cms(ns).get(&format!("..%2Fsecrets%2F{target}"))),
            ),
            ("name dot-dot", code(cms(ns).get(".."))),
            (
                "name with query",
                code(cms(ns).get(&format!("{target}?watch=true"))),
            ),
            (
                "name with fragment",
                code(cms(ns).get(&format!("x#{target}"))),
            ),
            (
                "name with newline",
                code(cms(ns).get("x\nGET /api/v1/secrets")),
            ),
            (
                "selector injection",
                code(cms(ns).list(Some("a=b&fieldSelector=metadata.name%3Dx"))),
            ),
            (
                "undeclared kind",
                code(ctx.api_namespaced::<Secret>(ns).get(&target)),
            ),
        ];
        let results: Vec<_> = attacks
            .iter()
            .map(|(what, code)| json!({"attack": what, "code": code}))
            .collect();
        cms(ns).patch(
            req.name(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "wcm.test/attacks": serde_json::Value::Array(results).to_string()
            }}})),
        )?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(PathInjection);
