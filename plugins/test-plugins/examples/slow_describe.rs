//! `slow-describe`: a component whose `describe` sleeps 100 s in WASI before it answers, then
//! declares a kind no API server serves. Sleeping parks on `wasi:clocks`: it is not guest CPU time,
//! so only a wall deadline stops it. The host must load every other file meanwhile, enforce a revoked
//! grant within one rescan, and refuse this one at its describe deadline.

use std::time::Duration;

use wcm_sdk::{Action, Context, Description, Error, KindRef, Reconciler, Request, Watch};

struct SlowDescribe;

impl Reconciler for SlowDescribe {
    fn describe() -> Description {
        std::thread::sleep(Duration::from_secs(100));
        Description::new("slow-describe", test_plugins::VERSION).primary(Watch::kind(KindRef::new(
            "never.example.invalid",
            "v1",
            "Nothing",
        )))
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(SlowDescribe);
