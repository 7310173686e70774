//! `status-ignorer`: watches Networks (`samplecrd.k8s.io/v1`) with `ignore_status_changes` and
//! returns at once: a test counts the reconciles that status-only updates did not cause.

use wcm_sdk::{Action, Context, Description, Error, KindRef, Reconciler, Request, Watch};

struct StatusIgnorer;

impl Reconciler for StatusIgnorer {
    fn describe() -> Description {
        Description::new("status-ignorer", test_plugins::VERSION).primary(
            Watch::kind(KindRef::new("samplecrd.k8s.io", "v1", "Network")).ignore_status_changes(),
        )
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(StatusIgnorer);
