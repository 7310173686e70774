//! `infinite-loop`: never returns from reconcile (the host's CPU deadline must stop it).

use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

struct InfiniteLoop;

impl Reconciler for InfiniteLoop {
    fn describe() -> Description {
        test_plugins::configmap_plugin("infinite-loop")
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        // black_box keeps the optimiser from proving the loop side-effect free and removing it.
        let mut spins: u64 = 0;
        loop {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
    }
}

wcm_sdk::export_plugin!(InfiniteLoop);
