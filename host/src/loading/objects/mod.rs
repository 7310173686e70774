//! Plugins as cluster objects (`plugins.wcm.dev`): a source feeding the one loader. Each Plugin
//! object is watched, its component fetched by digest (`fetch`), checked and kept on disk, and
//! handed to the loader as if it were `NAME.wasm` with its `NAME.toml` in the plugins directory:
//! the same compile cache, describe, validation, grant check, swap in place and stop on delete.
//! Under the key `Plugin/NAME`, which no file can have.
//!
//! A fetch that fails leaves the version already running as it is (the loader is handed the last
//! good component until a new one is fetched); retried with backoff when a retry can help, and
//! reported on the object's status (`status`).

pub mod fetch;
pub mod push;
pub mod registry;
pub mod spec;
pub mod status;
pub mod store;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;

use fetch::{Credentials, FetchError, Fetcher};
use spec::{Origin, PluginSpec};

/// At most this many Plugin objects with a usable spec are served; past it, the rest wait for room
/// (reported on their status), up to `MAX_WAITING` more; beyond that they are only logged.
pub const MAX_OBJECTS: usize = 128;
const MAX_WAITING: usize = 128;
/// The annotation of a pull Secret naming the Plugins that may use it (`*`: all of them).
pub const PULL_SECRET_ANNOTATION: &str = "wcm.dev/plugins";
/// Fetches running at once, over all objects.
const FETCHES_AT_ONCE: usize = 2;
/// A whole fetch (manifest and blob) may take this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// What `run` needs from the operator.
#[derive(Debug, Clone, Default)]
pub struct ObjectSettings {
    /// `--plugin-registry`: registries (and https hosts) components may come from.
    pub registries: BTreeSet<String>,
    /// Registries reached over plain HTTP (`--plugin-registry-plain-http`).
    pub plain_http: Vec<String>,
    /// CA certificates (PEM) trusted for registries besides the system's.
    pub ca_pem: Option<Vec<u8>>,
    /// Where fetched components are kept (by digest).
    pub cache: Option<PathBuf>,
    pub max_bytes: usize,
    /// The components of all Plugin objects together are held in memory up to this many bytes
    /// (`--plugin-objects-max-total-mb`); a fetch past it waits for room.
    pub max_total_bytes: usize,
    /// The namespace of pull Secrets (the host's).
    pub secrets_namespace: String,
    /// What an object's settings may ask for (filled by the manager from its own settings).
    pub ceilings: spec::Ceilings,
    /// `--plugin-verify-key`: every Plugin's artifact must carry a cosign signature by one of
    /// these (besides the Plugin's own `verify.publicKeys`, if any).
    pub required_keys: Option<verify::TrustedKeys>,
}

/// The component and settings the loader is handed for one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Loadable {
    pub bytes: Arc<[u8]>,
    pub sha256: String,
    pub settings_text: Option<String>,
    /// The source it came from, shown in status.
    pub source: String,
    /// The Plugin's `verify.publicKeys` it was checked against (a change checks it again).
    pub keys: Vec<String>,
}

impl Loadable {
    /// Whether this is what `spec` names from `origin`: the same source, checked against the
    /// same keys (settings aside).
    fn is_of(&self, origin: &Origin, spec: &PluginSpec) -> bool {
        self.source == origin.shown() && self.keys == spec.public_keys()
    }
}

/// What this replica knows of one Plugin object.
#[derive(Debug, Clone, Default)]
pub struct ObjectState {
    pub generation: i64,
    /// The spec as read, or why it cannot be used.
    pub spec: Option<Result<(Origin, PluginSpec), String>>,
    /// What the loader runs (or tries to): the last component fetched for this object.
    pub loadable: Option<Loadable>,
    /// The generation `loadable` was made for.
    pub loaded_generation: Option<i64>,
    /// The latest fetch failure for the current spec, if the current spec is not fetched.
    pub fetch_error: Option<FetchError>,
    /// The component was found in the disk cache.
    pub cached: bool,
    /// Which of `verify.publicKeys` signed what runs, when the Plugin asks for verification.
    pub verified_by: Option<usize>,
    /// What runs was verified against `--plugin-verify-key`.
    pub operator_verified: bool,
    /// Waits for room (more than `MAX_OBJECTS` served).
    pub waiting_for_room: bool,
    attempts: u32,
    fetching: bool,
    /// Which life of the object this state belongs to: a fetch loop of a deleted and re-created
    /// object stops at its next turn.
    epoch: u64,
    /// Wakes the object's fetch loop from its backoff when the spec changes.
    wake: Arc<tokio::sync::Notify>,
}

/// The Plugin objects this replica serves, shared with the loader and the status writer.
pub struct ObjectSource {
    settings: ObjectSettings,
    fetcher: Fetcher,
    client: kube::Client,
    objects: Mutex<BTreeMap<String, ObjectState>>,
    /// Woken when what the loader should run changed.
    changed: tokio::sync::Notify,
    /// Woken when an object's state changed (for the status writer).
    pub(crate) state_changed: tokio::sync::Notify,
    fetch_turns: tokio::sync::Semaphore,
    /// One fetch at a time per registry (or https host), inside `fetch_turns`: a slow registry
    /// holds one of the turns, never all of them.
    registry_turns: Mutex<BTreeMap<String, Arc<tokio::sync::Semaphore>>>,
    next_epoch: std::sync::atomic::AtomicU64,
    /// The components held, by SHA-256: a digest named by many objects is held once.
    blobs: Mutex<BTreeMap<String, std::sync::Weak<[u8]>>>,
    /// Set once the first list is complete: the cache is cleaned only from then on (before, an
    /// object not yet listed would lose what the cache holds for it).
    listed: std::sync::atomic::AtomicBool,
    /// Set when the manager stops: fetch loops end at their next turn.
    stopped: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Plugin resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        spec::GROUP,
        spec::VERSION,
        spec::KIND,
    ))
}

impl ObjectSource {
    pub fn new(
        settings: ObjectSettings,
        client: kube::Client,
    ) -> anyhow::Result<Arc<ObjectSource>> {
        let fetcher = Fetcher::new(
            settings.cache.clone(),
            settings.max_bytes,
            settings.ca_pem.as_deref(),
            &settings.registries,
            &settings.plain_http,
        )?;
        Ok(Arc::new(ObjectSource {
            settings,
            fetcher,
            client,
            objects: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            state_changed: tokio::sync::Notify::new(),
            fetch_turns: tokio::sync::Semaphore::new(FETCHES_AT_ONCE),
            registry_turns: Mutex::default(),
            next_epoch: std::sync::atomic::AtomicU64::new(1),
            blobs: Mutex::default(),
            listed: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Ends every fetch loop (the manager stops): each at its next turn, one in its backoff now.
    pub fn stop(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for s in lock(&self.objects).values() {
            s.wake.notify_one();
        }
    }

    /// What the loader should run: `Plugin/NAME` → component and settings.
    pub fn snapshot(&self) -> BTreeMap<String, Loadable> {
        lock(&self.objects)
            .iter()
            .filter_map(|(name, s)| Some((spec::key_of(name), s.loadable.clone()?)))
            .collect()
    }

    /// The state of every object, by object name.
    pub fn states(&self) -> BTreeMap<String, ObjectState> {
        lock(&self.objects).clone()
    }

    /// Resolves when what the loader should run may have changed.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Watches Plugin objects until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource());
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        let mut seen_in_list = BTreeSet::new();
        let mut failures = 0u32;
        let mut last_said = None;
        while let Some(event) = stream.next().await {
            if event.is_ok() {
                failures = 0;
            }
            match event {
                Ok(watcher::Event::Init) => seen_in_list.clear(),
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(n) = o.metadata.name.clone() {
                        seen_in_list.insert(n);
                    }
                    self.clone().upsert(o);
                }
                Ok(watcher::Event::InitDone) => {
                    // Objects deleted while the watch was down.
                    let gone: Vec<String> = lock(&self.objects)
                        .keys()
                        .filter(|k| !seen_in_list.contains(*k))
                        .cloned()
                        .collect();
                    for name in gone {
                        self.remove(&name);
                    }
                    self.listed
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    self.clean_cache();
                }
                Ok(watcher::Event::Apply(o)) => self.clone().upsert(o),
                Ok(watcher::Event::Delete(o)) => {
                    if let Some(n) = &o.metadata.name {
                        self.remove(n);
                    }
                }
                Err(e) => {
                    // The CRD not installed, or the host not granted Plugins: said once a
                    // minute, retried with backoff (1 s doubling to 30 s).
                    failures = failures.saturating_add(1);
                    if last_said
                        .is_none_or(|t: std::time::Instant| t.elapsed() >= Duration::from_secs(60))
                    {
                        tracing::warn!(
                            "watching Plugin objects (manifests/crds/plugins.wcm.dev.yaml and manifests/rbac/plugin-objects.yaml applied?): {e}"
                        );
                        last_said = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(backoff(failures).min(Duration::from_secs(30))).await;
                }
            }
        }
    }

    fn remove(self: &Arc<Self>, name: &str) {
        let waiting: Option<String> = {
            let mut objects = lock(&self.objects);
            if objects.remove(name).is_none() {
                return;
            }
            objects
                .iter()
                .find(|(_, s)| s.waiting_for_room)
                .map(|(n, _)| n.clone())
        };
        tracing::info!(plugin_object = %name, "Plugin object deleted: stopping its plugin");
        self.changed.notify_one();
        self.state_changed.notify_one();
        self.clean_cache();
        // Room for one that waits: read it again and serve it.
        if let Some(w) = waiting {
            let this = self.clone();
            tokio::spawn(async move {
                let api: Api<DynamicObject> = Api::all_with(this.client.clone(), &resource());
                if let Ok(Some(o)) = api.get_opt(&w).await {
                    this.upsert(o);
                }
            });
        }
    }

    /// Removes from the disk cache what no object names now.
    fn clean_cache(&self) {
        if !self.listed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (mut manifests, mut layers, mut https) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for s in lock(&self.objects).values() {
            match &s.spec {
                Some(Ok((Origin::Oci(r), _))) => {
                    manifests.insert(r.digest.clone());
                }
                Some(Ok((Origin::Https { sha256, .. }, _))) => {
                    https.insert(sha256.clone());
                }
                _ => {}
            }
            if let Some(l) = &s.loadable {
                layers.insert(l.sha256.clone());
                https.insert(l.sha256.clone());
            }
        }
        self.fetcher.retain(&manifests, &layers, &https);
    }

    fn upsert(self: Arc<Self>, o: DynamicObject) {
        let Some(name) = o.metadata.name.clone() else {
            return;
        };
        // Being deleted (finalizers pending): stopped now, as a delete.
        if o.metadata.deletion_timestamp.is_some() {
            self.remove(&name);
            return;
        }
        let generation = o.metadata.generation.unwrap_or_default();
        let parsed = PluginSpec::from_value(&o.data["spec"]).and_then(|s| {
            let origin = s.origin(&self.settings.registries)?;
            s.settings_toml(&name, &self.settings.ceilings)?;
            Ok((origin, s))
        });
        let start_fetch = {
            let mut objects = lock(&self.objects);
            let served = objects
                .iter()
                .filter(|(n, s)| {
                    **n != name && !s.waiting_for_room && matches!(s.spec, Some(Ok(_)))
                })
                .count();
            let known = objects.contains_key(&name);
            if !known && objects.len() >= MAX_OBJECTS + MAX_WAITING {
                tracing::warn!(plugin_object = %crate::contract::validate::log_text(&name, 253), "more than {} Plugin objects: this one is not even reported on", MAX_OBJECTS + MAX_WAITING);
                return;
            }
            let epoch = self
                .next_epoch
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let state = objects.entry(name.clone()).or_insert_with(|| ObjectState {
                epoch,
                ..Default::default()
            });
            state.generation = generation;
            // No room: said on its status, and served when a served one goes.
            let parsed = match parsed {
                Ok(_) if served >= MAX_OBJECTS && state.loadable.is_none() => {
                    state.waiting_for_room = true;
                    Err(format!(
                        "more than {MAX_OBJECTS} Plugin objects are served; this one waits until one is deleted"
                    ))
                }
                other => {
                    state.waiting_for_room = false;
                    other
                }
            };
            let same_spec = state.spec.as_ref() == Some(&parsed);
            if same_spec {
                // A generation whose spec reads the same (e.g. a default written out): nothing
                // to fetch; what runs is for this generation too.
                if !state.fetching && state.fetch_error.is_none() && state.loadable.is_some() {
                    state.loaded_generation = Some(generation);
                }
                drop(objects);
                self.state_changed.notify_one();
                return;
            }
            state.spec = Some(parsed.clone());
            state.fetch_error = None;
            state.attempts = 0;
            match &parsed {
                Ok((origin, spec)) => {
                    let same_bytes = state
                        .loadable
                        .as_ref()
                        .is_some_and(|l| l.is_of(origin, spec));
                    if same_bytes {
                        // Settings alone changed: the same component with new settings, no fetch.
                        if let Some(l) = state.loadable.as_mut() {
                            l.settings_text =
                                spec.settings_toml(&name, &self.settings.ceilings).ok();
                        }
                        state.loaded_generation = Some(generation);
                        self.changed.notify_one();
                        None
                    } else {
                        // One fetch loop per object: marked here, under the lock; one that waits
                        // in its backoff is woken to fetch what the spec names now.
                        let start = !state.fetching;
                        state.fetching = true;
                        if !start {
                            state.wake.notify_one();
                        }
                        start.then_some(state.epoch)
                    }
                }
                Err(_) => None,
            }
        };
        self.state_changed.notify_one();
        if let Some(epoch) = start_fetch {
            tokio::spawn(self.fetch_loop(name, epoch));
        }
    }

    /// Fetches what the object's current spec names, retrying with backoff while that helps and
    /// the spec stays the same.
    async fn fetch_loop(self: Arc<Self>, name: String, epoch: u64) {
        loop {
            if self.stopped.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let (origin, spec) = {
                let mut objects = lock(&self.objects);
                let Some(state) = objects.get_mut(&name).filter(|s| s.epoch == epoch) else {
                    return;
                };
                let Some(Ok((origin, spec))) = state.spec.clone() else {
                    state.fetching = false;
                    return;
                };
                if state
                    .loadable
                    .as_ref()
                    .is_some_and(|l| l.is_of(&origin, &spec))
                {
                    state.fetching = false;
                    return;
                }
                state.fetching = true;
                (origin, spec)
            };
            let result = {
                let registry_turn = lock(&self.registry_turns)
                    .entry(origin.authority().to_string())
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(1)))
                    .clone();
                let _mine = registry_turn.acquire().await;
                let _turn = self.fetch_turns.acquire().await;
                // Still this object's life and still what it names, now that the turns are taken
                // (a burst of deletes and re-creates must not queue as many downloads).
                let current = lock(&self.objects).get(&name).is_some_and(|s| {
                    s.epoch == epoch && matches!(&s.spec, Some(Ok((o, _))) if *o == origin)
                });
                if !current {
                    continue;
                }
                let spec_keys = spec.trusted_keys().ok().flatten();
                let keys: Vec<&verify::TrustedKeys> = self
                    .settings
                    .required_keys
                    .iter()
                    .chain(spec_keys.iter())
                    .collect();
                match self.credentials(&name, &spec, &origin).await {
                    Ok(creds) => tokio::time::timeout(
                        FETCH_TIMEOUT,
                        self.fetcher.fetch(&origin, creds.as_ref(), &keys),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(FetchError {
                            reason: "Unreachable",
                            message: format!("the fetch took longer than {FETCH_TIMEOUT:?}"),
                        })
                    }),
                    Err(e) => Err(e),
                }
            };
            let retry_in = {
                let mut objects = lock(&self.objects);
                // What the others hold, each distinct component once.
                let others: BTreeMap<String, usize> = objects
                    .iter()
                    .filter(|(n, _)| **n != name)
                    .filter_map(|(_, s)| {
                        s.loadable
                            .as_ref()
                            .map(|l| (l.sha256.clone(), l.bytes.len()))
                    })
                    .collect();
                let Some(state) = objects.get_mut(&name).filter(|s| s.epoch == epoch) else {
                    return;
                };
                let still_wanted = matches!(&state.spec, Some(Ok((o, _))) if *o == origin);
                if !still_wanted {
                    // The spec changed meanwhile: fetch what it names now.
                    continue;
                }
                // Room for it among what the other objects hold.
                let result = result.and_then(|fetched| {
                    let mine = if others.contains_key(&fetched.sha256) {
                        0
                    } else {
                        fetched.bytes.len()
                    };
                    let total = others.values().sum::<usize>().saturating_add(mine);
                    if total > self.settings.max_total_bytes {
                        return Err(FetchError {
                            reason: "OverBudget",
                            message: format!(
                                "the components of all Plugin objects would hold {:.1} MiB, over --plugin-objects-max-total-mb ({}); retried when room is made",
                                total as f64 / f64::from(1 << 20),
                                self.settings.max_total_bytes >> 20
                            ),
                        });
                    }
                    Ok(fetched)
                });
                match result {
                    Ok(mut fetched) => {
                        // Accepted: kept on disk, and held once however many objects name it.
                        self.fetcher.keep(&origin, &fetched);
                        {
                            let mut blobs = lock(&self.blobs);
                            blobs.retain(|_, w| w.strong_count() > 0);
                            match blobs.get(&fetched.sha256).and_then(|w| w.upgrade()) {
                                Some(held) => fetched.bytes = held,
                                None => {
                                    blobs.insert(
                                        fetched.sha256.clone(),
                                        Arc::downgrade(&fetched.bytes),
                                    );
                                }
                            }
                        }
                        // The settings and generation of the spec as it is now: a settings change
                        // made while the fetch ran is not lost.
                        let current = match &state.spec {
                            Some(Ok((_, s))) => s.clone(),
                            _ => spec.clone(),
                        };
                        let settings_text =
                            current.settings_toml(&name, &self.settings.ceilings).ok();
                        let generation = state.generation;
                        tracing::info!(
                            plugin_object = %name,
                            source = %origin.shown(),
                            cached = fetched.cached,
                            "Plugin object fetched"
                        );
                        state.loadable = Some(Loadable {
                            bytes: fetched.bytes,
                            sha256: fetched.sha256,
                            settings_text,
                            source: origin.shown(),
                            keys: spec.public_keys().to_vec(),
                        });
                        state.cached = fetched.cached;
                        // The Plugin's own keys are the last set checked, when it names any.
                        state.verified_by = (!spec.public_keys().is_empty())
                            .then(|| fetched.signatures.last().map(|(_, _, by)| *by))
                            .flatten();
                        state.operator_verified = self.settings.required_keys.is_some();
                        state.loaded_generation = Some(generation);
                        state.fetch_error = None;
                        state.fetching = false;
                        state.attempts = 0;
                        self.changed.notify_one();
                        self.state_changed.notify_one();
                        drop(objects);
                        self.clean_cache();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(plugin_object = %name, reason = e.reason, "fetching the Plugin's component failed: {}", e.message);
                        let retry = e.is_transient();
                        state.fetch_error = Some(e);
                        state.attempts = state.attempts.saturating_add(1);
                        self.state_changed.notify_one();
                        if !retry {
                            state.fetching = false;
                            return;
                        }
                        backoff(state.attempts)
                    }
                }
            };
            let wake = lock(&self.objects)
                .get(&name)
                .filter(|s| s.epoch == epoch)
                .map(|s| s.wake.clone());
            let Some(wake) = wake else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep(retry_in) => {}
                _ = wake.notified() => {}
            }
        }
    }

    /// The registry credentials the Plugin's pull Secret holds for its registry, read through the
    /// API at each fetch (a new or rotated Secret needs no restart).
    async fn credentials(
        &self,
        plugin: &str,
        spec: &PluginSpec,
        origin: &Origin,
    ) -> Result<Option<Credentials>, FetchError> {
        let name = match spec.pull_secret() {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(None),
            Err(e) => {
                return Err(FetchError {
                    reason: "InvalidSpec",
                    message: e,
                });
            }
        };
        let secrets: Api<Secret> =
            Api::namespaced(self.client.clone(), &self.settings.secrets_namespace);
        let secret = secrets.get_opt(name).await.map_err(|e| FetchError {
            reason: "PullSecretUnreadable",
            message: format!("reading the pull Secret {name}: {e}"),
        })?;
        let Some(secret) = secret else {
            return Err(FetchError {
                reason: "PullSecretMissing",
                message: format!(
                    "no Secret {}/{name} (the pull Secret)",
                    self.settings.secrets_namespace
                ),
            });
        };
        // A pull Secret serves only the Plugins it names: writing a Plugin does not give the use
        // of every pull Secret of the host's namespace.
        let allowed = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PULL_SECRET_ANNOTATION))
            .is_some_and(|v| v.split(',').map(str::trim).any(|n| n == "*" || n == plugin));
        if !allowed {
            return Err(FetchError {
                reason: "PullSecretInvalid",
                message: format!(
                    "the Secret {name} does not name this Plugin in its {PULL_SECRET_ANNOTATION} annotation (a comma-separated list of Plugin names, or *)"
                ),
            });
        }
        if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
            return Err(FetchError {
                reason: "PullSecretInvalid",
                message: format!("the Secret {name} is not of type kubernetes.io/dockerconfigjson"),
            });
        }
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
            .ok_or_else(|| FetchError {
                reason: "PullSecretInvalid",
                message: format!("the Secret {name} has no .dockerconfigjson"),
            })?;
        fetch::credentials_for(&data.0, origin.authority()).map_err(|e| FetchError {
            reason: "PullSecretInvalid",
            message: e,
        })
    }
}

fn backoff(attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(16);
    (BACKOFF_FIRST * 2u32.saturating_pow(exp)).min(BACKOFF_MAX)
}

impl FetchError {
    /// Retried by the fetch loop: a retry can help (the registry or the Secret may come back).
    pub fn is_transient(&self) -> bool {
        self.retryable() || self.reason.starts_with("PullSecret") || self.reason == "OverBudget"
    }
}

impl std::fmt::Debug for ObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSource")
            .field("registries", &self.settings.registries)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}
