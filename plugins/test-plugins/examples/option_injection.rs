//! `option-injection`: a hostile plugin of contract 0.2. It declares `configmaps get, list, patch,
//! delete` and watches the ConfigMaps of namespace `wcm-oi`; for a ConfigMap with `data.target` it
//! hides requests in the call options (list, patch and delete options become query parameters or
//! the body of a DELETE): parameters smuggled into a selector or a continue token, a field manager
//! that names another controller, limits out of range, a force on a merge patch, preconditions
//! crafted to drop themselves. It writes each attempt's answer (HTTP code, 0 for success) into its
//! annotation `wcm.test/attacks` as JSON, so a test can compare it with the API server's audit log.
//! The target ConfigMap must survive: every delete carries a precondition that does not hold.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use test_plugins::code;
use wcm_sdk::{
    Action, Context, DeleteParams, Description, Error, ListParams, Patch, PatchParams, Permission,
    Reconciler, Request, Watch,
};

pub const NAMESPACE: &str = "wcm-oi";
const RESULT: &str = "wcm.test/attacks";

struct OptionInjection;

impl Reconciler for OptionInjection {
    fn describe() -> Description {
        Description::new("option-injection", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace(NAMESPACE))
            .permission(Permission::of::<ConfigMap>(&[
                "get", "list", "patch", "delete",
            ]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let Some(target) = cm.data.as_ref().and_then(|d| d.get("target")).cloned() else {
            return Ok(Action::done());
        };
        if test_plugins::has_annotation(&cm, RESULT) {
            return Ok(Action::done());
        }
        let api = ctx.api_namespaced::<ConfigMap>(NAMESPACE);
        let list = |p: ListParams| code(api.list_with(&p));
        let touch = Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}));
        let patch = |p: PatchParams| code(api.patch_with(&target, &p, &touch));
        let delete = |p: DeleteParams| code(api.delete_with(&target, &p));
        let attacks = [
            (
                "field selector smuggling a label selector",
                list(ListParams::default().fields("metadata.name=x&labelSelector=app%3Dy")),
            ),
            (
                "field selector with a newline",
                list(ListParams::default().fields("metadata.name=x\nGET /api/v1/secrets")),
            ),
            (
                "continue token smuggling a watch",
                list(ListParams::default().continue_token("x&watch=true&resourceVersion=0")),
            ),
            ("limit 0", list(ListParams::default().limit(0))),
            ("limit 100000", list(ListParams::default().limit(100_000))),
            (
                "field manager suffix naming another manager",
                patch(
                    PatchParams::default()
                        .field_manager_suffix("x&fieldManager=kube-controller-manager"),
                ),
            ),
            (
                "field manager suffix with capitals",
                patch(PatchParams::default().field_manager_suffix("Admin")),
            ),
            (
                "force on a merge patch",
                patch(PatchParams::default().force()),
            ),
            (
                "precondition uid smuggling a dry run",
                delete(DeleteParams::default().precondition_uid("x&dryRun=All")),
            ),
            (
                "precondition resourceVersion breaking out of the body",
                delete(
                    DeleteParams::default()
                        .precondition_resource_version(r#"1"},"propagationPolicy":"Orphan"#),
                ),
            ),
        ];
        let results: Vec<_> = attacks
            .iter()
            .map(|(what, code)| json!({"attack": what, "code": code}))
            .collect();
        api.patch(
            req.name(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                RESULT: serde_json::Value::Array(results).to_string()
            }}})),
        )?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(OptionInjection);
