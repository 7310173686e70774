//! `panicker`: panics in reconcile (a trap for the host; the plugin must keep being served).

use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

struct Panicker;

impl Reconciler for Panicker {
    fn describe() -> Description {
        test_plugins::configmap_plugin("panicker")
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        panic!("boom: deliberate panic in reconcile")
    }
}

wcm_sdk::export_plugin!(Panicker);
