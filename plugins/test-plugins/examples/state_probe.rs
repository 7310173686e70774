//! `state-probe`: fails (terminal) when it finds anything an earlier call left in its linear
//! memory: a static counter, a 64 KiB static buffer, and pages an earlier call grew the memory by
//! and wrote. With a fresh instance per call every call passes; in a reused instance the second
//! call fails, which shows the probe sees state that carried over.

use std::ptr::{addr_of, addr_of_mut};

use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request};

static mut CALLS: u32 = 0;
static mut SCRATCH: [u8; 64 << 10] = [0; 64 << 10];

struct StateProbe;

impl Reconciler for StateProbe {
    fn describe() -> Description {
        test_plugins::configmap_plugin("state-probe")
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        // SAFETY: an instance runs one call at a time on one thread; nothing else touches these.
        unsafe {
            let calls = *addr_of!(CALLS);
            if calls != 0 {
                return Err(Error::terminal(format!(
                    "an earlier call left CALLS = {calls}"
                )));
            }
            *addr_of_mut!(CALLS) = 1;
            let scratch = &mut *addr_of_mut!(SCRATCH);
            if let Some(i) = scratch.iter().position(|b| *b != 0) {
                return Err(Error::terminal(format!(
                    "an earlier call left byte {i} of the static buffer set"
                )));
            }
            scratch.fill(0xA5);
        }
        grow_and_write()?;
        Ok(Action::done())
    }
}

/// Grows the memory and checks the new pages are zero before writing to each of them.
#[cfg(target_arch = "wasm32")]
fn grow_and_write() -> Result<(), Error> {
    const PAGE: usize = 64 << 10;
    const GROWN_PAGES: usize = 4;
    let old = core::arch::wasm32::memory_grow(0, GROWN_PAGES);
    if old == usize::MAX {
        return Err(Error::retryable("memory.grow refused"));
    }
    let base = (old * PAGE) as *mut u8;
    for offset in (0..GROWN_PAGES * PAGE).step_by(4096) {
        // SAFETY: the pages were just added to this instance's memory and nothing else uses them.
        let seen = unsafe { core::ptr::read_volatile(base.add(offset)) };
        if seen != 0 {
            return Err(Error::terminal(format!(
                "a grown page held {seen:#x} at offset {offset} from an earlier call"
            )));
        }
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(base.add(offset), 0x5A) };
    }
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
fn grow_and_write() -> Result<(), Error> {
    Ok(())
}

wcm_sdk::export_plugin!(StateProbe);
