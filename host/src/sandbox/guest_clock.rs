//! The guest's run time within one call: the time the call's future spends being polled.
//!
//! A call runs on a fiber. Whenever the guest waits (a host API call in flight, a `wasi:http`
//! response, a `wasi:io` poll, a yield after an epoch tick, the per-plugin rate limits), the fiber
//! is suspended and the call's future returns `Pending`, so that time falls outside every poll and
//! is never charged. Everything that runs inside a poll is charged: the guest's own code, the
//! libcalls it triggers (`memory.fill` of a large region included) and the synchronous host work it
//! asks for. One rule covers every host function, WASI's included, without a list of which ones
//! may block.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Shared between the metered future (which writes) and the epoch callback (which reads, from
/// inside a poll).
#[derive(Debug)]
pub struct GuestClock {
    origin: Instant,
    /// Nanoseconds since `origin` when the running poll began, plus one; 0 outside a poll.
    poll_began: AtomicU64,
    /// Nanoseconds inside finished polls.
    total: AtomicU64,
}

impl GuestClock {
    pub fn new() -> Arc<GuestClock> {
        Arc::new(GuestClock {
            origin: Instant::now(),
            poll_began: AtomicU64::new(0),
            total: AtomicU64::new(0),
        })
    }

    /// Run time so far, the running poll included.
    pub fn elapsed(&self) -> Duration {
        let total = self.total.load(Ordering::Relaxed);
        let began = self.poll_began.load(Ordering::Relaxed);
        let running = if began == 0 {
            0
        } else {
            self.now().saturating_sub(began - 1)
        };
        Duration::from_nanos(total.saturating_add(running))
    }

    /// Starts a new call's count (a warm instance is reused across calls).
    pub fn reset(&self) {
        self.total.store(0, Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wraps the call's future so that its polls are counted.
    pub fn meter<F: Future>(self: &Arc<Self>, inner: F) -> Metered<F> {
        Metered {
            inner: Box::pin(inner),
            clock: self.clone(),
        }
    }
}

/// A future whose time inside `poll` is added to its [`GuestClock`].
pub struct Metered<F> {
    inner: Pin<Box<F>>,
    clock: Arc<GuestClock>,
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let began = self.clock.now();
        self.clock
            .poll_began
            .store(began.saturating_add(1), Ordering::Relaxed);
        let out = self.inner.as_mut().poll(cx);
        let ran = self.clock.now().saturating_sub(began);
        self.clock.poll_began.store(0, Ordering::Relaxed);
        self.clock.total.fetch_add(ran, Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn time_parked_between_polls_is_not_counted() {
        let clock = GuestClock::new();
        let busy = Duration::from_millis(30);
        clock
            .meter(async {
                // Busy inside a poll: counted.
                let t = Instant::now();
                while t.elapsed() < busy {
                    std::hint::spin_loop();
                }
                // Parked on a timer: not counted.
                tokio::time::sleep(Duration::from_millis(300)).await;
            })
            .await;
        let counted = clock.elapsed();
        assert!(counted >= busy, "busy time must count: {counted:?}");
        assert!(
            counted < Duration::from_millis(200),
            "parked time must not count: {counted:?}"
        );
        clock.reset();
        assert!(clock.elapsed() < Duration::from_millis(1));
    }

    #[tokio::test]
    async fn the_running_poll_is_visible_from_inside() {
        let clock = GuestClock::new();
        let inner = clock.clone();
        let seen = clock
            .meter(async move {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(20) {
                    std::hint::spin_loop();
                }
                inner.elapsed()
            })
            .await;
        assert!(seen >= Duration::from_millis(20), "{seen:?}");
    }
}
