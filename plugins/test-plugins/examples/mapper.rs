//! `mapper`: primaries are ConfigMaps labelled `wcm.test/role=primary`. ConfigMaps labelled
//! `role=owned` wake every primary among their owners (any owner, not only the controller); those
//! labelled `role=labelled` wake the primary their label `wcm.test/primary` names. Each primary is
//! annotated `wcm.test/refs` = the sorted names of the ConfigMaps that point at it (read from the
//! cache), so a test sees which primaries each change woke.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{
    Action, Context, Description, Error, Mapping, Patch, Permission, Reconciler, Request, Watch,
};

struct Mapper;

fn role(r: &str) -> Watch {
    Watch::of::<ConfigMap>().label_selector(&format!("wcm.test/role={r}"))
}

impl Reconciler for Mapper {
    fn describe() -> Description {
        Description::new("mapper", test_plugins::VERSION)
            .primary(role("primary"))
            .secondary(role("owned"), Mapping::AnyOwner)
            .secondary(role("labelled"), Mapping::label("wcm.test/primary"))
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(primary) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let ns = req.namespace().unwrap_or_default();
        let me = req.name();
        let cache = ctx.cache::<ConfigMap>();
        let mut refs: Vec<String> = Vec::new();
        for cm in cache.list(Some(ns), Some("wcm.test/role=owned"))? {
            let owned = cm
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "ConfigMap" && o.name == me);
            if owned {
                refs.extend(cm.metadata.name);
            }
        }
        for cm in cache.list(Some(ns), Some("wcm.test/role=labelled"))? {
            let names_me = cm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("wcm.test/primary"))
                .is_some_and(|p| p == me);
            if names_me {
                refs.extend(cm.metadata.name);
            }
        }
        refs.sort();
        let refs = refs.join(",");
        let current = primary
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("wcm.test/refs"));
        if current != Some(&refs) {
            ctx.api_namespaced::<ConfigMap>(ns).patch(
                me,
                &Patch::Merge(json!({"metadata": {"annotations": {"wcm.test/refs": refs}}})),
            )?;
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(Mapper);
