//! `slow-annotator`: a reconcile that is in flight long enough to be caught by a shutdown. For each
//! ConfigMap in namespace `slow-annotator` with `data.sleep_seconds` (at most 60) and no
//! `wcm.test/done` annotation, it annotates `wcm.test/started`, sleeps that long (parked in WASI:
//! not guest CPU time), then annotates `wcm.test/done`. A ConfigMap already done is left alone, so
//! the reconcile that the first patch triggers, and a new leader's resync, do not sleep again: the
//! `done` patch comes from the replica whose reconcile slept, which the audit log's User-Agent names.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Watch};

const NAMESPACE: &str = "slow-annotator";
const STARTED: &str = "wcm.test/started";
const DONE: &str = "wcm.test/done";

struct SlowAnnotator;

impl Reconciler for SlowAnnotator {
    fn describe() -> Description {
        Description::new("slow-annotator", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace(NAMESPACE))
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let annotations = cm.metadata.annotations.clone().unwrap_or_default();
        if annotations.contains_key(DONE) {
            return Ok(Action::done());
        }
        let Some(seconds) = cm
            .data
            .as_ref()
            .and_then(|d| d.get("sleep_seconds"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return Ok(Action::done());
        };
        let api = ctx.api_namespaced::<ConfigMap>(NAMESPACE);
        let annotate = |key: &str| {
            api.patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: "true"}}})),
            )
        };
        annotate(STARTED)?;
        std::thread::sleep(Duration::from_secs(seconds.min(60)));
        annotate(DONE)?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(SlowAnnotator);
