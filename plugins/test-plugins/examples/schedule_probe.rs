//! `schedule-probe`: its schedule `every-minute` (`*/1 * * * *`, catch-up 120 s) enqueues every
//! ConfigMap labelled `wcm.test/schedule`; each scheduled reconcile adds 1 to the ConfigMap's
//! annotation `wcm.test/ticks` (a merge patch), so the API server's writes count the ticks run.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use std::time::Duration;
use wcm_sdk::{
    Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Schedule, Watch,
};

struct ScheduleProbe;

impl Reconciler for ScheduleProbe {
    fn describe() -> Description {
        Description::new("schedule-probe", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/schedule"))
            .permission(Permission::of::<ConfigMap>(&["patch"]))
            .schedule(
                Schedule::cron("every-minute", "*/1 * * * *").catch_up(Duration::from_secs(120)),
            )
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        if req.scheduled.as_deref() != Some("every-minute") {
            return Ok(Action::done());
        }
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let ticks: u64 = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("wcm.test/ticks"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let ns = req.namespace().unwrap_or_default();
        ctx.api_namespaced::<ConfigMap>(ns).patch(
            req.name(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"wcm.test/ticks": (ticks + 1).to_string()}}}),
            ),
        )?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(ScheduleProbe);
