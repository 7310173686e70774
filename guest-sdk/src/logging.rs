//! The `log` facade, bridged to the host's log: `log::info!(..)` in a reconcile, or in any library
//! it calls, becomes a line of the host's log under the plugin's name and the key being reconciled,
//! like [`Context::log`](crate::Context::log) and the [`info!`](crate::info) macros.
//!
//! Lines below [`log::max_level`] never cross into the host; the SDK sets it to `Info` (each line
//! counts against the plugin's log budget). Raise it with `log::set_max_level` while debugging.

use std::cell::RefCell;
use std::rc::Rc;

use crate::host::Host;
use crate::types::Level;

thread_local! {
    /// The host of the reconcile running on this thread (a guest has one thread; tests may run
    /// several, each with its own `MockHost`).
    static CURRENT: RefCell<Option<Rc<dyn Host>>> = const { RefCell::new(None) };
}

struct Bridge;

static BRIDGE: Bridge = Bridge;

impl log::Log for Bridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => Level::Error,
            log::Level::Warn => Level::Warn,
            log::Level::Info => Level::Info,
            log::Level::Debug => Level::Debug,
            log::Level::Trace => Level::Trace,
        };
        CURRENT.with(|current| {
            if let Some(host) = current.borrow().as_ref() {
                let message = record.args().to_string();
                host.log(level, &message, &[("target", record.target())]);
            }
        });
    }

    fn flush(&self) {}
}

/// While alive, `log` lines go to `host`; the previous host is back when it drops.
pub(crate) struct Scope {
    previous: Option<Rc<dyn Host>>,
}

/// Routes `log` lines to `host` for the duration of a reconcile.
pub(crate) fn enter(host: Rc<dyn Host>) -> Scope {
    // The first call installs the bridge; later ones find it installed (or another logger the
    // plugin chose, which then wins).
    if log::set_logger(&BRIDGE).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let previous = CURRENT.with(|c| c.borrow_mut().replace(host));
    Scope { previous }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}
