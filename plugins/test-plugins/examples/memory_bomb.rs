//! `memory-bomb`: allocates 1 MiB chunks, every byte written, until the host's memory limit stops
//! it (allocation failure aborts: a trap).

use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

struct MemoryBomb;

const CHUNK: usize = 1 << 20;

impl Reconciler for MemoryBomb {
    fn describe() -> Description {
        test_plugins::configmap_plugin("memory-bomb")
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            // A non-zero fill writes every page; black_box keeps the chunk alive and observed.
            let chunk = vec![0xA5u8; CHUNK];
            hoard.push(std::hint::black_box(chunk));
        }
    }
}

wcm_sdk::export_plugin!(MemoryBomb);
