//! One controller per running plugin: informers → triggers → work queue → workers → the plugin.
//!
//! The plugin version in use can be swapped while the controller runs (hot reload): the swap waits
//! for in-flight reconciles of the old version to finish, then the workers go on with the new one
//! and the same queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::RwLock;
use tokio::task::JoinHandle;

use crate::cluster::api::{ApiAccess, ApiFailure};
use crate::cluster::election::{Election, Gate};
use crate::cluster::events::PluginEvent;
use crate::cluster::services::{PluginCache, Services};
use crate::contract::change_filter;
use crate::contract::isolation::Isolation;
use crate::contract::mapping::{self, ExtraMapping};
use crate::contract::validate;
use crate::contract::{
    Action, Description, KindKey, KindRef, Mapping, ObjectKey, ReconcileError, Request, Watch,
};
use crate::engine::cache::{CachedObject, Key, ObjectStore};
use crate::engine::informer::{Change, Informer, InformerKey, Informers, canonical_selector};
use crate::engine::queue::WorkQueue;
use crate::engine::rate_limit::{RateLimiter, RateLimits};
use crate::engine::schedule::{ScheduleDebug, ScheduleRecords, ScheduleView, Scheduled, Scheduler};
use crate::engine::sharded::KeyShards;
use crate::metrics::Metrics;
use crate::sandbox::{CallError, Compiled, Limits, Runtime, Warm};

/// A loaded version of a plugin: the compiled component, what it declared, its services and limits.
pub struct Version {
    /// Shared with the loader's memo of compiled components (by digest).
    pub compiled: Arc<Compiled>,
    pub description: Description,
    pub services: Arc<Services>,
    pub limits: Limits,
    pub isolation: Isolation,
    /// Unique per loaded version (a warm instance belongs to one version).
    pub id: u64,
}

impl Version {
    /// A fresh, process-unique version id.
    pub fn next_id() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// How a watch's events become primary keys.
#[derive(Clone)]
enum Trigger {
    Own,
    /// Owner references to the primary kind: the controller one, or all (`any`).
    Owner {
        primary: KindRef,
        primary_namespaced: bool,
        any: bool,
    },
    Fixed(Key),
    Same,
    /// The value of this label names the primary object.
    Label {
        key: String,
        primary_namespaced: bool,
    },
}

/// What the controller needs to run, shared by its tasks.
pub struct ControllerParts {
    pub runtime: Arc<Runtime>,
    pub informers: Arc<Informers>,
    pub api: ApiAccess,
    pub metrics: Arc<Metrics>,
    pub rate_limits: RateLimits,
    /// How long a controller waits for its informers' first list before giving up.
    pub sync_timeout: Duration,
    /// Whether this replica may reconcile each plugin: a standby keeps its caches and queues
    /// warm and takes no key.
    pub election: Arc<Election>,
    /// Where schedules record their last tick (none: no catch-up across restarts).
    pub schedule_records: Option<ScheduleRecords>,
}

pub struct Controller {
    pub name: String,
    queue: WorkQueue<Key>,
    version: Arc<RwLock<Arc<Version>>>,
    tasks: Vec<JoinHandle<()>>,
    /// Held so the informers keep running while the controller does.
    informers: Vec<Arc<Informer>>,
    workers: u32,
    resync: Option<Duration>,
    /// The fixed keys of its triggers, re-added with every primary key when a version is swapped in.
    fixed_keys: Vec<Key>,
    metrics: Arc<Metrics>,
    last_error: LastErrorSlot,
    /// When its workers may take keys; held for as long as the controller runs.
    gate: Gate,
    /// Its schedules as the debug view shows them.
    schedules: ScheduleView,
}

/// A controller dropped without [`Controller::stop`] (a load cancelled while it started or swapped
/// one in, at shutdown) leaves nothing running: its queue closes and its tasks end.
impl Drop for Controller {
    fn drop(&mut self) {
        self.queue.shut_down();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The latest failed reconcile of a controller, for the debug view.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LastError {
    pub key: String,
    /// Escaped and cut to 512 bytes: it may carry a guest's text.
    pub message: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

type LastErrorSlot = Arc<std::sync::Mutex<Option<LastError>>>;

fn note_error(slot: &LastErrorSlot, key: &Key, message: &str) {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastError {
        key: key.to_string(),
        message: validate::log_text(message, 512),
        at,
    });
}

/// What the debug view shows of a running controller.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerDebug {
    pub version: String,
    /// "call" or "worker" (NAME.toml, else the plugin's own declaration, else "call").
    pub isolation: &'static str,
    pub workers: u32,
    pub queue_depth: usize,
    pub in_flight: usize,
    /// Whether this replica reconciles the plugin now, and who holds its Lease.
    pub leading: bool,
    pub leader: Option<String>,
    pub last_error: Option<LastError>,
    pub schedules: Vec<ScheduleDebug>,
    /// A sharded plugin's ranges: what the hash is of, how many, and which this replica holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardsDebug>,
}

/// A sharded plugin's ranges as this replica sees them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardsDebug {
    pub by: crate::engine::shard::ShardBy,
    pub count: usize,
    /// The indexes of the ranges this replica holds.
    pub held: Vec<usize>,
    /// Whether every replica running the plugin runs this layout (`count` and `by`): until they
    /// agree, no replica reconciles its keys.
    pub agreed: bool,
    /// Each range's Lease holder, as this replica last read it.
    pub holders: Vec<Option<String>>,
    /// "api-server": the API server lists and watches only the held ranges' primaries for this
    /// replica (`ShardedListAndWatch`); "host": every primary is cached, and the host divides
    /// the work.
    pub filter: &'static str,
    /// The primaries cached on this replica.
    pub cached: usize,
    /// Held ranges whose primaries are not listed yet (the API server filtering): their keys
    /// wait until the list is in. A range that stays here names a stream whose list keeps
    /// failing (its warning is in the log).
    pub listing: Vec<usize>,
}

/// The informers a description needs, in order: primary first. Two watches may need the same
/// informer (the same kind, namespace, canonical selector and metadata-only).
pub async fn resolve_watches(
    api: &ApiAccess,
    d: &Description,
) -> Result<Vec<(InformerKey, bool)>, ApiFailure> {
    let mut out = Vec::new();
    for w in std::iter::once(&d.primary).chain(d.secondaries.iter().map(|s| &s.watch)) {
        let r = api.resolve(&w.kind).await.map_err(|e| ApiFailure {
            message: format!("cannot watch {}: {}", KindKey::from(&w.kind), e.message),
            ..e
        })?;
        out.push((informer_key(w, &r.plural, r.namespaced), r.namespaced));
    }
    Ok(out)
}

fn informer_key(w: &Watch, plural: &str, namespaced: bool) -> InformerKey {
    InformerKey {
        group: w.kind.group.clone(),
        version: w.kind.version.clone(),
        kind: w.kind.kind.clone(),
        plural: plural.to_string(),
        namespace: if namespaced {
            w.namespace.clone().filter(|n| !n.is_empty())
        } else {
            None
        },
        // Canonical, so selectors written differently share a stream. Validated at load; text
        // that does not parse (never here) would keep its own spelling.
        label_selector: w.label_selector.as_deref().and_then(|s| {
            canonical_selector(s)
                .unwrap_or_else(|_| Some(s.trim().to_string()).filter(|t| !t.is_empty()))
        }),
        metadata_only: w.metadata_only,
        shard: None,
    }
}

/// Builds the cache view of a plugin from its informers (primary first).
pub fn plugin_cache(informers: &[Arc<Informer>]) -> PluginCache {
    let mut cache = PluginCache::default();
    for i in informers {
        let k = &i.key;
        cache.add(
            KindKey {
                group: k.group.clone(),
                version: k.version.clone(),
                kind: k.kind.clone(),
            },
            k.namespace.clone(),
            i.store().clone(),
            k.metadata_only,
        );
    }
    cache
}

impl Controller {
    /// Starts informers (shared), waits for their initial lists, then starts the workers.
    pub async fn start(
        parts: &ControllerParts,
        informers: Vec<Arc<Informer>>,
        namespaced: Vec<bool>,
        version: Version,
        workers: u32,
        resync: Option<Duration>,
        gate: Gate,
    ) -> Result<Controller, String> {
        let name = version.description.name.clone();
        let queue = WorkQueue::with_observer(
            RateLimiter::new(parts.rate_limits),
            parts.metrics.queue_observer(&name),
        );
        let d = &version.description;
        let primary_kind = d.primary.kind.clone();
        let primary_namespaced = namespaced.first().copied().unwrap_or(true);
        let mut triggers = vec![Trigger::Own];
        // Validated at load, like the filters below.
        let extended = mapping::mappings(d).unwrap_or_default();
        for (i, s) in d.secondaries.iter().enumerate() {
            let owner = |any| Trigger::Owner {
                primary: primary_kind.clone(),
                primary_namespaced,
                any,
            };
            triggers.push(match (extended.get(i).cloned().flatten(), &s.mapping) {
                (Some(ExtraMapping::AnyOwner), _) => owner(true),
                (Some(ExtraMapping::Label(key)), _) => Trigger::Label {
                    key,
                    primary_namespaced,
                },
                (None, Mapping::ControllerOwner) => owner(false),
                (None, Mapping::FixedKey(k)) => {
                    Trigger::Fixed(Key::new(k.namespace.as_deref(), &k.name))
                }
                (None, Mapping::SameKey) => Trigger::Same,
            });
        }
        let fixed_keys: Vec<Key> = triggers
            .iter()
            .filter_map(|t| {
                if let Trigger::Fixed(k) = t {
                    Some(k.clone())
                } else {
                    None
                }
            })
            .collect();

        let primary_store = informers
            .first()
            .map(|i| i.store().clone())
            .unwrap_or_default();
        // A sharded plugin: only the keys of the ranges this replica holds are queued and taken.
        // Where the API server filters by range, the primary stream says which ranges it has.
        let sharded_primary = informers.first().filter(|i| i.key.shard.is_some());
        let shards = gate.sharding.clone().map(|sharding| {
            let covered = sharded_primary.map(|i| i.covered());
            let s = KeyShards::new(sharding, primary_store.clone(), covered, &fixed_keys);
            match sharded_primary {
                Some(i) => s.with_live_reads(parts.informers.client().clone(), i.key.clone()),
                None => s,
            }
        });
        // Validated at load; a description that got here has well-formed filters.
        let filters = change_filter::filters(d).unwrap_or_default();
        // Keys past the cap of one change: logged at most once a minute for the plugin.
        let capped_logged: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
        let mut tasks = Vec::new();
        for (i, (informer, trigger)) in informers.iter().zip(triggers).enumerate() {
            let mut rx = informer.subscribe();
            let q = queue.clone();
            let filter = filters.get(i).copied().unwrap_or_default();
            let (metrics, plugin) = (parts.metrics.clone(), name.clone());
            let capped_logged = capped_logged.clone();
            let shards = shards.clone();
            let own = matches!(trigger, Trigger::Own);
            tasks.push(tokio::spawn(async move {
                while let Some(change) = rx.recv().await {
                    // A deleted primary's key stays in its range for a while (sharded by uid).
                    if let (true, Some(s), Change::Deleted { old }) = (own, &shards, &change) {
                        s.deleted(&old.key, &old.uid);
                    }
                    if let Change::Applied {
                        old: Some(old),
                        new,
                    } = &change
                        && !filter.passes(&old.json, &new.json)
                    {
                        metrics.change_filtered(&plugin);
                        continue;
                    }
                    let (keys, dropped) = keys_for(&trigger, &change);
                    if let (Some(s), Trigger::Owner { .. }) = (&shards, &trigger) {
                        for k in &keys {
                            if let Some(uid) = owner_uid(&change, &k.name) {
                                s.owned_by(k, uid);
                            }
                        }
                    }
                    if dropped > 0 {
                        metrics.mapped_keys_dropped(&plugin, dropped);
                        let mut last = capped_logged.lock().unwrap_or_else(|p| p.into_inner());
                        if last.is_none_or(|t| t.elapsed() >= CAPPED_LOG_INTERVAL) {
                            *last = Some(Instant::now());
                            tracing::warn!(
                                plugin,
                                dropped,
                                "a change mapped to more than {MAX_KEYS_PER_CHANGE} primary keys: \
                                 the rest were not queued (the resync reaches them; \
                                 wcm_mapped_keys_dropped_total counts them)"
                            );
                        }
                    }
                    for key in keys {
                        if shards.as_ref().is_none_or(|s| s.mine(&key)) {
                            q.add(key);
                        }
                    }
                }
            }));
        }
        // An informer the API server refuses (the host's own RBAC) or cannot serve never syncs:
        // give up after a while instead of waiting for ever, and let the loader retry.
        for i in &informers {
            if tokio::time::timeout(parts.sync_timeout, i.wait_synced())
                .await
                .is_err()
            {
                for t in &tasks {
                    t.abort();
                }
                return Err(format!(
                    "the cache of {} did not sync within {:?}: may the host's own identity list and watch it?",
                    i.key.plural, parts.sync_timeout
                ));
            }
        }
        if let Some(period) = resync.filter(|p| !p.is_zero()) {
            let (q, store, fixed) = (queue.clone(), primary_store.clone(), fixed_keys.clone());
            let shards = shards.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                let mine = |k: &Key| shards.as_ref().is_none_or(|s| s.mine(k));
                loop {
                    tick.tick().await;
                    for o in store.all() {
                        if mine(&o.key) {
                            q.add(o.key.clone());
                        }
                    }
                    for k in fixed.iter().filter(|k| mine(k)) {
                        q.add(k.clone());
                    }
                }
            }));
        }
        if let Some(s) = &shards {
            tasks.push(tokio::spawn(
                s.clone().queue_ranges_taken(name.clone(), queue.clone()),
            ));
        }
        {
            let (q, metrics, plugin) = (queue.clone(), parts.metrics.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(500));
                loop {
                    tick.tick().await;
                    metrics.unfinished_work(&plugin, q.unfinished_work());
                }
            }));
        }
        let scheduled = Scheduled::default();
        let schedules = ScheduleView::default();
        if !version.description.schedules.is_empty() {
            let scheduler = Scheduler {
                plugin: name.clone(),
                schedules: version.description.schedules.clone(),
                records: parts.schedule_records.clone(),
                queue: queue.clone(),
                primary: primary_store.clone(),
                scheduled: scheduled.clone(),
                taking: gate.taking.clone(),
                metrics: parts.metrics.clone(),
                view: schedules.clone(),
            };
            tasks.push(tokio::spawn(scheduler.run()));
        }
        let version = Arc::new(RwLock::new(Arc::new(version)));
        let last_error = LastErrorSlot::default();
        parts.metrics.workers(&name, workers);
        for _ in 0..workers.max(1) {
            let w = Worker {
                name: name.clone(),
                queue: queue.clone(),
                store: primary_store.clone(),
                primary: primary_kind.clone(),
                version: version.clone(),
                runtime: parts.runtime.clone(),
                metrics: parts.metrics.clone(),
                gate: gate.clone(),
                last_error: last_error.clone(),
                scheduled: scheduled.clone(),
                shards: shards.clone(),
            };
            tasks.push(tokio::spawn(w.run()));
        }
        tracing::info!(plugin = %name, workers, informers = informers.len(), "controller started");
        Ok(Controller {
            name,
            queue,
            version,
            tasks,
            informers,
            workers,
            resync,
            fixed_keys,
            metrics: parts.metrics.clone(),
            last_error,
            gate,
            schedules,
        })
    }

    /// Switches to a new version with the same watches, keeping the queue. Waits for in-flight
    /// reconciles of the old version first.
    /// Then every key is reconciled again by the new version: a key that failed (terminally) with
    /// the old code or settings gets its chance with the new ones, as after a restart.
    pub async fn swap(&self, new: Version) {
        // A call still waiting for an instance slot gives up (the key is reconciled again below),
        // so the swap waits only for calls that run.
        self.version().await.services.retire();
        let mut guard = self.version.write().await;
        *guard = Arc::new(new);
        drop(guard);
        if let Some(primary) = self.informers.first() {
            for o in primary.store().all() {
                self.queue.forget(&o.key);
                self.queue.add(o.key.clone());
            }
        }
        for k in &self.fixed_keys {
            self.queue.forget(k);
            self.queue.add(k.clone());
        }
    }

    /// Whether a new description can run in this controller as it is: the same informers, workers,
    /// secondaries (mappings) and resync. Anything else needs a new controller.
    pub async fn fits(
        &self,
        keys: &[InformerKey],
        workers: u32,
        description: &Description,
        resync: Option<Duration>,
    ) -> bool {
        let current = self.version().await;
        self.informer_keys() == keys
            && self.workers == workers
            && self.resync == resync
            && current.description.secondaries == description.secondaries
            && current.description.primary == description.primary
            && change_filter::filters(&current.description) == change_filter::filters(description)
            && mapping::mappings(&current.description) == mapping::mappings(description)
            && current.description.schedules == description.schedules
    }

    pub async fn version(&self) -> Arc<Version> {
        self.version.read().await.clone()
    }

    pub fn informer_keys(&self) -> Vec<InformerKey> {
        self.informers.iter().map(|i| i.key.clone()).collect()
    }

    pub fn queue(&self) -> &WorkQueue<Key> {
        &self.queue
    }

    /// Stops taking keys, waits for in-flight reconciles, and releases the informers.
    pub async fn stop(mut self) {
        self.queue.shut_down();
        // A call still waiting for an instance slot gives up: the stop waits only for calls that run.
        self.version().await.services.retire();
        // Triggers and resync first, so nothing new arrives; workers end when the queue is empty.
        let _write = self.version.write().await;
        for t in &self.tasks {
            t.abort();
        }
        self.metrics.workers(&self.name, 0);
        // A worker aborted while waiting for its call's turn never counted itself out.
        self.metrics.reset_active_workers(&self.name);
        self.metrics.unfinished_work(&self.name, (0.0, 0.0));
        tracing::info!(plugin = %self.name, "controller stopped");
        self.informers.clear();
    }

    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Its version, queue and latest failure, for the debug view. Never waits: during a version
    /// swap the version reads as such.
    pub fn debug(&self) -> ControllerDebug {
        ControllerDebug {
            version: self
                .version
                .try_read()
                .map(|v| v.description.version.clone())
                .unwrap_or_else(|_| "(being swapped)".into()),
            isolation: match self.version.try_read().map(|v| v.isolation) {
                Ok(Isolation::Worker) => "worker",
                Ok(Isolation::Call) => "call",
                Err(_) => "(being swapped)",
            },
            workers: self.workers,
            queue_depth: self.queue.len(),
            in_flight: self.gate.in_flight.load(Ordering::Relaxed),
            leading: self.gate.is_taking(),
            leader: self.gate.leader(),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            schedules: self
                .schedules
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            shards: self.gate.sharding.as_ref().map(|s| {
                // Where the API server filters by range, the primary stream is the plugin's own.
                let sharded_primary = self.informers.first().filter(|i| i.key.shard.is_some());
                let covered = sharded_primary.map(|i| i.covered().borrow().clone());
                ShardsDebug {
                    by: s.by,
                    count: s.units.len(),
                    held: s.held(),
                    agreed: s.agreed(),
                    holders: s.units.iter().map(|u| u.leader()).collect(),
                    filter: if sharded_primary.is_some() {
                        "api-server"
                    } else {
                        "host"
                    },
                    cached: self.informers.first().map_or(0, |i| i.store().len()),
                    listing: covered.map_or_else(Vec::new, |covered| {
                        s.units
                            .iter()
                            .filter(|u| u.holds() && !covered.contains(&u.range))
                            .map(|u| u.index)
                            .collect()
                    }),
                }
            }),
        }
    }

    /// A sharded plugin's ranges: how many, and by what.
    pub fn sharded(&self) -> Option<(u32, crate::engine::shard::ShardBy)> {
        self.gate
            .sharding
            .as_ref()
            .map(|s| (s.units.len() as u32, s.by))
    }
}

/// The most primary keys one change of a watched object may queue. An `any-owner` mapping names
/// a key per owner reference, and anyone who may create objects where the plugin watches may
/// give one thousands (a label mapping names at most two: the old and the new value).
pub const MAX_KEYS_PER_CHANGE: usize = 32;

/// How often a plugin's changes capped at [`MAX_KEYS_PER_CHANGE`] are logged at most.
const CAPPED_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The primary keys a change maps to (at most [`MAX_KEYS_PER_CHANGE`], in the order of the
/// object's references: old object first), and how many more were left out.
fn keys_for(trigger: &Trigger, change: &Change) -> (Vec<Key>, usize) {
    let (old, new) = match change {
        Change::Applied { old, new } => (old.as_ref(), Some(new)),
        Change::Deleted { old } => (Some(old), None),
    };
    let objs: Vec<&Arc<CachedObject>> = old.into_iter().chain(new).collect();
    let mut keys: Vec<Key> = match trigger {
        Trigger::Own | Trigger::Same => objs.iter().map(|o| o.key.clone()).collect(),
        Trigger::Fixed(k) => vec![k.clone()],
        Trigger::Owner {
            primary,
            primary_namespaced,
            any,
        } => objs
            .iter()
            .flat_map(|o| {
                let ns = primary_namespaced
                    .then_some(o.key.namespace.as_deref())
                    .flatten();
                o.owners
                    .iter()
                    .filter(|owner| *any || owner.controller)
                    .filter(|owner| {
                        let (group, _) = split_api_version(&owner.api_version);
                        owner.kind == primary.kind && group == primary.group
                    })
                    .map(move |owner| Key::new(ns, &owner.name))
            })
            .collect(),
        Trigger::Label {
            key,
            primary_namespaced,
        } => objs
            .iter()
            .filter_map(|o| {
                let name = o.labels.get(key)?;
                // A label value is the object's to set: only a valid name becomes a key.
                validate::name(name).ok()?;
                let ns = primary_namespaced
                    .then_some(o.key.namespace.as_deref())
                    .flatten();
                Some(Key::new(ns, name))
            })
            .collect(),
    };
    // Distinct keys in their first order, at most the cap (dedup by a set: an object may repeat
    // a reference).
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    let dropped = keys.len().saturating_sub(MAX_KEYS_PER_CHANGE);
    keys.truncate(MAX_KEYS_PER_CHANGE);
    keys.sort();
    (keys, dropped)
}

/// The UID an owner reference named `name` in the changed object carries (the newer object's
/// first).
fn owner_uid<'a>(change: &'a Change, name: &str) -> Option<&'a str> {
    let objs: Vec<&'a Arc<CachedObject>> = match change {
        Change::Applied { old, new } => std::iter::once(new).chain(old.as_ref()).collect(),
        Change::Deleted { old } => vec![old],
    };
    objs.into_iter()
        .flat_map(|o| o.owners.iter())
        .find(|o| o.name == name)
        .map(|o| o.uid.as_str())
}

fn split_api_version(av: &str) -> (&str, &str) {
    match av.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", av),
    }
}

/// One reconcile counted in a plugin's in-flight number for as long as it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(n: &Arc<AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::SeqCst);
        InFlight(n.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Worker {
    name: String,
    queue: WorkQueue<Key>,
    store: Arc<ObjectStore>,
    primary: KindRef,
    version: Arc<RwLock<Arc<Version>>>,
    runtime: Arc<Runtime>,
    metrics: Arc<Metrics>,
    gate: Gate,
    last_error: LastErrorSlot,
    /// Keys a schedule's tick enqueued (the schedule's name goes with the request).
    scheduled: Scheduled,
    /// A sharded plugin: a key is reconciled only while this replica holds its range, and its
    /// writes go under that range's tenure.
    shards: Option<KeyShards>,
}

/// The longest a worker waits for a token of its plugin's API budget before it reads whether a
/// deleted primary was made again; past it the key is tried again after that long.
const LIVE_READ_MAX_WAIT: Duration = Duration::from_secs(1);

/// When a key whose read of whether its deleted primary was made again failed is tried again.
const LIVE_READ_RETRY: Duration = Duration::from_secs(5);

/// How long an idle worker keeps a warm instance that holds a shared slot of the instance pool.
const IDLE_WARM_ON_SHARED_SLOT: Duration = Duration::from_secs(5);

impl Worker {
    async fn run(mut self) {
        // The warm instance (isolation = "worker") and the version it belongs to.
        let mut warm: (Option<Warm>, u64) = (None, 0);
        loop {
            // A standby (or a replica that lost its lease) takes no key until it leads, and holds
            // no instance meanwhile.
            if !self.gate.is_taking() {
                warm = (None, 0);
            }
            if self.gate.taking.wait_for(|leading| *leading).await.is_err() {
                return;
            }
            // A warm instance on a shared slot of the pool is given back once its worker idles
            // (an idle worker could otherwise keep it from every other plugin for good); one in
            // the plugin's own slot stays. `get` is cancel-safe: a key is taken only on return.
            let key = if warm.0.as_ref().is_some_and(Warm::on_shared_slot) {
                match tokio::time::timeout(IDLE_WARM_ON_SHARED_SLOT, self.queue.get()).await {
                    Ok(key) => key,
                    Err(_) => {
                        warm = (None, 0);
                        continue;
                    }
                }
            } else {
                self.queue.get().await
            };
            let Some(key) = key else {
                return;
            };
            if !self.gate.is_taking() {
                // Leadership went while waiting for this key: it stays queued for later.
                self.queue.add(key.clone());
                self.queue.done(&key);
                continue;
            }
            // The primary read once: the range is chosen by, and the plugin is handed, the same
            // object. A sharded plugin's key is counted in its range's in-flight reconciles first
            // (the range's Lease is not given up while one runs), then taken only if the range is
            // still held; its writes go under the range's tenure (else the plugin's).
            let object = self.store.get(&key);
            let (range_in_flight, tenure) = match &self.shards {
                Some(s) => {
                    let unit = s.unit_with(&key, object.as_deref());
                    let counted = unit.map(|u| InFlight::enter(u.in_flight()));
                    match unit.filter(|u| s.ready(u)) {
                        Some(u) => (counted, u.tenure().clone()),
                        None => {
                            // Not this replica's (any more): the holder of its range queued it.
                            drop(counted);
                            self.scheduled
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .remove(&key);
                            self.queue.forget(&key);
                            self.queue.done(&key);
                            continue;
                        }
                    }
                }
                None => (None, self.gate.tenure.clone()),
            };
            // Server-side by UID, a primary this replica saw deleted may have been made again
            // under its name, in another replica's range: that replica reconciles it, and this
            // one does not reconcile it as deleted meanwhile.
            if object.is_none()
                && let Some(s) = &self.shards
                && let Some(dead) = s.deleted_uid(&key)
            {
                // The read is the host's, made for the plugin's key: it takes a token of the
                // plugin's API budget, so no object can drive the host's reads past what the
                // plugin may make itself. A key refused a token, or whose read failed, is tried
                // again after a fixed delay, not counted as a failure: its backoff must not
                // outlast the deletion record that places it.
                let v = self.version.read().await.clone();
                let read = if !s.reads_live(&key) {
                    Some(Ok(None))
                } else if let Some(wait) =
                    v.services.budgets().api.reserve_within(LIVE_READ_MAX_WAIT)
                {
                    tokio::time::sleep(wait).await;
                    Some(s.live_uid(&key).await)
                } else {
                    None
                };
                let skip = match read {
                    // Made again: the key follows the new object's range from now on.
                    Some(Ok(Some(uid))) if uid != dead => {
                        s.made_again(&key, &uid);
                        true
                    }
                    // Still there, not yet in this replica's cache (a moment behind): later.
                    Some(Ok(Some(_))) => {
                        self.queue.add_rate_limited(key.clone());
                        true
                    }
                    Some(Ok(None)) => false,
                    Some(Err(e)) => {
                        if v.services.budgets().log_line() {
                            tracing::warn!(
                                plugin = %self.name,
                                key = %wcm_validate::shown(&key.to_string()),
                                "could not read whether a deleted primary was made again (retrying in {LIVE_READ_RETRY:?}): {e}"
                            );
                        }
                        self.queue.add_after(key.clone(), LIVE_READ_RETRY);
                        true
                    }
                    // The plugin's API budget is spent for now.
                    None => {
                        self.queue.add_after(key.clone(), LIVE_READ_MAX_WAIT);
                        true
                    }
                };
                if skip {
                    drop(range_in_flight);
                    self.queue.done(&key);
                    continue;
                }
            }
            self.metrics.active_workers(&self.name, 1);
            // Counted out on drop: also when the task is aborted mid-call at a stop.
            let in_flight = InFlight::enter(&self.gate.in_flight);
            let outcome = crate::cluster::services::KEY_TENURE
                .scope(
                    tenure,
                    std::panic::AssertUnwindSafe(self.process(&key, object, &mut warm))
                        .catch_unwind(),
                )
                .await;
            self.metrics.active_workers(&self.name, -1);
            drop(in_flight);
            drop(range_in_flight);
            if outcome.is_err() {
                // A bug on the host's side of this call: the worker carries on (with a fresh
                // instance), and the key is retried with backoff instead of staying in flight.
                warm = (None, 0);
                self.metrics.worker_panic(&self.name);
                note_error(
                    &self.last_error,
                    &key,
                    "the host panicked while reconciling",
                );
                tracing::error!(plugin = %self.name, %key, "a worker panicked while reconciling; the key is retried");
                self.queue.add_rate_limited(key.clone());
            }
            self.queue.done(&key);
        }
    }

    async fn process(
        &self,
        key: &Key,
        object: Option<Arc<CachedObject>>,
        warm: &mut (Option<Warm>, u64),
    ) {
        // Off unless asked for (`--log …engine::controller=debug`); the compare benchmark times
        // watch delivery → reconcile start from it.
        tracing::debug!(plugin = %self.name, %key, "reconcile started");
        let req = Request {
            key: ObjectKey {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
            },
            object: object.as_ref().map(|o| o.json.to_string()),
            attempt: self.queue.num_requeues(key),
            // Kept until a reconcile succeeds: a retry still knows its tick.
            scheduled: self
                .scheduled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .cloned(),
        };
        // Holding the read lock for the call lets a version swap wait for in-flight calls.
        let guard = self.version.read().await;
        let v = guard.clone();
        let started = Instant::now();
        // The reconcile's trace (exported only with --otlp-endpoint); its host calls are its
        // children.
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "reconcile",
            otel.name = %format!("reconcile {}", self.name),
            wcm.plugin = %self.name,
            wcm.plugin.version = %v.description.version,
            wcm.key = %key,
            wcm.attempt = req.attempt,
            wcm.scheduled = req.scheduled.as_deref().unwrap_or(""),
            wcm.result = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let result = tracing::Instrument::instrument(self.call(&v, &req, warm), span.clone()).await;
        span.record(
            "wcm.result",
            match &result {
                Ok(Ok(Action::Done)) => "done",
                Ok(Ok(Action::RequeueAfter(_))) => "requeue",
                Ok(Err(e)) if e.terminal => "terminal-error",
                Ok(Err(_)) => "error",
                Err(_) => "call-failed",
            },
        );
        if !matches!(result, Ok(Ok(_))) {
            span.record("otel.status_code", "ERROR");
        }
        drop(span);
        drop(guard);
        if matches!(
            result,
            Ok(Ok(_)) | Ok(Err(ReconcileError { terminal: true, .. }))
        ) {
            self.scheduled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
        }
        let took = started.elapsed();
        self.settle(key, &req, &v, object.as_ref(), result, took);
    }

    async fn call(
        &self,
        v: &Version,
        req: &Request,
        warm: &mut (Option<Warm>, u64),
    ) -> Result<Result<Action, crate::contract::ReconcileError>, CallError> {
        match v.isolation {
            Isolation::Call => {
                self.runtime
                    .reconcile(&v.compiled, v.services.clone(), &v.limits, req)
                    .await
            }
            Isolation::Worker => {
                // A new version never reuses the old version's instance.
                if warm.1 != v.id {
                    *warm = (None, v.id);
                }
                self.runtime
                    .reconcile_warm(&v.compiled, v.services.clone(), &v.limits, req, &mut warm.0)
                    .await
            }
        }
    }

    /// What follows a reconcile: the key forgotten, requeued or retried, the metrics, the log.
    fn settle(
        &self,
        key: &Key,
        req: &Request,
        v: &Version,
        object: Option<&Arc<CachedObject>>,
        result: Result<Result<Action, crate::contract::ReconcileError>, CallError>,
        took: Duration,
    ) {
        match result {
            Ok(Ok(Action::Done)) => {
                self.queue.forget(key);
                self.metrics.reconciled(&self.name, "success", took);
            }
            // Requeue now (controller-runtime's `Requeue: true`): again soon, with the key's
            // backoff, so a plugin that always asks for it cannot spin.
            Ok(Ok(Action::RequeueAfter(0))) => {
                self.queue.add_rate_limited(key.clone());
                self.metrics.reconciled(&self.name, "requeue", took);
            }
            Ok(Ok(Action::RequeueAfter(ms))) => {
                self.queue.forget(key);
                // Never sooner than the plugin's floor: `requeue-after(1 ms)` cannot spin.
                self.queue.add_requeue_after(
                    key.clone(),
                    Duration::from_millis(ms),
                    v.services.budgets.min_requeue_after,
                );
                self.metrics.reconciled(&self.name, "requeue_after", took);
            }
            Ok(Err(e)) if e.terminal => {
                note_error(&self.last_error, key, &format!("terminal: {}", e.message));
                self.queue.forget(key);
                self.metrics.reconciled(&self.name, "error", took);
                self.metrics.terminal_error(&self.name);
                if v.services.budgets.log_line() {
                    let message = validate::log_text(&e.message, 4096);
                    tracing::error!(plugin = %self.name, %key, "terminal reconcile error (not retried): {message}");
                }
                if let Some(o) = object {
                    v.services
                        .record_event(self.failure_event(o, &e.message), &self.primary);
                }
            }
            Ok(Err(e)) => {
                note_error(&self.last_error, key, &e.message);
                self.metrics.reconciled(&self.name, "error", took);
                if v.services.budgets.log_line() {
                    let message = validate::log_text(&e.message, 4096);
                    tracing::warn!(plugin = %self.name, %key, attempt = req.attempt, retry_after_ms = e.retry_after_ms, "reconcile error, retrying: {message}");
                }
                match e.retry_after_ms {
                    // The plugin said when to come back (an outside API's Retry-After): bounded.
                    Some(ms) => self.queue.add_failed_after(
                        key.clone(),
                        Duration::from_millis(ms).min(MAX_RETRY_AFTER),
                    ),
                    None => self.queue.add_rate_limited(key.clone()),
                }
            }
            Err(call_error) => {
                note_error(&self.last_error, key, &call_error.to_string());
                self.metrics.reconciled(&self.name, "error", took);
                self.metrics
                    .plugin_failure(&self.name, failure_reason(&call_error));
                if v.services.budgets.log_line() {
                    // A trap carries the guest's panic text: escaped like any guest string.
                    let why = validate::log_text(&call_error.to_string(), 4096);
                    tracing::error!(plugin = %self.name, %key, attempt = req.attempt, "plugin call failed, retrying with backoff: {why}");
                }
                self.queue.add_rate_limited(key.clone());
            }
        }
    }

    fn failure_event(&self, o: &CachedObject, message: &str) -> PluginEvent {
        let api_version = if self.primary.group.is_empty() {
            self.primary.version.clone()
        } else {
            format!("{}/{}", self.primary.group, self.primary.version)
        };
        PluginEvent {
            api_version,
            kind: self.primary.kind.clone(),
            namespace: o.key.namespace.clone(),
            name: o.key.name.clone(),
            uid: Some(o.uid.clone()),
            warning: true,
            reason: "ReconcileFailed".into(),
            action: "Reconcile".into(),
            note: validate::truncate(message, 1024).to_string(),
        }
    }
}

/// The longest retry delay a plugin may ask for (a longer one is cut to this).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

pub fn failure_reason(e: &CallError) -> &'static str {
    match e {
        CallError::Deadline(_) => "deadline",
        CallError::Memory(_) => "memory",
        CallError::Trap(_) => "trap",
        CallError::Limit(_) => "limit",
        CallError::Instantiate(_) => "instantiate",
        CallError::WallTimeout(_) => "timeout",
        CallError::PoolFull(_) => "pool_full",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, owner: Option<(&str, &str, &str)>) -> Arc<CachedObject> {
        let mut meta = json!({"name": name, "namespace": ns, "uid": "u", "resourceVersion": "1"});
        if let Some((av, kind, oname)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": av, "kind": kind, "name": oname, "uid": "o", "controller": true}]);
        }
        Arc::new(CachedObject::from_value(json!({"metadata": meta})).expect("object"))
    }

    #[test]
    fn triggers_map_changes_to_primary_keys() {
        let rs = KindRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "ReplicaSet".into(),
        };
        let owner = Trigger::Owner {
            primary: rs,
            primary_namespaced: true,
            any: false,
        };
        let owned = Change::Applied {
            old: None,
            new: pod("a", "p", Some(("apps/v1", "ReplicaSet", "rs1"))),
        };
        assert_eq!(keys_for(&owner, &owned).0, vec![Key::new(Some("a"), "rs1")]);
        let other_owner = Change::Applied {
            old: None,
            new: pod("a", "p", Some(("batch/v1", "Job", "j"))),
        };
        assert!(keys_for(&owner, &other_owner).0.is_empty());
        // An owner that changes wakes both the old and the new owner.
        let moved = Change::Applied {
            old: Some(pod("a", "p", Some(("apps/v1", "ReplicaSet", "rs1")))),
            new: pod("a", "p", Some(("apps/v1", "ReplicaSet", "rs2"))),
        };
        assert_eq!(
            keys_for(&owner, &moved).0,
            vec![Key::new(Some("a"), "rs1"), Key::new(Some("a"), "rs2")]
        );
        let fixed = Trigger::Fixed(Key::new(None, "pod-count"));
        assert_eq!(
            keys_for(
                &fixed,
                &Change::Deleted {
                    old: pod("b", "q", None)
                }
            )
            .0,
            vec![Key::new(None, "pod-count")]
        );
        assert_eq!(
            keys_for(
                &Trigger::Own,
                &Change::Deleted {
                    old: pod("b", "q", None)
                }
            )
            .0,
            vec![Key::new(Some("b"), "q")]
        );
    }

    #[test]
    fn any_owner_and_label_mappings_find_every_primary_they_name() {
        let deployment = KindRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
        };
        let shared = Arc::new(
            CachedObject::from_value(json!({"metadata": {
                "name": "cm", "namespace": "a", "uid": "u", "resourceVersion": "1",
                "labels": {"example.com/app": "web", "bad": "a/../b"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d1", "uid": "1", "controller": true},
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d2", "uid": "2"},
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "3"}
                ]
            }}))
            .expect("object"),
        );
        let change = Change::Applied {
            old: None,
            new: shared,
        };
        let owner = |any| Trigger::Owner {
            primary: deployment.clone(),
            primary_namespaced: true,
            any,
        };
        assert_eq!(
            keys_for(&owner(false), &change).0,
            vec![Key::new(Some("a"), "d1")]
        );
        assert_eq!(
            keys_for(&owner(true), &change).0,
            vec![Key::new(Some("a"), "d1"), Key::new(Some("a"), "d2")]
        );
        let label = |key: &str, primary_namespaced| Trigger::Label {
            key: key.into(),
            primary_namespaced,
        };
        assert_eq!(
            keys_for(&label("example.com/app", true), &change).0,
            vec![Key::new(Some("a"), "web")]
        );
        assert_eq!(
            keys_for(&label("example.com/app", false), &change).0,
            vec![Key::new(None, "web")]
        );
        // No such label, or a value that is not a name: no key.
        assert!(keys_for(&label("missing", true), &change).0.is_empty());
        assert!(keys_for(&label("bad", true), &change).0.is_empty());
    }

    #[test]
    fn an_object_with_500_owner_references_queues_at_most_32_keys_per_change() {
        let owners: Vec<_> = (0..500)
            .map(|i| json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("d{i:03}"), "uid": format!("{i}")}))
            .collect();
        let object = |owners: &[serde_json::Value]| {
            Arc::new(
                CachedObject::from_value(json!({"metadata": {
                    "name": "cm", "namespace": "a", "uid": "u", "resourceVersion": "1",
                    "ownerReferences": owners
                }}))
                .expect("object"),
            )
        };
        let any_owner = Trigger::Owner {
            primary: KindRef {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
            },
            primary_namespaced: true,
            any: true,
        };
        let created = Change::Applied {
            old: None,
            new: object(&owners),
        };
        let (keys, dropped) = keys_for(&any_owner, &created);
        assert_eq!(keys.len(), 32);
        assert_eq!(dropped, 500 - 32);
        // The first references, in the object's order.
        assert_eq!(keys.first(), Some(&Key::new(Some("a"), "d000")));
        assert_eq!(keys.last(), Some(&Key::new(Some("a"), "d031")));
        // An update that moves all 500 still queues 32 in all (the old owners first).
        let moved: Vec<_> = (0..500)
            .map(|i| json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("e{i:03}"), "uid": format!("e{i}")}))
            .collect();
        let update = Change::Applied {
            old: Some(object(&owners)),
            new: object(&moved),
        };
        let (keys, dropped) = keys_for(&any_owner, &update);
        assert_eq!(
            (keys.len(), dropped),
            (MAX_KEYS_PER_CHANGE, 1000 - MAX_KEYS_PER_CHANGE)
        );
        // A few owners: all of them, nothing dropped.
        let few = Change::Applied {
            old: None,
            new: object(&owners[..3]),
        };
        assert_eq!(keys_for(&any_owner, &few).1, 0);
        assert_eq!(keys_for(&any_owner, &few).0.len(), 3);
    }
}
