//! `features-schedule`: the schedule guest of the contract-0.3 features benchmark
//! (`host/benches/features.rs`). Its schedule `every-minute` (`* * * * *`, the finest a cron of
//! five fields allows) enqueues every ConfigMap labelled `wcm.bench/features`; a reconcile does
//! nothing (features-probe's baseline), so a tick costs its enqueue and N empty reconciles.

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Schedule, Watch};

struct FeaturesSchedule;

impl Reconciler for FeaturesSchedule {
    fn describe() -> Description {
        Description::new("features-schedule", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.bench/features"))
            .schedule(Schedule::cron("every-minute", "* * * * *"))
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(FeaturesSchedule);
