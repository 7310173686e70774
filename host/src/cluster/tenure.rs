//! When this replica may write for a plugin: its *tenure* of the Lease the plugin follows.
//!
//! A tenure is open from a successful renewal until the renew deadline after it (the moment the
//! elector itself stops leading), each renewal moving its end on, and closed early when the
//! replica gives the Lease up. Every write made for a plugin (an API call, an event write, each
//! retry) takes a [`WritePass`] when it is sent, and the pass cuts the request once the tenure has
//! ended (a write that outlives a renewal goes on; only its own timeout bounds it then):
//!
//! - **A lost Lease** (renewals fail): every write has ended, on this replica's side, by the last
//!   renewal's send time plus the renew deadline. A standby takes the Lease no sooner than the lease
//!   duration after it saw that renewal, so `lease duration - renew deadline` (client-go's margin
//!   for the leader to stop) is left for clock-rate differences and for a request the API server
//!   was still finishing when the host dropped it.
//! - **A Lease given up** (the plugin stopped or over this replica's share, or a shutdown): the
//!   tenure closes first (no new write starts, and it is renewed no more), the release waits until
//!   the writes in flight have ended ([`Tenure::idle`], bounded by the tenure's end), and only then
//!   is the Lease written free.
//!
//! So no write of this replica for a plugin is still on its way after another replica could have
//! taken the plugin's Lease. Without an election the tenure is open and unbounded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// One replica's tenure of one Lease; shared by the elector and everything that writes under it.
pub struct Tenure {
    state: Mutex<State>,
    idle: Notify,
    /// A sharded plugin's tenure: open while one of its shards' is ([`Tenure::any_of`]).
    any_of: Vec<Arc<Tenure>>,
}

#[derive(Debug)]
struct State {
    open: bool,
    /// When it ends unless renewed; `None`: never (no election).
    until: Option<Instant>,
    /// Writes in flight under it.
    writes: usize,
}

/// A write's right to be in flight: it counts in [`Tenure::idle`] until dropped.
pub struct WritePass {
    tenure: Arc<Tenure>,
}

/// A write cut at the end of its tenure or its own timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// True when the tenure's end cut it (not the caller's timeout).
    pub by_tenure: bool,
}

impl Tenure {
    /// A closed tenure: nothing may be written until an elector opens it.
    pub fn closed() -> Arc<Tenure> {
        Self::of_parts(Vec::new())
    }

    fn of_parts(any_of: Vec<Arc<Tenure>>) -> Arc<Tenure> {
        Arc::new(Tenure {
            state: Mutex::new(State {
                open: false,
                until: None,
                writes: 0,
            }),
            idle: Notify::new(),
            any_of,
        })
    }

    /// Open while one of `parts` is: a sharded plugin's writes that belong to no one shard
    /// (events sent later, a key whose object is gone). A write under it takes its pass from an
    /// open part, and is cut when that part's tenure ends.
    pub fn any_of(parts: Vec<Arc<Tenure>>) -> Arc<Tenure> {
        Self::of_parts(parts)
    }

    /// Open for good: no election is held.
    pub fn unbounded() -> Arc<Tenure> {
        let t = Self::closed();
        t.lock().open = true;
        t
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens it (or extends it) until `until`: the elector after a successful renewal.
    pub(crate) fn open_until(&self, until: Instant) {
        debug_assert!(self.any_of.is_empty(), "a union follows its parts");
        let mut s = self.lock();
        s.open = true;
        s.until = Some(s.until.map_or(until, |u| u.max(until)));
    }

    /// Closes it: no write starts any more; the ones in flight still end at their deadline.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        s.open = false;
    }

    /// Whether a write may start now.
    pub fn is_open(&self) -> bool {
        if !self.any_of.is_empty() {
            return self.any_of.iter().any(|t| t.is_open());
        }
        let s = self.lock();
        s.open && s.until.is_none_or(|u| Instant::now() < u)
    }

    /// When the tenure ends as things stand (`None`: closed, or never).
    pub fn until(&self) -> Option<Instant> {
        if !self.any_of.is_empty() {
            return self.any_of.iter().filter_map(|t| t.until()).max();
        }
        let s = self.lock();
        s.open.then_some(s.until).flatten()
    }

    /// When the tenure ended or ends (closed or not): no write of it is in flight past this.
    pub fn end(&self) -> Option<Instant> {
        if !self.any_of.is_empty() {
            return self.any_of.iter().filter_map(|t| t.end()).max();
        }
        self.lock().until
    }

    /// Writes in flight.
    pub fn writes(&self) -> usize {
        if !self.any_of.is_empty() {
            return self.any_of.iter().map(|t| t.writes()).sum();
        }
        self.lock().writes
    }

    /// A pass for one write sent now, or `None` when the tenure is closed or over.
    pub fn begin(self: &Arc<Self>) -> Option<WritePass> {
        if !self.any_of.is_empty() {
            return self.any_of.iter().find_map(|t| t.begin());
        }
        let mut s = self.lock();
        if !s.open || s.until.is_some_and(|u| Instant::now() >= u) {
            return None;
        }
        s.writes += 1;
        Some(WritePass {
            tenure: self.clone(),
        })
    }

    /// Returns once no write is in flight. Call it after [`Tenure::close`]: then none starts
    /// again, and the ones in flight end by their deadline at the latest.
    pub async fn idle(&self) {
        for t in &self.any_of {
            Box::pin(t.idle()).await;
        }
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().writes == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl WritePass {
    /// When the tenure ends as things stand (`None`: unbounded); renewals move it on.
    pub fn deadline(&self) -> Option<Instant> {
        self.tenure.end()
    }

    /// Runs `write`, cut at `timeout` from now or once the tenure has ended, whichever comes
    /// first.
    pub async fn run<T>(
        &self,
        timeout: Duration,
        write: impl std::future::Future<Output = T>,
    ) -> Result<T, Cut> {
        let own = Instant::now() + timeout;
        tokio::pin!(write);
        loop {
            let end = self.deadline();
            let wake = end.map_or(own, |e| e.min(own));
            tokio::select! {
                out = &mut write => return Ok(out),
                _ = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            if now >= own {
                return Err(Cut { by_tenure: false });
            }
            // Renewed meanwhile: the write goes on until the new end.
            if self.deadline().is_some_and(|e| e <= now) {
                return Err(Cut { by_tenure: true });
            }
        }
    }
}

impl Drop for WritePass {
    fn drop(&mut self) {
        let mut s = self.tenure.lock();
        s.writes = s.writes.saturating_sub(1);
        if s.writes == 0 {
            drop(s);
            self.tenure.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_lives_while_the_tenure_is_renewed_and_is_cut_when_it_ends() {
        let t = Tenure::closed();
        assert!(t.begin().is_none(), "a closed tenure lets no write start");
        let renew_deadline = Duration::from_secs(4);
        t.open_until(Instant::now() + renew_deadline);
        let pass = t.begin().expect("open");
        // Renewed every second for 6 s, then no more (the renewals fail).
        let renewer = tokio::spawn({
            let t = t.clone();
            async move {
                for _ in 0..6 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    t.open_until(Instant::now() + renew_deadline);
                }
            }
        });
        // A write that would take a minute outlives the first end (4 s) and is cut at the renew
        // deadline of the last renewal (6 s + 4 s), not at its own timeout.
        let started = Instant::now();
        let cut = pass
            .run(
                Duration::from_secs(30),
                tokio::time::sleep(Duration::from_secs(60)),
            )
            .await;
        assert_eq!(cut, Err(Cut { by_tenure: true }));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        renewer.await.expect("renewer");
        drop(pass);
        assert!(t.begin().is_none(), "past its end no write starts");
        assert!(!t.is_open());
        // A quick write is not touched; a slow one is cut by its own timeout first.
        t.open_until(Instant::now() + renew_deadline);
        let pass = t.begin().expect("open again");
        assert_eq!(pass.run(Duration::from_secs(1), async { 7 }).await, Ok(7));
        let slow = pass.run(
            Duration::from_secs(1),
            tokio::time::sleep(Duration::from_secs(2)),
        );
        assert_eq!(slow.await, Err(Cut { by_tenure: false }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_the_writes_in_flight() {
        let t = Tenure::closed();
        t.open_until(Instant::now() + Duration::from_secs(10));
        let pass = t.begin().expect("open");
        t.close();
        assert!(t.begin().is_none(), "closed: no new write");
        assert_eq!(t.writes(), 1);
        let idle = tokio::spawn({
            let t = t.clone();
            async move { t.idle().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!idle.is_finished(), "a write is still in flight");
        drop(pass);
        tokio::time::timeout(Duration::from_secs(1), idle)
            .await
            .expect("idle once the write ended")
            .expect("task");
        // A union is open while one part is, and its write is cut with the part it went under.
        let (a, b) = (Tenure::closed(), Tenure::closed());
        let both = Tenure::any_of(vec![a.clone(), b.clone()]);
        assert!(!both.is_open() && both.begin().is_none());
        b.open_until(Instant::now() + Duration::from_secs(5));
        assert!(both.is_open());
        let pass = both.begin().expect("b is open");
        assert_eq!((a.writes(), b.writes(), both.writes()), (0, 1, 1));
        b.close();
        assert!(!both.is_open(), "no part is open");
        drop(pass);
        assert_eq!(both.writes(), 0);
        let always = Tenure::unbounded();
        assert_eq!(always.begin().expect("open").deadline(), None);
    }
}
