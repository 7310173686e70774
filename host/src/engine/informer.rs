//! Shared informers: one list+watch per (kind, namespace, label selector, metadata-only) for every
//! plugin that needs it, reference-counted. The first plugin that asks starts it; when the last
//! handle goes, its watch stops.
//!
//! kube-runtime's `watcher` does the list+watch, relists on 410 Gone and reconnects with backoff;
//! this module keeps the cache (objects stored once, as JSON) and fans changes out to subscribers,
//! coalesced per object so a slow subscriber holds at most one change per object.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use kube::api::{Api, ObjectMeta};
use kube::core::{ApiResource, DynamicResourceScope};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::engine::cache::{CachedObject, Key, ObjectParts, ObjectStore};
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
    pub label_selector: Option<String>,
    pub metadata_only: bool,
}

impl InformerKey {
    fn api_resource(&self) -> ApiResource {
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
        Ok(())
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
}

impl Informers {
    pub fn new(client: kube::Client, observer: Arc<dyn InformerObserver>) -> Self {
        Informers {
            client,
            running: Mutex::new(HashMap::new()),
            observer,
        }
    }

    /// The host's own client, which the informers list and watch with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The informer for `key`, started if no one holds it.
    pub fn acquire(&self, key: InformerKey) -> Arc<Informer> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = running.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        let informer = Arc::new(self.start(key.clone()));
        running.insert(key, Arc::downgrade(&informer));
        informer
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

    fn start(&self, key: InformerKey) -> Informer {
        let store = Arc::new(ObjectStore::default());
        let (synced, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            subscribers: Mutex::new(Vec::new()),
            synced,
        });
        let task = if key.metadata_only {
            tokio::spawn(run::<RawMeta>(
                self.client.clone(),
                key.clone(),
                store.clone(),
                shared.clone(),
                self.observer.clone(),
            ))
        } else {
            tokio::spawn(run::<RawObject>(
                self.client.clone(),
                key.clone(),
                store.clone(),
                shared.clone(),
                self.observer.clone(),
            ))
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

async fn run<K>(
    client: kube::Client,
    key: InformerKey,
    store: Arc<ObjectStore>,
    shared: Arc<Shared>,
    observer: Arc<dyn InformerObserver>,
) where
    K: kube::Resource<DynamicType = ApiResource, Scope = DynamicResourceScope>
        + Into<Option<Arc<CachedObject>>>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
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
                if let (Some(buf), Some(obj)) = (relist.as_mut(), o.into()) {
                    buf.insert(obj.key.clone(), obj);
                }
            }
            Ok(Event::InitDone) => {
                let fresh = relist.take().unwrap_or_default();
                replace_all(&store, &shared, fresh, &*observer, &key);
                shared.synced.send_replace(true);
            }
            Ok(Event::Apply(o)) => {
                if let Some(obj) = o.into() {
                    observer.event(&key, "apply");
                    apply(&store, &shared, obj);
                }
            }
            Ok(Event::Delete(o)) => {
                if let Some(obj) = o.into() {
                    observer.event(&key, "delete");
                    let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
                    let old = store.remove(&obj.key).unwrap_or(obj);
                    broadcast(&mut subs, Change::Deleted { old });
                }
            }
            Err(e) => {
                observer.watch_error(&key);
                tracing::warn!(informer = %key, "watch error (retrying with backoff): {e}");
            }
        }
    }
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

/// Makes the store equal to a fresh list: what changed is applied, what is gone is deleted.
fn replace_all(
    store: &ObjectStore,
    shared: &Shared,
    fresh: HashMap<Key, Arc<CachedObject>>,
    observer: &dyn InformerObserver,
    key: &InformerKey,
) {
    let gone: Vec<Key> = store
        .all()
        .into_iter()
        .map(|o| o.key.clone())
        .filter(|k| !fresh.contains_key(k))
        .collect();
    for obj in fresh.into_values() {
        apply(store, shared, obj);
    }
    let mut subs = shared.subscribers.lock().unwrap_or_else(|p| p.into_inner());
    for k in gone {
        if let Some(old) = store.remove(&k) {
            observer.event(key, "delete");
            broadcast(&mut subs, Change::Deleted { old });
        }
    }
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
