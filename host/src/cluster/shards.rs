//! A sharded plugin's units of work (issue #28): its keys split by hash into `shards` fixed ranges
//! ([`crate::engine::shard::split`]), each range led by one replica through a Lease of its own
//! (`LEASE-plugin-PLUGIN-shard-BY-K-of-N`: a layout of other N or BY names other Leases, never
//! one of this layout's).
//!
//! The ranges are shared among the live replicas as whole plugins are ([`super::election`]):
//! within the plugin, a replica takes a free or expired range's Lease only below its share
//! `ceil(N / members)`, and gives up the ranges past its share (the last by index first) only once
//! the reconciles in flight for keys of that range have ended and its writes are done. Every write
//! of a reconcile is fenced by the tenure of the range its key belongs to, so no key is written
//! for by two replicas at once; the replica that takes a range enqueues every key of it.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::sync::watch;

use super::election::{Gate, PluginLease, PluginLeases, all_of};
use super::tenure::Tenure;
use crate::engine::shard::{Range, ShardBy, split};

/// One range of a sharded plugin and its Lease on this replica.
pub struct Unit {
    pub index: usize,
    pub range: Range,
    lease: Arc<PluginLease>,
    open: watch::Receiver<bool>,
    /// Until when the replicas running the plugin agree on its layout ([`super::layouts`]).
    agreed: watch::Receiver<Option<tokio::time::Instant>>,
}

impl Unit {
    /// Whether this replica takes the range's keys now: it holds the range (read from the
    /// elector's own flag, set before it checks for in-flight reconciles, not from the combined
    /// channel a task forwards) and every replica running the plugin runs its layout.
    pub fn is_taking(&self) -> bool {
        self.holds() && super::layouts::holds(*self.agreed.borrow(), tokio::time::Instant::now())
    }

    /// Whether this replica holds the range's Lease now.
    pub fn holds(&self) -> bool {
        *self.lease.taking.borrow() && *self.open.borrow()
    }

    /// Changes when this replica takes or gives up the range's Lease.
    pub fn taking_changes(&self) -> watch::Receiver<bool> {
        self.lease.taking.clone()
    }

    /// Fences the writes of a reconcile of one of this range's keys.
    pub fn tenure(&self) -> &Arc<Tenure> {
        &self.lease.tenure
    }

    /// Reconciles of this range's keys running now: its Lease is not given up while any runs.
    pub fn in_flight(&self) -> &Arc<AtomicUsize> {
        &self.lease.in_flight
    }

    /// Who holds the range's Lease, as this replica last read it.
    pub fn leader(&self) -> Option<String> {
        self.lease.leader.borrow().clone()
    }
}

/// A sharded plugin's ranges on this replica.
pub struct Sharding {
    pub by: ShardBy,
    pub units: Vec<Unit>,
    /// Until when the replicas running the plugin agree on its layout (None: they do not): its
    /// keys wait until they do.
    pub agreed: watch::Receiver<Option<tokio::time::Instant>>,
}

impl Sharding {
    /// Whether the replicas running the plugin agree on its layout now.
    pub fn agreed(&self) -> bool {
        super::layouts::holds(*self.agreed.borrow(), tokio::time::Instant::now())
    }

    /// The range a hash falls in.
    pub fn unit(&self, hash: u64) -> Option<&Unit> {
        self.units.iter().find(|u| u.range.contains(hash))
    }

    /// The ranges this replica holds, as they change: what a sharded stream of the plugin's
    /// primaries asks the API server for. Followed by a task until nobody listens; a range whose
    /// elector is gone counts as not held.
    pub fn held_ranges(&self) -> watch::Receiver<Vec<Range>> {
        let mut parts: Vec<(Range, watch::Receiver<bool>)> = self
            .units
            .iter()
            .map(|u| (u.range, u.taking_changes()))
            .collect();
        let mut open = self.units.first().map(|u| u.open.clone());
        let now = |parts: &mut Vec<(Range, watch::Receiver<bool>)>,
                   open: &mut Option<watch::Receiver<bool>>| {
            if !open.as_mut().is_some_and(|o| *o.borrow_and_update()) {
                return Vec::new();
            }
            let mut held: Vec<Range> = parts
                .iter_mut()
                .filter_map(|(r, t)| t.borrow_and_update().then_some(*r))
                .collect();
            held.sort();
            held
        };
        let (tx, rx) = watch::channel(now(&mut parts, &mut open));
        tokio::spawn(async move {
            while !parts.is_empty() {
                let Some(o) = open.as_mut() else { break };
                let changed = futures::future::select_all(
                    parts.iter_mut().map(|(_, t)| Box::pin(t.changed())),
                );
                // A range's elector gone (Some(index)), or the replica's membership (None).
                let ended = tokio::select! {
                    (r, i, _) = changed => r.is_err().then_some(Some(i)),
                    r = o.changed() => r.is_err().then_some(None),
                    _ = tx.closed() => return,
                };
                match ended {
                    Some(Some(i)) => {
                        parts.swap_remove(i);
                    }
                    Some(None) => open = None,
                    None => {}
                }
                let held = now(&mut parts, &mut open);
                tx.send_if_modified(|h| {
                    let differs = *h != held;
                    if differs {
                        *h = held;
                    }
                    differs
                });
            }
            tx.send_replace(Vec::new());
        });
        rx
    }

    /// The indexes of the ranges this replica holds now.
    pub fn held(&self) -> Vec<usize> {
        self.units
            .iter()
            .filter(|u| u.holds())
            .map(|u| u.index)
            .collect()
    }
}

/// The unit name of range `k` in the shares: its layout and index (sorted by index within the
/// layout), so a new layout of a running plugin never reuses the old one's elections.
fn unit_name(plugin: &str, by: ShardBy, k: u32, n: u32) -> String {
    format!("{plugin}#{by}#{n:03}#{k:03}")
}

/// The gate of a plugin sharded into `n` ranges by `by`: it takes keys while it holds any range.
pub(super) fn sharded_gate(leases: &Arc<PluginLeases>, plugin: &str, n: u32, by: ShardBy) -> Gate {
    // Settings are checked at parse (2..=MAX_SHARDS); a caller passing less gets two ranges.
    let n = n.clamp(2, crate::engine::shard::MAX_SHARDS);
    let layout = super::layouts::layout(n, by);
    // Followed from before the joins: each join registers the layout and updates it.
    let agreed = leases.shares.layouts().agreement(plugin, &layout);
    let mut units = Vec::with_capacity(n as usize);
    {
        let mut map = leases.leases.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, l| l.strong_count() > 0);
        for (k, range) in (0..n).zip(split(n)) {
            let lease = leases.unit_lease(
                &mut map,
                &unit_name(plugin, by, k, n),
                plugin,
                &format!("{}-shard-{by}-{k}-of-{n}", leases.lease_name(plugin)),
                Some(&layout),
            );
            units.push(Unit {
                index: k as usize,
                range,
                lease,
                open: leases.open.clone(),
                agreed: agreed.clone(),
            });
        }
    }
    let held_any = any_of(units.iter().map(Unit::taking_changes).collect());
    let tenure = Tenure::any_of(units.iter().map(|u| u.lease.tenure.clone()).collect());
    Gate {
        taking: all_of(held_any, leases.open.clone()),
        tenure,
        in_flight: Arc::default(),
        leader: None,
        _lease: None,
        sharding: Some(Arc::new(Sharding { by, units, agreed })),
    }
}

/// A receiver that is true while one of the inputs is; it ends when nobody listens.
fn any_of(mut parts: Vec<watch::Receiver<bool>>) -> watch::Receiver<bool> {
    let now =
        |parts: &mut Vec<watch::Receiver<bool>>| parts.iter_mut().any(|p| *p.borrow_and_update());
    let (tx, rx) = watch::channel(now(&mut parts));
    tokio::spawn(async move {
        // A part that ends (its elector gone) counts as false from then on.
        while !parts.is_empty() {
            let changed =
                futures::future::select_all(parts.iter_mut().map(|p| Box::pin(p.changed())));
            let ended = tokio::select! {
                (r, i, _) = changed => r.is_err().then_some(i),
                _ = tx.closed() => return,
            };
            if let Some(i) = ended {
                parts.swap_remove(i);
            }
            tx.send_replace(now(&mut parts));
        }
        tx.send_replace(false);
    });
    rx
}
