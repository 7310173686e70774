//! `sleeper`: a plugin that holds every instance it may. It asks for 16 workers and a warm
//! instance per worker (`isolation = "worker"`, declared by itself), and each reconcile of a
//! ConfigMap with `data.sleep_seconds` sleeps that long (at most 600 s) in WASI before asking to
//! be called again 100 ms later. Sleeping parks on `wasi:clocks`: it is not guest CPU time, so neither
//! the CPU deadline nor the CPU share stops it; only the wall timeout does. ConfigMaps without the
//! key are done at once.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

struct Sleeper;

impl Reconciler for Sleeper {
    fn describe() -> Description {
        test_plugins::configmap_plugin("sleeper")
            .workers(16)
            .extension("isolation", json!("worker"))
    }

    fn reconcile(_ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let seconds = cm
            .data
            .as_ref()
            .and_then(|d| d.get("sleep_seconds"))
            .and_then(|s| s.parse::<u64>().ok());
        let Some(seconds) = seconds else {
            return Ok(Action::done());
        };
        std::thread::sleep(Duration::from_secs(seconds.min(600)));
        Ok(Action::requeue(Duration::from_millis(100)))
    }
}

wcm_sdk::export_plugin!(Sleeper);
