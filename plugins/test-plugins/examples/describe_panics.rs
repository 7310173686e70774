//! `describe-panics`: a component of the right world whose `describe` traps. The host must refuse it
//! with a clear error and keep everything else running.

use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

struct DescribePanics;

impl Reconciler for DescribePanics {
    fn describe() -> Description {
        panic!("deliberate panic in describe")
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(DescribePanics);
