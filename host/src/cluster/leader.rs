//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it,
//! with its three settings:
//!
//! - every `retry_period` a standby reads the Lease; it takes the Lease when it is free (released
//!   by a leader that shut down: a hand-off within one retry period) or when the record has not
//!   changed for `lease_duration`, measured on the standby's own clock from when it saw the last
//!   change (so clock skew between nodes does not matter);
//! - the leader renews every `retry_period`; if it has not renewed for `renew_deadline` it stops
//!   leading. `renew_deadline < lease_duration`, so a leader cut off from the API server stops
//!   reconciling before any standby may start;
//! - every write carries the `resourceVersion` it read: of two replicas racing for the Lease, one
//!   gets 409 Conflict. A Lease deleted under a leader is made again by a standby only once the
//!   leader's lease would have expired;
//! - a standby waits the longer of its own lease duration and the one the holder wrote.
//!
//! Why not a crate: kube-rs has no elector, and kube-lease-manager (read for this) keeps saying
//! "leader" while its renewals fail, and its standby sleeps until the old expiry even after the
//! leader released the Lease — a graceful hand-off would take a whole lease duration.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::tenure::Tenure;
use crate::metrics::Metrics;

/// The settings of `--leader-elect-*`.
#[derive(Debug, Clone)]
pub struct LeaderSettings {
    pub lease_name: String,
    pub namespace: String,
    /// Unique per replica: the Pod name and a random suffix.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderSettings {
    /// client-go's rules: whole seconds in the Lease, retry period < renew deadline < lease
    /// duration.
    pub fn check(&self) -> Result<()> {
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.as_secs() == 0 {
            bail!(
                "--leader-elect-lease-duration must be a whole number of seconds, at least 1 (got {:?})",
                self.lease_duration
            );
        }
        if self.lease_duration > Duration::from_secs(3600) {
            bail!(
                "--leader-elect-lease-duration must be at most 1h (got {:?})",
                self.lease_duration
            );
        }
        if self.retry_period.is_zero()
            || self.retry_period >= self.renew_deadline
            || self.renew_deadline >= self.lease_duration
        {
            bail!(
                "leader election needs 0 < retry period < renew deadline < lease duration (got {:?}, {:?}, {:?})",
                self.retry_period,
                self.renew_deadline,
                self.lease_duration
            );
        }
        Ok(())
    }
}

/// Decides, for a replica that shares many Leases with its peers (one per plugin), which of them
/// it should hold. Without one, a replica takes every Lease it can.
pub trait LeasePolicy: Send + Sync {
    /// Whether this replica may take this free or expired Lease now. A yes keeps this Lease's
    /// place in the share until [`LeasePolicy::attempted`], so that electors deciding at the same
    /// moment cannot together take more than it.
    fn may_acquire(&self) -> bool;
    /// The round that `may_acquire` allowed is over: the Lease taken (and shown as held) or not.
    fn attempted(&self) {}
    /// Whether this replica holds more than its share and should give this Lease up.
    fn should_release(&self) -> bool;
    /// Whether reconciles under this Lease are still running: a Lease being given up is released
    /// once they are done (or at the renew deadline).
    fn busy(&self) -> bool;
    /// Whether a Lease being given up is still renewed while its reconciles finish. False where
    /// the reason to give it up bounds how long its writes may go on (a sharded plugin's layout
    /// no longer agreed): the tenure then runs out at the renew deadline after the last renewal.
    fn renews_while_shedding(&self) -> bool {
        true
    }
}

/// A replica's place in the election: a standby until it holds the Lease.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    taking: watch::Receiver<bool>,
    holder: watch::Receiver<Option<String>>,
    /// When this replica may write under the Lease (see `tenure.rs`).
    tenure: Arc<Tenure>,
    /// How long [`Leadership::release`] waits for the elector: the writes in flight end by the
    /// renew deadline, then the Lease is written free.
    release_wait: Duration,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Joins the election; returns at once (a standby).
    pub async fn join(
        client: kube::Client,
        settings: LeaderSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Leadership> {
        Self::join_with(client, settings, metrics, None)
    }

    /// Joins the election for one of many Leases, holding it only when `policy` says so.
    pub fn join_with(
        client: kube::Client,
        settings: LeaderSettings,
        metrics: Arc<Metrics>,
        policy: Option<Arc<dyn LeasePolicy>>,
    ) -> Result<Leadership> {
        settings.check()?;
        let (tx, leading) = watch::channel(false);
        let (taking_tx, taking) = watch::channel(false);
        let (holder_tx, holder) = watch::channel(None);
        let (stop, stopped) = oneshot::channel();
        metrics.leader(&settings.lease_name, false);
        let tenure = Tenure::closed();
        let release_wait = settings.renew_deadline + Duration::from_secs(10);
        let elector = Elector {
            tenure: tenure.clone(),
            leases: Api::namespaced(client, &settings.namespace),
            settings,
            leading: tx,
            taking: taking_tx,
            holder: holder_tx,
            policy,
            shedding: None,
            metrics,
            observed: None,
            renewed: None,
            warned: None,
        };
        let task = tokio::spawn(elector.run(stopped));
        Ok(Leadership {
            leading,
            taking,
            holder,
            tenure,
            release_wait,
            stop: Some(stop),
            task,
        })
    }

    /// Whether this replica leads now.
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// A receiver that follows leadership: true while this replica holds the Lease.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// True while this replica holds the Lease and is not giving it up (to a peer, under a
    /// [`LeasePolicy`]): when its workers may take keys.
    pub fn taking(&self) -> watch::Receiver<bool> {
        self.taking.clone()
    }

    /// The Lease's holder as last read (this replica's identity while it leads).
    pub fn holder(&self) -> watch::Receiver<Option<String>> {
        self.holder.clone()
    }

    /// When writes under this Lease may go: open while this replica holds it, each write cut at
    /// the renew deadline of the renewal it started after.
    pub fn tenure(&self) -> Arc<Tenure> {
        self.tenure.clone()
    }

    /// Stops leading and releases the Lease (if held), so a standby takes over within its retry
    /// period. Call it once in-flight work is done: the release itself waits for the writes still
    /// in flight under the Lease (they end by the renew deadline at the latest).
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(self.release_wait, &mut self.task).await;
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Elector {
    leases: Api<Lease>,
    /// Opened after each renewal until its renew deadline, closed when not leading.
    tenure: Arc<Tenure>,
    settings: LeaderSettings,
    leading: watch::Sender<bool>,
    /// `leading`, and not giving the Lease up.
    taking: watch::Sender<bool>,
    holder: watch::Sender<Option<String>>,
    policy: Option<Arc<dyn LeasePolicy>>,
    /// Since when this replica has been giving the Lease up (waiting for in-flight work).
    shedding: Option<Instant>,
    metrics: Arc<Metrics>,
    /// The Lease record last seen (holder, renewal, version) and when it was first seen so.
    observed: Option<(Observed, Instant)>,
    /// When this replica sent its last successful renewal.
    renewed: Option<Instant>,
    /// When a failure to read the Lease was last logged as a warning.
    warned: Option<Instant>,
}

/// A Lease record as a standby judges it: any change restarts its wait.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Observed {
    /// The Lease does not exist (deleted, or never made).
    Missing,
    Record {
        holder: Option<String>,
        renew_time: Option<MicroTime>,
        transitions: i32,
        /// The holder's lease duration: a standby waits the longer of it and its own.
        duration: Option<i32>,
        resource_version: Option<String>,
    },
}

impl Observed {
    fn holder(&self) -> Option<&str> {
        match self {
            Observed::Record { holder, .. } => holder.as_deref(),
            Observed::Missing => None,
        }
    }
}

impl Elector {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) {
        let mut tick = tokio::time::interval(self.settings.retry_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The leader's own deadline wakes it too: it stops leading exactly then, not at the
            // next round.
            let deadline = self
                .renewed
                .filter(|_| *self.leading.borrow())
                .map(|t| t + self.settings.renew_deadline);
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.set_leading(false);
                    continue;
                }
            }
            // A slow API server cannot hold a leader past its deadline: the round is cut there.
            let limit = match self.renewed {
                Some(t) if *self.leading.borrow() => t + self.settings.renew_deadline,
                _ => Instant::now() + self.settings.renew_deadline,
            };
            let _ = tokio::time::timeout_at(limit, self.step()).await;
            // Past the renew deadline without a renewal: stop before a standby may start.
            let fresh = self
                .renewed
                .is_some_and(|t| t.elapsed() < self.settings.renew_deadline);
            self.set_leading(fresh);
            // A Lease just taken now counts as held in the shares.
            if let Some(p) = &self.policy {
                p.attempted();
            }
        }
        self.set_leading(false);
        if let Some(p) = &self.policy {
            p.attempted();
        }
        self.release().await;
    }

    fn set_leading(&self, now: bool) {
        // Writes first: they may go until the renew deadline of the last renewal, and not at all
        // once this replica stops leading.
        match self.renewed {
            Some(r) if now => self.tenure.open_until(r + self.settings.renew_deadline),
            _ => self.tenure.close(),
        }
        self.taking
            .send_if_modified(|t| std::mem::replace(t, now && self.shedding.is_none()) != *t);
        if *self.leading.borrow() == now {
            return;
        }
        let s = &self.settings;
        if now {
            tracing::info!(lease = %s.lease_name, identity = %s.identity, "leading: reconciling");
        } else {
            tracing::warn!(lease = %s.lease_name, identity = %s.identity, "not leading: reconciling nothing");
        }
        self.leading.send_replace(now);
        self.metrics.leader(&s.lease_name, now);
    }

    /// One round: read the Lease, then renew it, take it, or wait.
    async fn step(&mut self) {
        let me = self.settings.identity.clone();
        let lease = match self.leases.get_opt(&self.settings.lease_name).await {
            Ok(lease) => lease,
            Err(e) => {
                self.read_failed(&e);
                return;
            }
        };
        let seen = match &lease {
            None => Observed::Missing,
            Some(l) => {
                let spec = l.spec.clone().unwrap_or_default();
                Observed::Record {
                    holder: spec.holder_identity.filter(|h| !h.is_empty()),
                    renew_time: spec.renew_time,
                    transitions: spec.lease_transitions.unwrap_or(0),
                    duration: spec.lease_duration_seconds,
                    resource_version: l.metadata.resource_version.clone(),
                }
            }
        };
        self.holder
            .send_if_modified(|h| std::mem::replace(h, seen.holder().map(str::to_string)) != *h);
        let previous = self.observed.as_ref().map(|(o, _)| o.clone());
        if previous.as_ref() != Some(&seen) {
            self.observed = Some((seen.clone(), Instant::now()));
        }
        let since_change = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |(_, at)| at.elapsed());
        // The longer of our lease duration and the one the holder wrote.
        let record_secs = match &seen {
            Observed::Record {
                duration: Some(d), ..
            } => u64::try_from(*d).unwrap_or(0),
            _ => 0,
        };
        let wait = self
            .settings
            .lease_duration
            .max(Duration::from_secs(record_secs));
        let held_by_other = |o: &Observed| o.holder().is_some_and(|h| h != me);
        let take = match (&lease, seen.holder()) {
            (_, Some(h)) if h == me => true,
            // Missing: made at once on a first look or when nobody else held it; after another
            // holder's Lease vanished, only once that holder's lease would have expired.
            (None, _) => !previous.as_ref().is_some_and(held_by_other) || since_change > wait,
            (Some(_), None) => true,
            (Some(_), Some(_)) => since_change > wait,
        };
        let ours = seen.holder() == Some(me.as_str());
        match &self.policy {
            // Over this replica's share: stop taking keys, and give the Lease up once in-flight
            // reconciles are done (their writes still need it), at the latest at the deadline.
            Some(p) if ours && p.should_release() => {
                let since = *self.shedding.get_or_insert_with(Instant::now);
                self.set_leading(*self.leading.borrow());
                if !p.busy() || since.elapsed() >= self.settings.renew_deadline / 2 {
                    // Writes stop before the Lease is free for a peer.
                    self.renewed = None;
                    self.set_leading(false);
                    self.shedding = None;
                    self.release().await;
                    return;
                }
                if !p.renews_while_shedding() {
                    return;
                }
            }
            Some(p) if !ours && take && !p.may_acquire() => {
                self.renewed = None;
                return;
            }
            _ => self.shedding = None,
        }
        if !take {
            self.renewed = None;
            return;
        }
        let Some(lease) = lease else {
            self.create().await;
            return;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let new_holder = seen.holder() != Some(me.as_str());
        let sent = Instant::now();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let transitions = spec.lease_transitions.unwrap_or(0);
        let mut next = lease;
        next.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(self.lease_seconds()),
            renew_time: Some(now.clone()),
            acquire_time: if new_holder {
                Some(now)
            } else {
                spec.acquire_time.clone()
            },
            // Every change of holder counts, a Lease its holder released included (as client-go).
            lease_transitions: Some(transitions.saturating_add(i32::from(new_holder))),
            ..spec
        });
        // The resourceVersion read above is the precondition: a racing replica gets 409.
        match self
            .leases
            .replace(&self.settings.lease_name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                self.renewed = Some(sent);
                self.holder.send_replace(Some(me));
            }
            Err(e) => {
                // Lost a race (409) or could not write: lead no longer than the deadline allows.
                if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                    self.renewed = None;
                }
                tracing::debug!(lease = %self.settings.lease_name, "writing the Lease failed: {e}")
            }
        }
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// A Lease that cannot be read: a warning at most every 30 s when it is the API server
    /// refusing (RBAC, a namespace that does not exist), as every replica then stays a standby.
    fn read_failed(&mut self, e: &kube::Error) {
        let refused = matches!(e, kube::Error::Api(s) if matches!(s.code, 401 | 403 | 404));
        let due = self
            .warned
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(30));
        if refused && due {
            self.warned = Some(Instant::now());
            tracing::warn!(
                lease = %self.settings.lease_name,
                namespace = %self.settings.namespace,
                "cannot read the leader-election Lease (this replica cannot lead): {e}"
            );
        } else {
            tracing::debug!(lease = %self.settings.lease_name, "reading the Lease failed: {e}");
        }
    }

    async fn create(&mut self) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let sent = Instant::now();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.lease_name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.settings.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        match self.leases.create(&PostParams::default(), &lease).await {
            Ok(_) => {
                self.renewed = Some(sent);
                self.holder
                    .send_replace(Some(self.settings.identity.clone()));
            }
            Err(e) => {
                // Another replica made it first (409 AlreadyExists: the expected start-up race), or
                // it cannot be made: not leading.
                self.renewed = None;
                if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                    tracing::debug!(lease = %self.settings.lease_name, "another replica created the Lease first: {e}");
                } else {
                    tracing::warn!(
                        lease = %self.settings.lease_name,
                        namespace = %self.settings.namespace,
                        "creating the Lease failed: {e}"
                    );
                }
            }
        }
    }

    /// Gives the Lease up if this replica holds it: no holder, so a standby takes it at its next
    /// look instead of waiting for it to expire. Not before the writes in flight under it have
    /// ended: a standby may take a released Lease at once.
    async fn release(&mut self) {
        self.tenure.close();
        // Every write in flight ends by the end of its tenure; a little more for its task to
        // notice. Should one still be counted then, the Lease is left to expire instead.
        let bound = self
            .tenure
            .end()
            .map_or(Instant::now(), |end| end.max(Instant::now()))
            + Duration::from_secs(1);
        if tokio::time::timeout_at(bound, self.tenure.idle())
            .await
            .is_err()
        {
            tracing::warn!(
                lease = %self.settings.lease_name,
                writes = self.tenure.writes(),
                "writes still in flight: the Lease is left to expire instead of being released"
            );
            return;
        }
        let Ok(Some(mut lease)) = self.leases.get_opt(&self.settings.lease_name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self
            .leases
            .replace(&self.settings.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.holder.send_replace(None);
                tracing::info!(lease = %self.settings.lease_name, "Lease released")
            }
            Err(e) => {
                tracing::warn!(lease = %self.settings.lease_name, "releasing the Lease failed: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(d: u64, r: u64, p: u64) -> LeaderSettings {
        LeaderSettings {
            lease_name: "l".into(),
            namespace: "n".into(),
            identity: "i".into(),
            lease_duration: Duration::from_secs(d),
            renew_deadline: Duration::from_secs(r),
            retry_period: Duration::from_secs(p),
        }
    }

    #[test]
    fn timings_follow_client_go_rules() {
        assert!(settings(15, 10, 2).check().is_ok());
        for (d, r, p) in [
            (10, 10, 2),
            (15, 10, 10),
            (15, 20, 2),
            (15, 10, 0),
            (0, 0, 0),
        ] {
            assert!(settings(d, r, p).check().is_err(), "{d} {r} {p}");
        }
        let mut s = settings(15, 10, 2);
        s.lease_duration = Duration::from_millis(15_500);
        assert!(s.check().unwrap_err().to_string().contains("whole number"));
    }
}
