//! Shared informers: one list+watch per (kind, namespace, label selector, metadata-only) for every
//! plugin that needs it, reference-counted. The first plugin that asks starts it; when the last
//! handle goes, its watch stops. The selector of a key is in canonical form
//! ([`canonical_selector`]), so selectors that differ only in spelling share one stream.
//!
//! kube-runtime's `watcher` does the list+watch, relists on 410 Gone and reconnects with backoff;
//! this module keeps the cache (objects stored once, as JSON) and fans changes out to subscribers,
//! coalesced per object so a slow subscriber holds at most one change per object.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ObjectMeta};
use kube::core::{ApiResource, DynamicResourceScope};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::engine::cache::{CachedObject, Key, ObjectParts, ObjectStore};
use crate::engine::shard::{Range, ShardBy, holds, selector};
use crate::engine::subscription::{self, Sender, Subscription};

/// What selects the objects of one informer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InformerKey {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    /// Only this namespace; None for all (or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// In canonical form ([`canonical_selector`]); None selects everything.
    pub label_selector: Option<String>,
    pub metadata_only: bool,
    /// A sharded plugin's own stream of its primary kind: only the objects of the ranges this
    /// replica holds (`shardSelector`, KEP-5866), which change as it takes and gives up ranges.
    /// None: every object, shared by every plugin that needs the stream.
    pub shard: Option<ShardedStream>,
}

/// Whose ranges a sharded stream follows: one plugin's on this replica (two plugins' elections
/// hold different ranges, so the stream is the plugin's own), in one layout (another count of
/// ranges is another election, so another stream).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardedStream {
    pub by: ShardBy,
    pub count: u32,
    pub plugin: String,
}

impl InformerKey {
    pub fn api_resource(&self) -> ApiResource {
        let api_version = if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version,
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

impl std::fmt::Display for InformerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.plural)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(ns) = &self.namespace {
            write!(f, " in {ns}")?;
        }
        if let Some(sel) = &self.label_selector {
            write!(f, " [{sel}]")?;
        }
        if self.metadata_only {
            write!(f, " (metadata)")?;
        }
        if let Some(s) = &self.shard {
            write!(f, " (sharded by {} in {} for {})", s.by, s.count, s.plugin)?;
        }
        Ok(())
    }
}

/// The canonical form of a label selector (already valid: `validate::label_selector`), so that
/// selectors which differ only in how they are written name one informer key, one list+watch
/// stream: whitespace gone, `==` written `=`, the values of a set sorted and deduplicated, the
/// requirements sorted and deduplicated, joined by `,`. `None` for a selector with no requirement
/// (it selects everything). Only rewrites that keep the meaning for the API server are made:
/// `x in (a)` stays a set and is not turned into `x=a`, so what the API server accepts or refuses
/// is unchanged.
pub fn canonical_selector(text: &str) -> Result<Option<String>, String> {
    // The same acceptance as every other use of a selector in the host.
    crate::selector::Selector::parse(text)?;
    let mut reqs = BTreeSet::new();
    for part in wcm_selector::split_top_level(text) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        reqs.insert(
            canonical_requirement(part)
                .ok_or_else(|| format!("invalid label selector requirement {part:?}"))?,
        );
    }
    Ok((!reqs.is_empty()).then(|| reqs.into_iter().collect::<Vec<_>>().join(",")))
}

/// One requirement, trimmed, in the order `wcm_selector` tells the operators apart.
fn canonical_requirement(part: &str) -> Option<String> {
    if let Some(k) = part.strip_prefix('!') {
        return Some(format!("!{}", k.trim()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Some(format!("{}!={}", k.trim(), v.trim()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Some(format!("{}={}", k.trim(), v.trim()));
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    match words.as_slice() {
        [k] => Some((*k).to_string()),
        [k, rest] => {
            let rest = rest.trim();
            let (op, set) = if let Some(s) = rest.strip_prefix("notin") {
                ("notin", s)
            } else {
                ("in", rest.strip_prefix("in")?)
            };
            let inner = set.trim().strip_prefix('(')?.strip_suffix(')')?;
            let values: BTreeSet<&str> = inner.split(',').map(str::trim).collect();
            Some(format!(
                "{k} {op} ({})",
                values.into_iter().collect::<Vec<_>>().join(",")
            ))
        }
        _ => None,
    }
}

/// A change seen by an informer.
#[derive(Debug, Clone)]
pub enum Change {
    Applied {
        old: Option<Arc<CachedObject>>,
        new: Arc<CachedObject>,
    },
    Deleted {
        old: Arc<CachedObject>,
    },
}

/// One running informer. Dropping the last `Arc` stops its watch.
pub struct Informer {
    pub key: InformerKey,
    store: Arc<ObjectStore>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    subscribers: Mutex<Vec<Sender>>,
    synced: watch::Sender<bool>,
    /// A sharded stream: the ranges its cache is complete for (listed, and followed since).
    covered: watch::Sender<Vec<Range>>,
}

impl Drop for Informer {
    fn drop(&mut self) {
        self.task.abort();
        tracing::info!(informer = %self.key, "informer stopped");
    }
}

impl Informer {
    pub fn store(&self) -> &Arc<ObjectStore> {
        &self.store
    }

    /// Waits until the initial list is in the cache.
    pub async fn wait_synced(&self) {
        let mut rx = self.shared.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// A sharded stream: the ranges whose objects are all in the cache now. A range just taken
    /// joins once the list that includes it is in; a range given up leaves when the stream that
    /// follows the new ranges starts.
    pub fn covered(&self) -> watch::Receiver<Vec<Range>> {
        self.shared.covered.subscribe()
    }

    /// Changes from now on, coalesced per object (`subscription.rs`); objects already cached
    /// arrive first as `Applied` with no old object, as client-go's AddEventHandler replays them.
    pub fn subscribe(&self) -> Subscription {
        let (tx, rx) = subscription::channel();
        let mut subs = self
            .shared
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Under the subscribers lock the store does not change (the watch task takes it too).
        for obj in self.store.all() {
            tx.send(Change::Applied {
                old: None,
                new: obj,
            });
        }
        subs.push(tx);
        rx
    }
}

/// Counts of informer activity, for metrics.
pub trait InformerObserver: Send + Sync {
    fn event(&self, _informer: &InformerKey, _kind: &'static str) {}
    fn watch_error(&self, _informer: &InformerKey) {}
}

/// Starts informers on demand and shares them.
pub struct Informers {
    client: kube::Client,
    running: Mutex<HashMap<InformerKey, Weak<Informer>>>,
    observer: Arc<dyn InformerObserver>,
    /// The most informers running at once since [`Informers::take_peak`] was last called.
    peak: std::sync::atomic::AtomicUsize,
}

impl Informers {
    pub fn new(client: kube::Client, observer: Arc<dyn InformerObserver>) -> Self {
        Informers {
            client,
            running: Mutex::new(HashMap::new()),
            observer,
            peak: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The host's own client, which the informers list and watch with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The informer for `key`, started if no one holds it. A sharded key's stream started here
    /// follows no range (it caches nothing): see [`Informers::acquire_sharded`].
    pub fn acquire(&self, key: InformerKey) -> Arc<Informer> {
        self.acquire_with(key, None)
    }

    /// The informer for a sharded `key` (a plugin's own stream), started if no one holds it; a
    /// new one follows `ranges` (the ranges the plugin holds on this replica, as they change).
    pub fn acquire_sharded(
        &self,
        key: InformerKey,
        ranges: watch::Receiver<Vec<Range>>,
    ) -> Arc<Informer> {
        self.acquire_with(key, Some(ranges))
    }

    fn acquire_with(
        &self,
        key: InformerKey,
        ranges: Option<watch::Receiver<Vec<Range>>>,
    ) -> Arc<Informer> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = running.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        // A sharded key acquired without its ranges holds none.
        let ranges = match (&key.shard, ranges) {
            (Some(_), Some(r)) => Some(r),
            (Some(_), None) => Some(watch::channel(Vec::new()).1),
            (None, _) => None,
        };
        let informer = Arc::new(self.start(key.clone(), ranges));
        running.insert(key, Arc::downgrade(&informer));
        // Every entry left holds a live informer (the dead were just removed).
        self.peak.fetch_max(running.len(), Ordering::Relaxed);
        informer
    }

    /// The most informers (list+watch streams) that ran at once since the last call, and starts
    /// counting again from those running now. Tests use it to see that a budget held throughout a
    /// change, not only before and after.
    pub fn take_peak(&self) -> usize {
        let now = self.running();
        self.peak.swap(now, Ordering::Relaxed).max(now)
    }

    /// How many informers are running.
    pub fn running(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn start(&self, key: InformerKey, ranges: Option<watch::Receiver<Vec<Range>>>) -> Informer {
        let store = Arc::new(ObjectStore::default());
        let (synced, _) = watch::channel(false);
        let (covered, _) = watch::channel(Vec::new());
        let shared = Arc::new(Shared {
            subscribers: Mutex::new(Vec::new()),
            synced,
            covered,
        });
        let stream = Stream {
            client: self.client.clone(),
            key: key.clone(),
            store: store.clone(),
            shared: shared.clone(),
            observer: self.observer.clone(),
            left: Mutex::default(),
            unfiltered: AtomicBool::new(false),
        };
        let task = if key.metadata_only {
            tokio::spawn(stream.run::<RawMeta>(ranges))
        } else {
            tokio::spawn(stream.run::<RawObject>(ranges))
        };
        tracing::info!(informer = %key, "informer started");
        Informer {
            key,
            store,
            shared,
            task,
        }
    }
}

/// What one informer's task works with.
struct Stream {
    client: kube::Client,
    key: InformerKey,
    store: Arc<ObjectStore>,
    shared: Arc<Shared>,
    observer: Arc<dyn InformerObserver>,
    /// A sharded stream: the objects dropped since its last list was in, their range given up
    /// (traces, without their JSON). One whose range is held again and that the next list
    /// lacks was deleted meanwhile, and that deletion is told.
    left: Mutex<HashMap<Key, Arc<CachedObject>>>,
    /// A sharded stream whose API server ignored `shardSelector` at the last list: every list
    /// brings every object, so nothing is dropped before one.
    unfiltered: AtomicBool,
}

/// How long a sharded stream waits after its ranges change for more changes before it starts
/// again (a replica joining or leaving moves several ranges, one Lease retry period apart), and
/// the most it waits while they keep changing.
const RANGES_SETTLE: Duration = Duration::from_millis(500);
const RANGES_SETTLE_MAX: Duration = Duration::from_secs(3);

/// The next change of a sharded stream's ranges away from `following`, once they have settled;
/// never for a stream of every object, nor once the ranges' sender is gone (the plugin stopping:
/// the stream keeps what it follows until it is dropped). A range given up and taken again
/// within the settling time leaves the stream as it is.
async fn ranges_changed(
    ranges: &mut Option<watch::Receiver<Vec<Range>>>,
    following: Option<&Vec<Range>>,
) {
    let Some(r) = ranges.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        if r.changed().await.is_err() {
            return std::future::pending().await;
        }
        let until = tokio::time::Instant::now() + RANGES_SETTLE_MAX;
        loop {
            let wait =
                RANGES_SETTLE.min(until.saturating_duration_since(tokio::time::Instant::now()));
            match tokio::time::timeout(wait, r.changed()).await {
                Ok(Ok(())) if tokio::time::Instant::now() < until => continue,
                _ => break,
            }
        }
        if following != Some(&*r.borrow()) {
            return;
        }
    }
}

impl Stream {
    /// Lists and watches until dropped. A sharded stream asks the API server for the ranges in
    /// `ranges` only, and starts again (a new list, then a watch) each time they change: objects
    /// of a range given up leave the cache without a deletion being told, and a range taken
    /// joins [`Informer::covered`] once its list is in.
    async fn run<K>(self, mut ranges: Option<watch::Receiver<Vec<Range>>>)
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = DynamicResourceScope>
            + Into<Option<Arc<CachedObject>>>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        loop {
            let held = ranges.as_mut().map(|r| r.borrow_and_update().clone());
            let follow = async {
                match (&self.key.shard, &held) {
                    (Some(s), Some(held)) => {
                        // What is covered now and still held stays covered meanwhile. The
                        // objects of a range given up leave the cache now, not once the list of
                        // the ranges held is in: where the API server filters, a range given up
                        // and one taken are never cached together (the allocator would keep
                        // that peak).
                        self.shared
                            .covered
                            .send_modify(|c| c.retain(|r| held.contains(r)));
                        self.drop_left(s.by, held);
                        if held.is_empty() {
                            // No range: nothing is asked of the API server, nothing cached. The
                            // traces stay for the list of the ranges taken next.
                            self.replace_all(HashMap::new(), Some((s.by, held)));
                            self.shared.synced.send_replace(true);
                            return std::future::pending().await;
                        }
                        let client = crate::engine::shard_watch::client(
                            self.client.clone(),
                            selector(s.by, held),
                        );
                        self.follow::<K>(client, Some((s.by, held))).await
                    }
                    _ => self.follow::<K>(self.client.clone(), None).await,
                }
            };
            tokio::select! {
                () = follow => return,
                () = ranges_changed(&mut ranges, held.as_ref()) => {
                    tracing::info!(informer = %self.key, "the ranges held changed: listing and watching them");
                }
            }
        }
    }

    async fn follow<K>(&self, client: kube::Client, sharded: Option<(ShardBy, &Vec<Range>)>)
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = DynamicResourceScope>
            + Into<Option<Arc<CachedObject>>>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let (key, store, shared, observer) = (&self.key, &self.store, &self.shared, &self.observer);
        let ar = key.api_resource();
        let api: Api<K> = match &key.namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        };
        let mut config = watcher::Config::default();
        if let Some(sel) = &key.label_selector {
            config = config.labels(sel);
        }
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut relist: Option<HashMap<Key, Arc<CachedObject>>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Init) => relist = Some(HashMap::new()),
                Ok(Event::InitApply(o)) => {
                    let obj: Option<Arc<CachedObject>> = o.into();
                    if let (Some(buf), Some(obj)) = (relist.as_mut(), obj) {
                        // An object unchanged since it was cached (the same UID and
                        // resourceVersion, both given) keeps its cached copy, and the listed one
                        // goes at once: a relist (a range taken, a watch expired) copies only
                        // what changed, not the whole cache again.
                        let obj = match store.get(&obj.key) {
                            Some(cached)
                                if !obj.resource_version.is_empty()
                                    && !obj.uid.is_empty()
                                    && cached.resource_version == obj.resource_version
                                    && cached.uid == obj.uid =>
                            {
                                cached
                            }
                            // A List's items come without apiVersion and kind.
                            _ => obj.with_type(&ar.api_version, &ar.kind),
                        };
                        buf.insert(obj.key.clone(), obj);
                    }
                }
                Ok(Event::InitDone) => {
                    let fresh = relist.take().unwrap_or_default();
                    if let Some((by, held)) = sharded {
                        // Read again at every list: the gate may be turned on or off later.
                        let unfiltered = fresh
                            .values()
                            .any(|o| !holds(by, held, &o.uid, o.key.namespace.as_deref()));
                        let was = self.unfiltered.swap(unfiltered, Ordering::Relaxed);
                        if unfiltered && !was {
                            tracing::warn!(informer = %key, "the API server ignores shardSelector (its ShardedListAndWatch gate is off): this stream caches every object of the kind, and the host divides the work");
                        } else if was && !unfiltered {
                            tracing::info!(informer = %key, "the API server filters by shardSelector again: this stream caches only the ranges held");
                        }
                    }
                    // Dropped with a range given up, the range held again, and not listed: it
                    // was deleted while this stream did not follow it.
                    let left =
                        std::mem::take(&mut *self.left.lock().unwrap_or_else(|p| p.into_inner()));
                    let deleted_meanwhile = deleted_meanwhile(left, &fresh, sharded);
                    self.replace_all(fresh, sharded);
                    // Not listed, so not in the store that now equals the list.
                    if !deleted_meanwhile.is_empty() {
                        let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
                        for old in deleted_meanwhile {
                            observer.event(key, "delete");
                            broadcast(&mut subs, Change::Deleted { old });
                        }
                    }
                    if let Some((_, held)) = sharded {
                        shared.covered.send_replace(held.clone());
                    }
                    shared.synced.send_replace(true);
                }
                Ok(Event::Apply(o)) => {
                    let obj: Option<Arc<CachedObject>> = o.into();
                    if let Some(obj) = obj {
                        observer.event(key, "apply");
                        apply(store, shared, obj.with_type(&ar.api_version, &ar.kind));
                    }
                }
                Ok(Event::Delete(o)) => {
                    if let Some(obj) = o.into() {
                        observer.event(key, "delete");
                        let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
                        let old = store.remove(&obj.key).unwrap_or(obj);
                        broadcast(&mut subs, Change::Deleted { old });
                    }
                }
                Err(e) => {
                    observer.watch_error(key);
                    tracing::warn!(informer = %key, "watch error (retrying with backoff): {e}");
                }
            }
        }
    }

    /// Drops the cached objects outside `held` without a deletion told (their range was given
    /// up, they were not deleted), keeping a trace of each until the next list is in. Not where
    /// the API server ignores the selector: its next list brings them all back anyway.
    fn drop_left(&self, by: ShardBy, held: &[Range]) {
        if self.unfiltered.load(Ordering::Relaxed) {
            return;
        }
        // The store changes under the subscribers lock (see `subscribe`).
        let _subs = self
            .shared
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        for o in self.store.all() {
            if !holds(by, held, &o.uid, o.key.namespace.as_deref())
                && let Some(old) = self.store.remove(&o.key)
            {
                left.insert(old.key.clone(), Arc::new(old.trace()));
            }
        }
    }

    /// Makes the store equal to a fresh list: what changed is applied, what is gone is deleted.
    /// A sharded stream's objects outside the ranges it now follows leave without a deletion
    /// told: they were not deleted, their range was given up.
    fn replace_all(
        &self,
        fresh: HashMap<Key, Arc<CachedObject>>,
        sharded: Option<(ShardBy, &Vec<Range>)>,
    ) {
        let (store, shared) = (&self.store, &self.shared);
        let gone: Vec<Arc<CachedObject>> = store
            .all()
            .into_iter()
            .filter(|o| !fresh.contains_key(&o.key))
            .collect();
        for obj in fresh.into_values() {
            apply(store, shared, obj);
        }
        let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        for o in gone {
            let Some(old) = store.remove(&o.key) else {
                continue;
            };
            let left = sharded
                .is_some_and(|(by, held)| !holds(by, held, &old.uid, old.key.namespace.as_deref()));
            if !left {
                self.observer.event(&self.key, "delete");
                broadcast(&mut subs, Change::Deleted { old });
            }
        }
    }
}

/// Of the traces of objects dropped with a range given up, those whose range is held again and
/// that a fresh list of the held ranges lacks: deleted while the stream did not follow them.
fn deleted_meanwhile(
    left: HashMap<Key, Arc<CachedObject>>,
    fresh: &HashMap<Key, Arc<CachedObject>>,
    sharded: Option<(ShardBy, &Vec<Range>)>,
) -> Vec<Arc<CachedObject>> {
    let Some((by, held)) = sharded else {
        return Vec::new();
    };
    let mut gone: Vec<Arc<CachedObject>> = left
        .into_values()
        .filter(|o| {
            !fresh.contains_key(&o.key) && holds(by, held, &o.uid, o.key.namespace.as_deref())
        })
        .collect();
    gone.sort_by(|a, b| a.key.cmp(&b.key));
    gone
}

fn apply(store: &ObjectStore, shared: &Shared, obj: Arc<CachedObject>) {
    let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
    let old = store.upsert(obj.clone());
    // The same resourceVersion again (a relist or a reconnect) is not a change.
    if old
        .as_ref()
        .is_some_and(|o| o.resource_version == obj.resource_version)
    {
        return;
    }
    broadcast(&mut subs, Change::Applied { old, new: obj });
}

/// Delivers to every subscriber, and forgets those that are gone.
fn broadcast(subs: &mut Vec<Sender>, change: Change) {
    subs.retain(|s| s.send(change.clone()));
}

/// An object as the watch delivers it, turned into its cached form while it is decoded.
/// `META = true` asks the API server for metadata only (`PartialObjectMetadata`).
#[derive(Debug, Clone)]
pub struct Raw<const META: bool> {
    meta: ObjectMeta,
    cached: Option<Arc<CachedObject>>,
}

/// A full object.
pub type RawObject = Raw<false>;
/// Object metadata only.
pub type RawMeta = Raw<true>;

impl<const META: bool> From<Raw<META>> for Option<Arc<CachedObject>> {
    fn from(r: Raw<META>) -> Self {
        r.cached
    }
}

impl<'de, const META: bool> serde::Deserialize<'de> for Raw<META> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parts = ObjectParts::deserialize(d)?;
        // The watcher needs the resource version of every object (bookmarks included).
        let rv = parts
            .metadata
            .as_ref()
            .and_then(|m| m.get("resourceVersion"))
            .and_then(|r| r.as_str())
            .map(str::to_string);
        let meta = ObjectMeta {
            resource_version: rv,
            ..Default::default()
        };
        let cached = CachedObject::from_parts(parts).map(Arc::new);
        let meta = match &cached {
            Some(c) => ObjectMeta {
                name: Some(c.key.name.clone()),
                namespace: c.key.namespace.clone(),
                uid: Some(c.uid.clone()),
                ..meta
            },
            None => meta,
        };
        Ok(Raw { meta, cached })
    }
}

impl<const META: bool> kube::Resource for Raw<META> {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn metadata_api() -> bool {
        META
    }
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.api_version)
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Selector;

    fn canon(s: &str) -> Option<String> {
        canonical_selector(s).expect("a valid selector")
    }

    #[test]
    fn a_dropped_object_missing_from_the_list_of_its_range_held_again_was_deleted() {
        let halves = crate::engine::shard::split(2);
        let obj = |name: &str, uid: &str| {
            Arc::new(
                CachedObject::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"}
                }))
                .expect("an object"),
            )
        };
        // UIDs in each half.
        let uid_in = |half: usize, skip: usize| {
            (0..)
                .map(|i| format!("uid-{i}"))
                .filter(|u| holds(ShardBy::Uid, &halves[half..=half], u, Some("ns")))
                .nth(skip)
                .expect("a uid")
        };
        let gone = obj("gone", &uid_in(1, 0));
        let back = obj("back", &uid_in(1, 1));
        let away = obj("away", &uid_in(0, 0));
        let left: HashMap<Key, Arc<CachedObject>> = [&gone, &back, &away]
            .into_iter()
            .map(|o| (o.key.clone(), Arc::new(o.trace())))
            .collect();
        let fresh: HashMap<Key, Arc<CachedObject>> = [(back.key.clone(), back.clone())].into();
        let held = vec![halves[1]];
        let told = deleted_meanwhile(left.clone(), &fresh, Some((ShardBy::Uid, &held)));
        assert_eq!(
            told.iter().map(|o| o.key.name.as_str()).collect::<Vec<_>>(),
            ["gone"],
            "held again and not listed: deleted; listed: not; still given up: not known"
        );
        assert_eq!(told[0].uid, gone.uid, "told with its UID");
        assert_eq!(&*told[0].json, "{}", "a trace keeps no JSON");
        assert!(
            deleted_meanwhile(left, &fresh, None).is_empty(),
            "nothing for a stream of every object"
        );
    }

    #[test]
    fn equivalent_selectors_have_one_canonical_form() {
        let groups: &[&[&str]] = &[
            &["a=1,b=2", "b=2, a=1", " a == 1 ,b=2", "b=2,a=1,a=1"],
            &[
                "x in (a,b)",
                "x in (b,a)",
                "x  in ( b , a , a )",
                "x in(a,b)",
            ],
            &["x notin (a,b),!y", "!y, x notin (b,a)", "! y,x notin (a,b)"],
            &["a!=1,app", "app , a != 1"],
        ];
        for group in groups {
            let first = canon(group[0]);
            for s in *group {
                assert_eq!(canon(s), first, "{s:?} and {:?}", group[0]);
            }
        }
        assert_eq!(canon("b=2, a=1").as_deref(), Some("a=1,b=2"));
        assert_eq!(canon("x in (b,a)").as_deref(), Some("x in (a,b)"));
    }

    #[test]
    fn different_selectors_keep_different_canonical_forms() {
        let distinct = [
            "a!=1",
            "a!=2",
            "a=1",
            "a",
            "!a",
            "a in (1)",
            "a notin (1)",
            "a in (1,2)",
            "a=1,b=2",
            "a=1,b=3",
            "a in ()",
            "a in (,1)",
        ];
        let forms: BTreeSet<Option<String>> = distinct.iter().map(|s| canon(s)).collect();
        assert_eq!(forms.len(), distinct.len(), "{forms:?}");
    }

    #[test]
    fn the_canonical_form_selects_what_the_selector_selects() {
        let label_sets: [&[(&str, &str)]; 6] = [
            &[],
            &[("a", "1")],
            &[("a", "1"), ("b", "2")],
            &[("x", "a")],
            &[("x", "c"), ("y", "")],
            &[("a", "2"), ("app", "web"), ("x", "")],
        ];
        for s in [
            "a=1,b=2",
            " b == 2 , a=1",
            "x in (b, a)",
            "x notin (b,a), !y",
            "a!=1, app",
            "x in (a, )",
            "",
            " , ",
        ] {
            let original = Selector::parse(s).expect("valid");
            let canonical = Selector::parse(canon(s).as_deref().unwrap_or("")).expect("valid");
            for labels in label_sets {
                let labels = labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                assert_eq!(
                    original.matches(&labels),
                    canonical.matches(&labels),
                    "{s:?} on {labels:?}"
                );
            }
        }
    }

    #[test]
    fn an_empty_selector_selects_everything_and_has_no_form() {
        assert_eq!(canon(""), None);
        assert_eq!(canon(" , ,"), None);
    }

    #[test]
    fn an_invalid_selector_has_no_canonical_form() {
        assert!(canonical_selector("a=1&watch=true").is_err());
        assert!(canonical_selector("x in a").is_err());
    }
}
