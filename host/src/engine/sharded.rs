//! Which keys of a sharded plugin this replica reconciles (issue #28).
//!
//! A key belongs to the range its hash falls in: the hash of the primary object's UID (by `uid`)
//! or of its namespace (by `namespace`), as the API server's `ShardedListAndWatch` computes it.
//! Under `uid`, a deleted object's key keeps its UID's range for a while (a bounded record of
//! deletions, [`TOMBSTONE_TTL`]), so the reconcile of a deletion stays with the range the object
//! was in; a fixed key of a mapping is placed by the hash of its own text (`namespace/name`), and
//! so is, where every replica caches every primary, a key no object of which was seen (a mapping
//! to an object not made yet). Every replica computes the same from the same stream of changes,
//! so each key has one owner. Where the API server filters by range, a key whose primary this
//! replica neither caches nor saw deleted is another replica's (or names nothing): left alone.
//!
//! The check is made twice: when a change queues a key (a replica queues only its own keys), and
//! when a worker takes it (a range given away meanwhile is not reconciled here: the replica that
//! took it queues every key of it). A mapped key (a secondary's change naming a primary) is placed
//! by the primary, as cached.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::cluster::shards::{Sharding, Unit};
use crate::engine::cache::{CachedObject, Key, ObjectStore};
use crate::engine::queue::WorkQueue;
use crate::engine::shard::{Range, ShardBy, fnv1a64, hash_of};

/// How long a deleted object's key keeps its UID's range.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// The most deletions remembered per plugin (the oldest go first).
pub const MAX_TOMBSTONES: usize = 65_536;

/// A sharded plugin's keys against its primary cache.
#[derive(Clone)]
pub struct KeyShards {
    pub sharding: Arc<Sharding>,
    pub store: Arc<ObjectStore>,
    tombstones: Arc<Mutex<Tombstones>>,
    /// Where the API server filters the primaries by range: the ranges the cache is complete
    /// for ([`crate::engine::informer::Informer::covered`]). None: every primary is cached.
    covered: Option<watch::Receiver<Vec<Range>>>,
    /// The fixed keys of the plugin's mappings (placed by their text, never by an object).
    fixed: Arc<[Key]>,
    /// Where the API server filters: the host's client and the primary stream's key, to ask
    /// whether a primary this replica saw deleted was made again under its name.
    live: Option<(kube::Client, crate::engine::informer::InformerKey)>,
}

/// Recently deleted primaries' UIDs, by key; bounded in count and age.
#[derive(Default)]
struct Tombstones {
    by_key: HashMap<Key, String>,
    order: VecDeque<(Instant, Key, String)>,
}

impl Tombstones {
    /// `key`'s primary, of UID `uid`, is gone (or placed by that UID).
    fn record(&mut self, key: &Key, uid: &str) {
        self.by_key.insert(key.clone(), uid.to_string());
        self.order
            .push_back((Instant::now(), key.clone(), uid.to_string()));
        self.prune();
    }

    fn prune(&mut self) {
        while let Some((at, _, _)) = self.order.front() {
            if at.elapsed() < TOMBSTONE_TTL && self.order.len() <= MAX_TOMBSTONES {
                break;
            }
            if let Some((_, k, uid)) = self.order.pop_front()
                && self.by_key.get(&k) == Some(&uid)
            {
                self.by_key.remove(&k);
            }
        }
    }
}

impl KeyShards {
    /// `covered`: the ranges a sharded stream's cache is complete for, where the API server
    /// filters the primaries by range; None where every primary is cached.
    pub fn new(
        sharding: Arc<Sharding>,
        store: Arc<ObjectStore>,
        covered: Option<watch::Receiver<Vec<Range>>>,
        fixed: &[Key],
    ) -> KeyShards {
        KeyShards {
            sharding,
            store,
            tombstones: Arc::default(),
            covered,
            fixed: fixed.into(),
            live: None,
        }
    }

    /// Where the API server filters by range: `client` may read the primaries of `key`'s stream.
    pub fn with_live_reads(
        mut self,
        client: kube::Client,
        key: crate::engine::informer::InformerKey,
    ) -> KeyShards {
        self.live = Some((client, key));
        self
    }

    /// Server-side by UID, a key whose primary is not cached here and which a deletion record
    /// places: the UID recorded. Its primary may have been made again under the same name with
    /// a new UID, in a range another replica caches: see [`KeyShards::live_uid`].
    pub fn deleted_uid(&self, key: &Key) -> Option<String> {
        if !self.server_side() || self.sharding.by != ShardBy::Uid || self.fixed.contains(key) {
            return None;
        }
        let mut t = self.lock();
        t.prune();
        t.by_key.get(key).cloned()
    }

    /// `key`'s primary was made again with UID `uid`: the key is placed by it from now on.
    pub fn made_again(&self, key: &Key, uid: &str) {
        self.lock().record(key, uid);
    }

    /// Whether [`KeyShards::live_uid`] would ask the API server about `key`
    /// ([`crate::engine::shard_watch::may_name`]). Checked before the read takes a token of the
    /// plugin's budget.
    pub fn reads_live(&self, key: &Key) -> bool {
        self.live
            .as_ref()
            .is_some_and(|(_, stream)| crate::engine::shard_watch::may_name(stream, key))
    }

    /// The UID of `key`'s primary as the API server has it now (None: there is none): see
    /// [`crate::engine::shard_watch::live_uid`]. A primary made again under the name of one this
    /// replica saw deleted is not reconciled here as deleted: it is in its new UID's range, whose
    /// holder reconciles it.
    pub async fn live_uid(&self, key: &Key) -> Result<Option<String>, kube::Error> {
        match &self.live {
            Some((client, stream)) => {
                crate::engine::shard_watch::live_uid(client, stream, key).await
            }
            None => Ok(None),
        }
    }

    /// Whether the API server filters the primaries by range (each replica caches its own).
    pub fn server_side(&self) -> bool {
        self.covered.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tombstones> {
        self.tombstones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A primary was deleted: its key stays in its UID's range for a while.
    pub fn deleted(&self, key: &Key, uid: &str) {
        if self.sharding.by != ShardBy::Uid {
            return;
        }
        self.lock().record(key, uid);
    }

    /// A change of a secondary named `key`'s primary by an owner reference with this UID while
    /// the primary is not cached (the garbage collector deleting the children of a deleted
    /// primary, say): the key is placed by that UID, unless a deletion placed it already. Every
    /// replica sees the same change, a replica started after the primary's deletion included.
    /// Where the API server filters, the UIDs of other replicas' (live) primaries are recorded
    /// too: a replica that takes their range later has the record of a deletion it did not see.
    pub fn owned_by(&self, key: &Key, uid: &str) {
        if self.sharding.by != ShardBy::Uid || self.store.get(key).is_some() {
            return;
        }
        let mut t = self.lock();
        if !t.by_key.contains_key(key) {
            t.record(key, uid);
        }
    }

    /// The hash `key` is placed by when its primary, as read from the cache, is `object`. None
    /// for a key this replica cannot place: sharded by UID with the API server filtering, a
    /// primary neither cached nor recently deleted nor named by an owner reference is in a range
    /// another replica caches (or does not exist, which cannot be told apart): its holder
    /// places it.
    pub fn hash_with(&self, key: &Key, object: Option<&CachedObject>) -> Option<u64> {
        match self.sharding.by {
            ShardBy::Namespace => Some(hash_of(ShardBy::Namespace, "", key.namespace.as_deref())),
            // A fixed key is placed by its text whether or not its object is cached here: every
            // replica places it alike, whichever caches the object.
            ShardBy::Uid if self.fixed.contains(key) => Some(fnv1a64(&key.to_string())),
            ShardBy::Uid => match object {
                Some(o) => Some(hash_of(ShardBy::Uid, &o.uid, None)),
                None => {
                    let mut t = self.lock();
                    t.prune();
                    match t.by_key.get(key) {
                        Some(uid) => Some(hash_of(ShardBy::Uid, uid, None)),
                        None if !self.server_side() => Some(fnv1a64(&key.to_string())),
                        None => None,
                    }
                }
            },
        }
    }

    /// The range `key` belongs to.
    pub fn unit(&self, key: &Key) -> Option<&Unit> {
        self.unit_with(key, self.store.get(key).as_deref())
    }

    /// The range `key` belongs to when its primary, as read from the cache, is `object`.
    pub fn unit_with(&self, key: &Key, object: Option<&CachedObject>) -> Option<&Unit> {
        self.sharding.unit(self.hash_with(key, object)?)
    }

    /// Whether this replica reconciles the keys of `unit` now: it holds the range, and (where
    /// the API server filters) the range's objects are all in the cache.
    pub fn ready(&self, unit: &Unit) -> bool {
        unit.is_taking()
            && self
                .covered
                .as_ref()
                .is_none_or(|c| c.borrow().contains(&unit.range))
    }

    /// Whether this replica reconciles `key` now.
    pub fn mine(&self, key: &Key) -> bool {
        self.unit(key).is_some_and(|u| self.ready(u))
    }

    /// Queues every key of range `i` this replica knows: the cached primaries, the recent
    /// deletions and the fixed keys that fall in it.
    fn queue_range(&self, i: usize, queue: &WorkQueue<Key>) -> usize {
        let mut queued = 0;
        let mut add = |k: &Key, unit: Option<&Unit>| {
            if unit.is_some_and(|u| u.index == i) {
                queue.add(k.clone());
                queued += 1;
            }
        };
        // A cached primary is placed by the object just read, not read again.
        for o in self.store.all() {
            add(&o.key, self.unit_with(&o.key, Some(&o)));
        }
        let deleted: Vec<Key> = self.lock().by_key.keys().cloned().collect();
        for k in deleted.iter().chain(self.fixed.iter()) {
            add(k, self.unit(k));
        }
        queued
    }

    /// Queues every key of each range this replica holds at the start and takes from then on,
    /// once the range is ready ([`KeyShards::ready`]: where the API server filters, once its
    /// objects are listed): the replica that takes a range reconciles all of it (nothing its
    /// previous holder left is forgotten). A range given up and taken again between two looks is
    /// queued again too.
    pub async fn queue_ranges_taken(self, plugin: String, queue: WorkQueue<Key>) {
        let mut changes: Vec<Option<_>> = self
            .sharding
            .units
            .iter()
            .map(|u| Some(u.taking_changes()))
            .collect();
        let mut covered = self.covered.clone();
        // The replicas agreeing on the layout again makes every held range ready again.
        let mut agreed = Some(self.sharding.agreed.clone());
        let mut was_ready = vec![false; changes.len()];
        // The first look queues every ready range, as a taking change would.
        let mut taken: Vec<usize> = (0..changes.len()).collect();
        loop {
            // Every watched channel is marked seen before readiness is read, so a change made
            // while this look runs wakes the next one.
            if let Some(c) = covered.as_mut() {
                c.borrow_and_update();
            }
            if let Some(a) = agreed.as_mut() {
                a.borrow_and_update();
            }
            for (i, t) in changes.iter_mut().enumerate() {
                if let Some(t) = t {
                    t.borrow_and_update();
                }
                let ready = self.ready(&self.sharding.units[i]);
                if ready && (!was_ready[i] || taken.contains(&i)) {
                    let queued = self.queue_range(i, &queue);
                    tracing::info!(
                        plugin,
                        range = i,
                        queued,
                        "a range of the plugin's keys taken: its keys queued"
                    );
                }
                was_ready[i] = ready;
            }
            // A range whose elector is gone (the plugin stopping) is watched no more.
            if changes.iter().all(Option::is_none) {
                return;
            }
            let waits = changes.iter_mut().enumerate().filter_map(|(i, t)| {
                t.as_mut()
                    .map(|t| Box::pin(async move { (i, t.changed().await.is_ok()) }))
            });
            let covered_changed = async {
                match covered.as_mut() {
                    Some(c) => c.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let agreed_changed = async {
                match agreed.as_mut() {
                    Some(a) => a.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            taken.clear();
            // Which range's taking changed (and whether its elector is still there), or None for
            // the covered ranges (and whether their stream is still there) or the agreement.
            // The agreement: whether it changed, and whether its sender is still there.
            let (which, open, agreement) = tokio::select! {
                ((i, open), _, _) = futures::future::select_all(waits) => (Some(i), open, None),
                open = covered_changed => (None, open, None),
                open = agreed_changed => (None, true, Some(open)),
            };
            match agreement {
                // Every ready range is queued again: the keys dropped while the replicas
                // disagreed (even if they agreed again before this look) are reconciled.
                Some(true) => taken.extend(0..changes.len()),
                Some(false) => agreed = None,
                None => {}
            }
            match (which, open) {
                (Some(i), true) => taken.push(i),
                (Some(i), false) => changes[i] = None,
                (None, false) => covered = None,
                (None, true) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletions_are_remembered_within_their_bound_and_a_new_uid_replaces_an_old_one() {
        let mut t = Tombstones::default();
        let key = |i: usize| Key::new(Some("ns"), &format!("o{i}"));
        for i in 0..MAX_TOMBSTONES + 10 {
            t.by_key.insert(key(i), format!("u{i}"));
            t.order.push_back((Instant::now(), key(i), format!("u{i}")));
            t.prune();
        }
        assert_eq!(t.order.len(), MAX_TOMBSTONES);
        assert_eq!(t.by_key.len(), MAX_TOMBSTONES);
        assert!(!t.by_key.contains_key(&key(0)), "the oldest went first");
        assert_eq!(
            t.by_key.get(&key(MAX_TOMBSTONES + 9)).map(String::as_str),
            Some("u65545")
        );
        // The same key deleted again (made again in between): the older entry's expiry leaves
        // the newer UID in place.
        let mut t = Tombstones::default();
        let old = Instant::now() - TOMBSTONE_TTL - Duration::from_secs(1);
        t.order.push_back((old, key(1), "first".into()));
        t.by_key.insert(key(1), "second".into());
        t.order.push_back((Instant::now(), key(1), "second".into()));
        t.prune();
        assert_eq!(t.by_key.get(&key(1)).map(String::as_str), Some("second"));
        assert_eq!(t.order.len(), 1);
    }
}
