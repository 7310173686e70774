//! `noop`: watches Pods (full objects) and returns at once without reading the request: the
//! engine benchmark's guest.

use k8s_openapi::api::core::v1::Pod;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Watch};

struct Noop;

impl Reconciler for Noop {
    fn describe() -> Description {
        Description::new("noop", test_plugins::VERSION).primary(Watch::of::<Pod>())
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(Noop);
