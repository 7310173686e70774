//! `options-probe`: uses what `wcm:reconciler@0.2.0` added, on each ConfigMap it watches, and
//! writes what it saw into the annotation `wcm.test/options`, so a test can compare it with what
//! the API server stored:
//! - a dry-run merge patch adding the label `dry=yes` (answered with it, never stored);
//! - a LIST with a field selector on its own name and a limit of 1;
//! - a DELETE with a UID precondition that does not hold (refused, 409);
//! - a server-side apply of `wcm.test/applied` under the field manager `wcm:options-probe:probe`.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{
    Action, Context, DeleteParams, Description, Error, ListParams, Patch, PatchParams, Permission,
    Reconciler, Request,
};

const RESULT: &str = "wcm.test/options";

struct OptionsProbe;

impl Reconciler for OptionsProbe {
    fn describe() -> Description {
        test_plugins::configmap_plugin("options-probe").permission(Permission::of::<ConfigMap>(&[
            "get", "list", "patch", "delete",
        ]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        if test_plugins::has_annotation(&cm, RESULT) {
            return Ok(Action::done());
        }
        let ns = req.namespace().unwrap_or_default();
        let name = req.name();
        let api = ctx.api_namespaced::<ConfigMap>(ns);

        let dry = api.patch_with(
            name,
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"metadata": {"labels": {"dry": "yes"}}})),
        )?;
        let dry_answered = dry.metadata.labels.is_some_and(|l| l.contains_key("dry"));

        let page = api.list_with(
            &ListParams::default()
                .fields(&format!("metadata.name={name}"))
                .limit(1),
        )?;
        let listed: Vec<String> = page
            .items
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();

        let refused = match api.delete_with(
            name,
            &DeleteParams::default().precondition_uid("00000000-0000-0000-0000-000000000000"),
        ) {
            Ok(()) => 0,
            Err(e) => e.code,
        };

        api.patch_with(
            name,
            &PatchParams::default().field_manager_suffix("probe"),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "annotations": {"wcm.test/applied": "yes"}},
            })),
        )?;

        let result = format!(
            "dry-answered={dry_answered},listed={},precondition={refused}",
            listed.join("+")
        );
        test_plugins::annotate(ctx, &cm, RESULT, &result)?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(OptionsProbe);
