//! `many-workers`: asks for a million concurrent reconciles (the host must cap them at
//! `--max-workers-per-plugin`) and otherwise does nothing. Watches the ConfigMaps of `wcm-flood`.

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Watch};

struct ManyWorkers;

impl Reconciler for ManyWorkers {
    fn describe() -> Description {
        Description::new("many-workers", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace("wcm-flood"))
            .workers(1_000_000)
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(ManyWorkers);
