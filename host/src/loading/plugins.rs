//! The plugins directory: each `NAME.wasm` is a plugin, with an optional `NAME.toml` beside it.
//!
//! The directory is watched (inotify through `notify`, plus a periodic rescan as a safety net).
//! Every change leads to one rescan that compares what is on disk (file contents, followed through
//! symlinks, so atomic renames and ConfigMap-style `..data` swaps look the same) with what runs:
//! - a new file starts a plugin;
//! - a changed file (or its settings) loads the new version; with the same watches it replaces the
//!   running version in place (in-flight calls finish first, the queue is kept), otherwise the
//!   controller is restarted;
//! - a removed file stops its plugin and releases its informers.
//!
//! A plugin starts only once the API server says its own identity may list and watch everything it
//! declared to watch (a SelfSubjectAccessReview made as the plugin); until then it waits, with the
//! missing rule in `/plugins`, and is checked again every few seconds, so a grant the operator
//! applies later starts it without a restart. A running plugin whose grant is revoked goes back to
//! waiting. Other causes that can pass by themselves (a kind not served yet, a Secret not there yet,
//! the API server unreachable, the plugin's name held by another file) wait the same way. A bad file
//! is refused with a clear error, once per content, and what was running keeps running, including
//! the previous version of a plugin whose update is bad.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tokio::sync::Mutex;

use crate::cluster::api::ApiFailure;
use crate::cluster::events::EventSink;
use crate::cluster::identity::{Access, IdentitySettings, PluginIdentity};
use crate::cluster::permissions::Permissions;
use crate::cluster::scope::{Scope, WatchScope};
use crate::cluster::services::{BudgetSettings, Reach, Services};
use crate::contract::isolation;
use crate::engine::controller::{
    Controller, ControllerDebug, ControllerParts, Version, plugin_cache, resolve_watches,
};
use crate::engine::informer::InformerKey;
use crate::loading::files;
use crate::loading::settings::{ControllerSelection, PluginSettings, SecretRef};
use crate::sandbox::http::effective_hosts;
use crate::sandbox::tape::Recorder;
use crate::sandbox::{CallError, Compiled, Limits};

/// Limits on what the directory may hold, and what every plugin gets by default.
#[derive(Debug, Clone)]
pub struct DirSettings {
    pub dir: PathBuf,
    pub max_wasm_bytes: u64,
    pub rescan: Duration,
    /// How often plugins that wait (for a grant, a kind, a Secret) are tried again.
    pub wait_retry: Duration,
    pub default_limits: Limits,
    pub default_workers: u32,
    /// No plugin gets more workers than this, whatever it or its NAME.toml asks for.
    pub max_workers: u32,
    /// Per-plugin budgets (NAME.toml may change the API budget and the instance cap).
    pub budgets: BudgetSettings,
    /// Hosts the operator allows for any plugin's outbound HTTP.
    pub allowed_hosts: Vec<String>,
    pub identity: IdentitySettings,
    /// Which plugins run (`--controllers`).
    pub controllers: ControllerSelection,
    /// Where reconciles are recorded (`--record-dir`), for every plugin.
    pub recorder: Option<Arc<Recorder>>,
}

/// Largest NAME.toml accepted.
const MAX_SETTINGS_BYTES: u64 = 64 << 10;

/// What is on disk for one plugin file: its bytes as read once (the digest is of what runs), or why
/// they could not be used.
#[derive(Debug, Clone)]
struct OnDisk {
    wasm: PathBuf,
    wasm_sha: String,
    bytes: Arc<[u8]>,
    settings_text: Option<String>,
    /// The file or its NAME.toml was refused (not a regular file inside the directory, too large).
    refusal: Option<String>,
}

impl PartialEq for OnDisk {
    fn eq(&self, o: &Self) -> bool {
        // The digest stands for the bytes.
        (
            &self.wasm,
            &self.wasm_sha,
            &self.settings_text,
            &self.refusal,
        ) == (&o.wasm, &o.wasm_sha, &o.settings_text, &o.refusal)
    }
}

struct Running {
    name: String,
    disk: OnDisk,
    controller: Option<Controller>,
    /// What its identity must keep being allowed (checked again at every rescan).
    accesses: Vec<Access>,
    identity: Option<PluginIdentity>,
    /// Digest of the Secret values it was given; a rotation makes the next rescan load it again.
    secrets_digest: String,
    secrets_rotated: bool,
}

/// Why a plugin waits; each has a fixed name (for metrics) and a message (for `/plugins`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// Its identity may not list/watch what it declared, or the host may not act as it.
    Forbidden,
    /// A kind, group or Secret it needs is not there yet.
    NotServed,
    /// The API server did not answer.
    Unreachable,
    /// Another file runs a plugin of the same name.
    NameTaken,
    /// No instance slot for `describe`, or none left to reserve for it (`sandbox/pool.rs`).
    InstancePool,
}

impl WaitReason {
    pub const ALL: [WaitReason; 5] = [
        WaitReason::Forbidden,
        WaitReason::NotServed,
        WaitReason::Unreachable,
        WaitReason::NameTaken,
        WaitReason::InstancePool,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Forbidden => "forbidden",
            WaitReason::NotServed => "not_served",
            WaitReason::Unreachable => "unreachable",
            WaitReason::NameTaken => "name_taken",
            WaitReason::InstancePool => "instance_pool",
        }
    }

    fn of(f: &ApiFailure) -> Self {
        match f.code {
            401 | 403 => WaitReason::Forbidden,
            404 => WaitReason::NotServed,
            _ => WaitReason::Unreachable,
        }
    }
}

/// Why a load did not start the plugin.
enum LoadError {
    /// Until the file changes (bad wasm, wrong world, invalid declaration or settings).
    Refused(anyhow::Error),
    /// Tried again every `wait_retry`.
    Waiting {
        plugin: String,
        reason: WaitReason,
        message: String,
    },
}

impl From<anyhow::Error> for LoadError {
    fn from(e: anyhow::Error) -> Self {
        LoadError::Refused(e)
    }
}

/// The state of one file, for status and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileStatus {
    /// `update_refused`: a newer file was refused, and this version keeps running.
    Running {
        plugin: String,
        sha256: String,
        update_refused: Option<String>,
    },
    Disabled {
        plugin: String,
    },
    /// Not started yet; tried again by itself.
    Waiting {
        plugin: String,
        reason: WaitReason,
        message: String,
    },
    Refused {
        error: String,
    },
}

impl FileStatus {
    /// The plugin's name, when the file got far enough to declare one.
    pub fn plugin(&self) -> Option<&str> {
        match self {
            FileStatus::Running { plugin, .. }
            | FileStatus::Disabled { plugin }
            | FileStatus::Waiting { plugin, .. } => Some(plugin),
            FileStatus::Refused { .. } => None,
        }
    }
}

struct Waiting {
    disk: OnDisk,
    plugin: String,
    reason: WaitReason,
    message: String,
}

pub struct PluginManager {
    parts: Arc<ControllerParts>,
    events: EventSink,
    settings: DirSettings,
    /// The host's own client configuration, from which each plugin's identity is made.
    kube_config: kube::Config,
    /// By file stem.
    running: Mutex<HashMap<String, Running>>,
    /// Errors by file stem, with the content they were for (so each is logged once).
    refused: Mutex<HashMap<String, (OnDisk, String)>>,
    waiting: Mutex<HashMap<String, Waiting>>,
    rescan_lock: Mutex<()>,
    /// Compiled components by digest, for the files in the directory (pruned at each rescan).
    compiled: Mutex<HashMap<String, Arc<Compiled>>>,
    /// Set once the first scan has loaded what was there (for `/readyz`).
    scanned: std::sync::atomic::AtomicBool,
}

impl PluginManager {
    pub fn new(
        parts: Arc<ControllerParts>,
        events: EventSink,
        settings: DirSettings,
        kube_config: kube::Config,
    ) -> Arc<Self> {
        Arc::new(PluginManager {
            parts,
            events,
            settings,
            kube_config,
            running: Mutex::default(),
            refused: Mutex::default(),
            waiting: Mutex::default(),
            rescan_lock: Mutex::new(()),
            compiled: Mutex::default(),
            scanned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Scans once, then watches the directory until the task is dropped.
    pub async fn run(self: Arc<Self>) -> Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Opening and reading files is reported too (inotify's OPEN): the rescan's own reads
            // must not trigger the next rescan. A file closed after writing still counts.
            use notify::event::{AccessKind, AccessMode, EventKind};
            let relevant = |k: &EventKind| match k {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                EventKind::Access(_) => false,
                _ => true,
            };
            if res.is_ok_and(|e| relevant(&e.kind)) {
                let _ = tx.send(());
            }
        })
        .context("start watching the plugins directory")?;
        notify::Watcher::watch(
            &mut watcher,
            &self.settings.dir,
            notify::RecursiveMode::NonRecursive,
        )
        .with_context(|| format!("watch {}", self.settings.dir.display()))?;
        self.rescan().await;
        let mut tick = tokio::time::interval(self.settings.rescan);
        let mut retry = tokio::time::interval(self.settings.wait_retry);
        loop {
            tokio::select! {
                got = rx.recv() => {
                    if got.is_none() { return Ok(()); }
                    // Let a burst of events (write, rename, symlink swap) settle into one rescan.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = tick.tick() => {}
                _ = retry.tick() => {
                    if self.waiting.lock().await.is_empty() { continue; }
                }
            }
            self.rescan().await;
        }
    }

    /// Status of every file seen.
    pub async fn status(&self) -> BTreeMap<String, FileStatus> {
        let mut out = BTreeMap::new();
        let refused = self.refused.lock().await;
        for (stem, r) in self.running.lock().await.iter() {
            let st = match &r.controller {
                Some(_) => FileStatus::Running {
                    plugin: r.name.clone(),
                    sha256: r.disk.wasm_sha.clone(),
                    update_refused: refused.get(stem).map(|(_, e)| e.clone()),
                },
                None => FileStatus::Disabled {
                    plugin: r.name.clone(),
                },
            };
            out.insert(stem.clone(), st);
        }
        for (stem, w) in self.waiting.lock().await.iter() {
            out.entry(stem.clone())
                .or_insert_with(|| FileStatus::Waiting {
                    plugin: w.plugin.clone(),
                    reason: w.reason,
                    message: w.message.clone(),
                });
        }
        for (stem, (_, err)) in refused.iter() {
            out.entry(stem.clone())
                .or_insert_with(|| FileStatus::Refused { error: err.clone() });
        }
        out
    }

    /// The debug view (kube-controller-manager's per-controller status): whether this replica
    /// leads, and for each file its state and why, and for a running plugin its version, digest,
    /// workers, queue depth and latest failure.
    pub async fn debug(&self) -> serde_json::Value {
        let status = self.status().await;
        let running: BTreeMap<String, ControllerDebug> = self
            .running
            .lock()
            .await
            .iter()
            .filter_map(|(stem, r)| Some((stem.clone(), r.controller.as_ref()?.debug())))
            .collect();
        let files: Vec<serde_json::Value> = status
            .iter()
            .map(|(stem, st)| {
                let mut v = match st {
                    FileStatus::Running {
                        plugin,
                        sha256,
                        update_refused,
                    } => serde_json::json!({
                        "state": "running", "plugin": plugin, "sha256": sha256,
                        "updateRefused": update_refused,
                    }),
                    FileStatus::Disabled { plugin } => {
                        serde_json::json!({"state": "disabled", "plugin": plugin})
                    }
                    FileStatus::Waiting {
                        plugin,
                        reason,
                        message,
                    } => serde_json::json!({
                        "state": "waiting", "plugin": plugin, "reason": reason.as_str(), "message": message,
                    }),
                    FileStatus::Refused { error } => {
                        serde_json::json!({"state": "refused", "error": error})
                    }
                };
                v["file"] = format!("{stem}.wasm").into();
                if let Some(d) = running.get(stem) {
                    v["version"] = d.version.clone().into();
                    v["isolation"] = d.isolation.into();
                    v["workers"] = d.workers.into();
                    v["queueDepth"] = d.queue_depth.into();
                    v["inFlight"] = d.in_flight.into();
                    v["leading"] = d.leading.into();
                    v["leader"] = d.leader.clone().into();
                    v["lastError"] = serde_json::to_value(&d.last_error).unwrap_or_default();
                }
                v
            })
            .collect();
        serde_json::json!({
            "leading": self.parts.election.leads_any(),
            "leaderElection": self.parts.election.mode(),
            "instancePool": self.instance_pool(),
            "plugins": files,
        })
    }

    /// How the instance pool is shared out now (`sandbox/pool.rs`).
    pub fn instance_pool(&self) -> crate::sandbox::PoolUse {
        self.parts.runtime.pool().usage()
    }

    /// Whether an election is held (so a plugin without a leader is worth saying so).
    pub fn elects(&self) -> bool {
        self.parts.election.mode() != "none"
    }

    /// For each running file: whether this replica reconciles it now, and who holds its Lease
    /// (when an election is held).
    pub async fn leaders(&self) -> BTreeMap<String, (bool, Option<String>)> {
        self.running
            .lock()
            .await
            .iter()
            .filter_map(|(stem, r)| {
                let d = r.controller.as_ref()?.debug();
                Some((stem.clone(), (d.leading, d.leader)))
            })
            .collect()
    }

    /// The running controller's queue length and version info, for tests.
    pub async fn with_controller<R>(
        &self,
        plugin: &str,
        f: impl FnOnce(&Controller) -> R,
    ) -> Option<R> {
        let running = self.running.lock().await;
        running
            .values()
            .find(|r| r.name == plugin)
            .and_then(|r| r.controller.as_ref())
            .map(f)
    }

    /// Compares the directory with what runs and applies the difference.
    pub async fn rescan(&self) {
        let _one_at_a_time = self.rescan_lock.lock().await;
        let on_disk = match self.read_dir() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(dir = %self.settings.dir.display(), "cannot read the plugins directory: {e:#}");
                return;
            }
        };
        // Removed files.
        let gone: Vec<String> = {
            let running = self.running.lock().await;
            running
                .keys()
                .filter(|k| !on_disk.contains_key(*k))
                .cloned()
                .collect()
        };
        let mut removed_plugins = Vec::new();
        for stem in gone {
            let removed = self.running.lock().await.remove(&stem);
            if let Some(r) = removed {
                tracing::info!(plugin = %r.name, file = %stem, "plugin file removed: stopping");
                removed_plugins.push(r.name.clone());
                self.stop_running(r).await;
            }
        }
        self.refused
            .lock()
            .await
            .retain(|stem, _| on_disk.contains_key(stem));
        self.waiting.lock().await.retain(|stem, w| {
            let keep = on_disk.contains_key(stem);
            if !keep {
                self.set_waiting(&w.plugin, None);
                removed_plugins.push(w.plugin.clone());
            }
            keep
        });
        // A removed plugin's series go too, unless another file runs or waits under its name.
        for plugin in removed_plugins {
            let still_there = self.running.lock().await.values().any(|r| r.name == plugin)
                || self
                    .waiting
                    .lock()
                    .await
                    .values()
                    .any(|w| w.plugin == plugin);
            if !still_there {
                self.parts.metrics.forget_plugin(&plugin);
            }
        }
        self.recheck_grants().await;
        self.recheck_secrets().await;
        self.recheck_kinds().await;
        {
            let on_disk_shas: std::collections::HashSet<&String> =
                on_disk.values().map(|d| &d.wasm_sha).collect();
            self.compiled
                .lock()
                .await
                .retain(|sha, _| on_disk_shas.contains(sha));
        }
        // New and changed files, in name order: of two files declaring one name, the first wins.
        let mut stems: Vec<&String> = on_disk.keys().collect();
        stems.sort();
        for stem in stems {
            let disk = &on_disk[stem];
            let unchanged = self
                .running
                .lock()
                .await
                .get(stem)
                .is_some_and(|r| r.disk == *disk && !r.secrets_rotated);
            let already_refused = self
                .refused
                .lock()
                .await
                .get(stem)
                .is_some_and(|(d, _)| d == disk);
            if unchanged || already_refused {
                continue;
            }
            match self.load(stem, disk).await {
                Ok(()) => {
                    self.refused.lock().await.remove(stem);
                    if let Some(w) = self.waiting.lock().await.remove(stem) {
                        self.set_waiting(&w.plugin, None);
                    }
                }
                Err(LoadError::Waiting {
                    plugin,
                    reason,
                    message,
                }) => {
                    self.refused.lock().await.remove(stem);
                    self.set_waiting(&plugin, Some(reason));
                    let mut waiting = self.waiting.lock().await;
                    let changed = waiting
                        .get(stem)
                        .is_none_or(|w| w.message != message || w.disk != *disk);
                    if changed {
                        tracing::warn!(plugin = %plugin, file = %disk.wasm.display(), reason = reason.as_str(), "plugin waits: {message}");
                    }
                    waiting.insert(
                        stem.clone(),
                        Waiting {
                            disk: disk.clone(),
                            plugin,
                            reason,
                            message,
                        },
                    );
                }
                Err(LoadError::Refused(e)) => {
                    // Compiler and describe errors can quote the component's own names and
                    // strings: escaped and bounded before they reach the log or `/plugins`.
                    let msg = crate::contract::validate::log_text(&format!("{e:#}"), 4096);
                    let keeps = if self.running.lock().await.contains_key(stem) {
                        "; the previous version keeps running"
                    } else {
                        ""
                    };
                    tracing::error!(file = %disk.wasm.display(), "plugin refused: {msg}{keeps}");
                    if let Some(w) = self.waiting.lock().await.remove(stem) {
                        self.set_waiting(&w.plugin, None);
                    }
                    self.refused
                        .lock()
                        .await
                        .insert(stem.clone(), (disk.clone(), msg));
                }
            }
        }
        let n = self
            .running
            .lock()
            .await
            .values()
            .filter(|r| r.controller.is_some())
            .count();
        self.parts.metrics.plugins_loaded(n);
        self.scanned
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the first scan is done.
    pub fn scanned(&self) -> bool {
        self.scanned.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops every running plugin whose identity lost a grant it needs; it waits again.
    async fn recheck_grants(&self) {
        let checks: Vec<(String, String, PluginIdentity, Vec<Access>)> = self
            .running
            .lock()
            .await
            .iter()
            .filter(|(_, r)| r.controller.is_some())
            .filter_map(|(stem, r)| {
                Some((
                    stem.clone(),
                    r.name.clone(),
                    r.identity.clone()?,
                    r.accesses.clone(),
                ))
            })
            .collect();
        for (stem, name, identity, accesses) in checks {
            // An API server that does not answer revokes nothing.
            let Ok(Some(denied)) = identity.first_denied(&accesses).await else {
                continue;
            };
            let Some(r) = self.running.lock().await.remove(&stem) else {
                continue;
            };
            let message = missing_grant(&identity, &denied);
            tracing::warn!(plugin = %name, "grant revoked, stopping the plugin: {message}");
            let disk = r.disk.clone();
            self.stop_running(r).await;
            self.set_waiting(&name, Some(WaitReason::Forbidden));
            self.waiting.lock().await.insert(
                stem,
                Waiting {
                    disk,
                    plugin: name,
                    reason: WaitReason::Forbidden,
                    message,
                },
            );
        }
    }

    /// Reads the Secrets of every running plugin again; one whose values changed (a rotated
    /// credential) is loaded again by this rescan, so it runs with them without a restart. A
    /// Secret that cannot be read now leaves the plugin running with what it has.
    async fn recheck_secrets(&self) {
        let checks: Vec<(String, PluginSettings, PluginIdentity, String)> = self
            .running
            .lock()
            .await
            .iter()
            .filter(|(_, r)| r.controller.is_some())
            .filter_map(|(stem, r)| {
                let settings = PluginSettings::parse(r.disk.settings_text.as_deref()?).ok()?;
                (!settings.secrets.is_empty()).then_some((
                    stem.clone(),
                    settings,
                    r.identity.clone()?,
                    r.secrets_digest.clone(),
                ))
            })
            .collect();
        for (stem, settings, identity, digest) in checks {
            let Ok(now) = self.resolve_secrets(&settings, &identity).await else {
                continue;
            };
            if digest_of(&now) != digest
                && let Some(r) = self.running.lock().await.get_mut(&stem)
            {
                tracing::info!(plugin = %r.name, "a Secret it reads changed: loading it again");
                r.secrets_rotated = true;
            }
        }
    }

    /// Resolves the kinds every running plugin watches again (from the discovery cache, which
    /// forgets a group when one of its CRDs changes): a plugin whose kinds now resolve to other
    /// informers — a CRD re-created with another scope — or are no longer served is stopped and
    /// loaded again by this rescan, and waits if its kind is gone.
    async fn recheck_kinds(&self) {
        let running: Vec<(String, Vec<InformerKey>, Arc<Version>)> = {
            let running = self.running.lock().await;
            let mut out = Vec::new();
            for (stem, r) in running.iter() {
                if let Some(c) = &r.controller {
                    out.push((stem.clone(), c.informer_keys(), c.version().await));
                }
            }
            out
        };
        for (stem, keys, version) in running {
            let now = resolve_watches(&self.parts.api, &version.description).await;
            let same = match &now {
                Ok(watches) => watches.iter().map(|(k, _)| k).eq(keys.iter()),
                // Not served any more (a 404); anything else (the API server unreachable) is no
                // reason to stop a running plugin.
                Err(f) => f.code != 404,
            };
            if same {
                continue;
            }
            // Stopped and loaded again by this rescan: it runs on the new informers, or waits
            // (not served) until its kind is back.
            if let Some(r) = self.running.lock().await.remove(&stem) {
                tracing::info!(plugin = %r.name, "a kind it watches is served differently now, or not at all: loading it again");
                self.stop_running(r).await;
            }
        }
    }

    /// `wcm_plugin_waiting` of `plugin`: 1 for `reason`, 0 for the others.
    fn set_waiting(&self, plugin: &str, reason: Option<WaitReason>) {
        self.parts.metrics.plugin_waiting(
            plugin,
            WaitReason::ALL.map(WaitReason::as_str),
            reason.map(WaitReason::as_str),
        );
    }

    async fn stop_running(&self, r: Running) {
        if let Some(c) = r.controller {
            c.stop().await;
            self.events.unregister(&r.name);
        }
    }

    fn read_dir(&self) -> Result<HashMap<String, OnDisk>> {
        let dir = &self.settings.dir;
        let mut out = HashMap::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let Some(stem) = wasm_stem(&path) else {
                continue;
            };
            // Only regular files inside the directory, followed through links that stay inside
            // (a ConfigMap mount swaps `..data` and every file behind it at once).
            let wasm = files::read_plugin_file(dir, &path, self.settings.max_wasm_bytes);
            let settings =
                files::read_settings_file(dir, &path.with_extension("toml"), MAX_SETTINGS_BYTES);
            let disk = match (wasm, settings) {
                (Ok(bytes), Ok(settings_text)) => OnDisk {
                    wasm: path,
                    wasm_sha: crate::sandbox::sha256_hex(&bytes),
                    bytes: bytes.into(),
                    settings_text,
                    refusal: None,
                },
                // A file that vanished between listing and reading is simply not there.
                (Err(files::FileRefusal::Missing { .. }), _) => continue,
                (Err(e), _) | (_, Err(e)) => OnDisk {
                    wasm: path,
                    wasm_sha: String::new(),
                    bytes: Arc::from(Vec::new()),
                    settings_text: None,
                    refusal: Some(e.to_string()),
                },
            };
            out.insert(stem, disk);
        }
        Ok(out)
    }

    async fn load(&self, stem: &str, disk: &OnDisk) -> Result<(), LoadError> {
        if let Some(why) = &disk.refusal {
            return Err(anyhow::anyhow!("{why}").into());
        }
        let settings = match &disk.settings_text {
            Some(text) => PluginSettings::parse(text).map_err(|e| {
                anyhow::anyhow!("{}: {e}", disk.wasm.with_extension("toml").display())
            })?,
            None => PluginSettings::default(),
        };
        let compiled = self.compile(disk).await?;
        let limits = settings.limits(&self.settings.default_limits);
        let describe_services = Arc::new(Services::for_describe(stem, settings.config.clone()));
        let mut description = self
            .parts
            .runtime
            .describe(&compiled, describe_services, &limits)
            .await
            .map_err(|e| {
                let why = crate::contract::validate::log_text(&e.to_string(), 4096);
                match e {
                    // The pool is in use now, which says nothing about the file: it waits and
                    // is described again.
                    CallError::PoolFull(_) => LoadError::Waiting {
                        plugin: stem.to_string(),
                        reason: WaitReason::InstancePool,
                        message: format!("describe waits for an instance slot: {why}"),
                    },
                    _ => anyhow::anyhow!("describe failed: {why}").into(),
                }
            })?;
        if let Some(name) = &settings.name {
            description.name = name.clone();
        }
        crate::contract::validate::description(&description).map_err(anyhow::Error::msg)?;
        let name = description.name.clone();
        // The name is the plugin's identity (its ServiceAccount): a new version of a file may not
        // take another one. Renaming is the operator's: a new file, or `name` in NAME.toml.
        if let Some(r) = self.running.lock().await.get(stem)
            && r.name != name
            && settings.name.is_none()
            && r.disk.settings_text == disk.settings_text
        {
            return Err(anyhow::anyhow!(
                "the new version declares the name {name:?}, but this file runs {:?}: a plugin's name is its identity; to rename it, set `name` in {stem}.toml or use a new file",
                r.name
            )
            .into());
        }
        let waiting = |reason: WaitReason, message: String| LoadError::Waiting {
            plugin: name.clone(),
            reason,
            message,
        };
        {
            let running = self.running.lock().await;
            if let Some((other, _)) = running
                .iter()
                .find(|(s, r)| r.name == name && s.as_str() != stem)
            {
                return Err(waiting(
                    WaitReason::NameTaken,
                    format!(
                        "plugin name {name:?} is used by {other}.wasm; this file starts when that one goes"
                    ),
                ));
            }
        }
        let watches = resolve_watches(&self.parts.api, &description)
            .await
            .map_err(|f| waiting(WaitReason::of(&f), f.message))?;
        // The watch budget, before anything else is asked of the API server as the plugin: a
        // plugin over it opens no stream at all (nor reads a Secret, nor reviews a grant).
        let budgets = settings.budgets(&self.settings.budgets);
        let streams = distinct_streams(watches.iter().map(|(k, _)| k));
        if streams > budgets.max_watch_streams as usize {
            self.parts.metrics.plugin_refused(REFUSED_WATCH_BUDGET);
            return Err(anyhow::anyhow!(
                "plugin {name} needs {streams} list+watch streams (the distinct kinds, namespaces, label selectors and metadata-only among its {} watches), over its budget of {} (--max-watch-streams-per-plugin, or max_watch_streams in {stem}.toml); no watch was opened",
                watches.len(),
                budgets.max_watch_streams,
            )
            .into());
        }
        let identity = PluginIdentity::new(&self.kube_config, &self.settings.identity, &name)?;
        let secrets = self
            .resolve_secrets(&settings, &identity)
            .await
            .map_err(|(f, m)| waiting(WaitReason::of(&f), m))?;
        let secrets_digest = digest_of(&secrets);
        let protected = self.settings.identity.protected_namespaces();
        let scope = Scope::resolve(
            settings.namespaces.as_deref(),
            &watches
                .iter()
                .map(|(k, namespaced)| WatchScope {
                    namespace: k.namespace.as_deref(),
                    namespaced: *namespaced,
                })
                .collect::<Vec<_>>(),
            &protected,
        );
        let grants = Permissions::new(description.permissions.clone())
            .resolve(self.parts.api.discovery(), scope, protected)
            .await
            .map_err(|f| waiting(WaitReason::of(&f), f.message))?;
        let acts_in = grants.scope().to_string();
        let accesses = watch_accesses(&watches);
        match identity.first_denied(&accesses).await {
            Ok(None) => {}
            Ok(Some(denied)) => {
                return Err(waiting(
                    WaitReason::Forbidden,
                    missing_grant(&identity, &denied),
                ));
            }
            Err(e) => {
                return Err(waiting(
                    WaitReason::Unreachable,
                    format!(
                        "cannot check the grants of {} (does the host may impersonate it?): {e:#}",
                        identity.username
                    ),
                ));
            }
        }
        // The shared informers list and watch as the host: without that right of its own their
        // caches would never fill, and the start would wait for them until its timeout.
        match crate::cluster::identity::first_denied(self.parts.informers.client(), &accesses).await
        {
            Ok(None) => {}
            Ok(Some(denied)) => {
                return Err(waiting(
                    WaitReason::Forbidden,
                    format!(
                        "the host's own identity may not {} {} (group {:?}){}: grant it what `wasm-controller-manager rbac --host-service-account NAMESPACE/NAME` prints",
                        denied.verb,
                        denied.resource,
                        denied.group,
                        denied
                            .namespace
                            .as_deref()
                            .map(|n| format!(" in namespace {n}"))
                            .unwrap_or_default()
                    ),
                ));
            }
            Err(e) => {
                return Err(waiting(
                    WaitReason::Unreachable,
                    format!("cannot check the host's own grants: {e:#}"),
                ));
            }
        }
        let keys: Vec<_> = watches.iter().map(|(k, _)| k.clone()).collect();
        let namespaced: Vec<bool> = watches.iter().map(|(_, n)| *n).collect();
        let asked = settings
            .workers
            .or(description.workers)
            .unwrap_or(self.settings.default_workers)
            .max(1);
        // A worker holds at most one instance: never more workers than the plugin may have
        // instances, or a worker would wait for a slot while holding its key.
        let workers = asked
            .min(self.settings.max_workers.max(1))
            .min(budgets.max_instances.max(1));
        if workers < asked {
            tracing::warn!(plugin = %name, asked, workers, "workers capped (--max-workers-per-plugin, --max-instances-per-plugin)");
        }
        let resync = settings
            .resync_seconds
            .or(description.resync_seconds)
            .map(|s| Duration::from_secs(u64::from(s)));

        // A slot of the instance pool of its own, so its first instance never waits for the other
        // plugins'; taken before the running version is touched, so without one the running
        // version keeps running and this one waits.
        let selected = self.settings.controllers.enables(&name);
        let share = if settings.enabled() && selected {
            Some(
                self.parts
                    .runtime
                    .pool()
                    .reserve()
                    .map_err(|m| waiting(WaitReason::InstancePool, m))?,
            )
        } else {
            None
        };

        // Nothing below holds `running` while it waits (a stop drains in-flight reconciles, a start
        // waits for caches): status and the other plugins stay answerable.
        let previous = self.running.lock().await.remove(stem);
        // Hosts: what the plugin declared and the operator allowed (globally or for this plugin),
        // compared after normalising host and port on both sides.
        let allowed: Vec<String> = self
            .settings
            .allowed_hosts
            .iter()
            .chain(&settings.allowed_hosts)
            .cloned()
            .collect();
        let (allowed_hosts, notes) = effective_hosts(&description.outbound_hosts, &allowed);
        for n in notes {
            tracing::info!(plugin = %name, "outbound hosts: {n}");
        }
        let protected_ips = api_server_ips(&self.kube_config).await;
        let Some(share) = share else {
            if let Some(p) = previous {
                self.stop_running(p).await;
            }
            let by = if selected {
                "its settings"
            } else {
                "--controllers"
            };
            tracing::info!(plugin = %name, "plugin disabled by {by}");
            self.running.lock().await.insert(
                stem.to_string(),
                Running {
                    name: name.clone(),
                    disk: disk.clone(),
                    controller: None,
                    accesses: Vec::new(),
                    identity: None,
                    secrets_digest: String::new(),
                    secrets_rotated: false,
                },
            );
            return Ok(());
        };
        let mut previous = previous.and_then(|p| p.controller);
        let same_shape = match &previous {
            Some(c) => c.name == name && c.fits(&keys, workers, &description, resync).await,
            None => false,
        };
        // A restarted controller's new informers start before the old ones stop, so the streams
        // both versions need keep their caches. When the two together are over the budget, the
        // old version stops first: a plugin never holds more streams than its budget, not even
        // while a new version starts.
        if !same_shape
            && let Some(c) = previous.take_if(|c| {
                distinct_streams(c.informer_keys().iter().chain(&keys))
                    > budgets.max_watch_streams as usize
            })
        {
            tracing::info!(plugin = %name, "the running and the new version together need more list+watch streams than the budget: stopping the running one before the new one starts");
            let old_name = c.name.clone();
            c.stop().await;
            if old_name != name {
                self.events.unregister(&old_name);
            }
        }
        let informers: Vec<_> = keys
            .iter()
            .map(|k| self.parts.informers.acquire(k.clone()))
            .collect();
        // Per plugin, the plugin's election; a version swapped in keeps the running one's.
        let gate = self.parts.election.gate(&name);
        self.events
            .register(&name, identity.client().clone(), gate.tenure.clone());
        let services = Arc::new(
            Services::new(
                &name,
                Reach {
                    grants,
                    identity: identity.clone(),
                    api: self.parts.api.clone(),
                    cache: plugin_cache(&informers),
                    events: self.events.clone(),
                    secrets,
                    metrics: self.parts.metrics.clone(),
                    tenure: gate.tenure.clone(),
                },
                settings.config.clone(),
                &budgets,
                allowed_hosts,
                protected_ips,
            )
            .with_recorder(self.settings.recorder.clone())
            .with_share(share),
        );
        let sha = compiled.sha256.clone();
        let contract = compiled.contract_version();
        // The operator's choice, else the plugin's own (validated at load), else per call.
        let isolation = settings
            .isolation
            .or(isolation::declared(&description).ok().flatten())
            .unwrap_or_default();
        let version = Version {
            compiled,
            description,
            services,
            limits,
            isolation,
            id: Version::next_id(),
        };
        let controller = match previous {
            Some(c) if same_shape => {
                tracing::info!(plugin = %name, sha256 = %sha, "new version: replacing in place (queue kept, every key reconciled again)");
                c.swap(version).await;
                c
            }
            other => {
                if let Some(c) = other {
                    tracing::info!(plugin = %name, "new version watches, maps or resyncs differently: restarting its controller");
                    let old_name = c.name.clone();
                    c.stop().await;
                    if old_name != name {
                        self.events.unregister(&old_name);
                    }
                }
                match Controller::start(
                    &self.parts,
                    informers,
                    namespaced,
                    version,
                    workers,
                    resync,
                    gate,
                )
                .await
                {
                    Ok(c) => c,
                    Err(why) => {
                        self.events.unregister(&name);
                        return Err(waiting(WaitReason::Unreachable, why));
                    }
                }
            }
        };
        tracing::info!(plugin = %name, file = %disk.wasm.display(), sha256 = %sha, contract, identity = %identity.username, %acts_in, "plugin running");
        self.running.lock().await.insert(
            stem.to_string(),
            Running {
                name,
                disk: disk.clone(),
                controller: Some(controller),
                accesses,
                identity: Some(identity),
                secrets_digest,
                secrets_rotated: false,
            },
        );
        Ok(())
    }

    /// The compiled component of these bytes: from the memo when the same bytes were compiled
    /// before (a waiting plugin is tried again every few seconds; it is not compiled each time).
    async fn compile(&self, disk: &OnDisk) -> anyhow::Result<Arc<Compiled>> {
        if let Some(c) = self.compiled.lock().await.get(&disk.wasm_sha) {
            return Ok(c.clone());
        }
        let bytes = disk.bytes.clone();
        let runtime = self.parts.runtime.clone();
        let compiled = Arc::new(
            tokio::task::spawn_blocking(move || runtime.compile(&bytes))
                .await
                .context("compile task")??,
        );
        self.compiled
            .lock()
            .await
            .insert(disk.wasm_sha.clone(), compiled.clone());
        Ok(compiled)
    }

    /// Reads the Secrets named in NAME.toml as the plugin (its identity must be allowed to).
    async fn resolve_secrets(
        &self,
        settings: &PluginSettings,
        identity: &PluginIdentity,
    ) -> Result<BTreeMap<String, String>, (ApiFailure, String)> {
        let mut out = BTreeMap::new();
        // Several keys usually come from one Secret: each Secret is read once per resolve.
        let mut read: HashMap<(String, String), Secret> = HashMap::new();
        for (key, reference) in &settings.secrets {
            let r = SecretRef::parse(reference).map_err(|e| {
                (
                    ApiFailure::bad_request(e.clone()),
                    format!("secrets.{key}: {e}"),
                )
            })?;
            let id = (r.namespace.clone(), r.name.clone());
            if !read.contains_key(&id) {
                let api: Api<Secret> = Api::namespaced(identity.client().clone(), &r.namespace);
                let secret = api.get(&r.name).await.map_err(|e| {
                    let f = ApiFailure::from_kube(e);
                    let m = format!(
                        "secrets.{key}: read Secret {}/{} as {}: {} ({})",
                        r.namespace, r.name, identity.username, f.message, f.reason
                    );
                    (f, m)
                })?;
                read.insert(id.clone(), secret);
            }
            let value = read
                .get(&id)
                .and_then(|s| s.data.as_ref())
                .and_then(|d| d.get(&r.key).cloned())
                .ok_or_else(|| {
                    (
                        ApiFailure::not_found("no such key"),
                        format!(
                            "secrets.{key}: Secret {}/{} has no key {:?}",
                            r.namespace, r.name, r.key
                        ),
                    )
                })?;
            let text = String::from_utf8(value.0).map_err(|_| {
                (
                    ApiFailure::bad_request("not UTF-8"),
                    format!("secrets.{key}: the value is not UTF-8"),
                )
            })?;
            out.insert(key.clone(), text);
        }
        Ok(out)
    }

    /// Stops every plugin.
    pub async fn stop_all(&self) {
        let all: Vec<Running> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in all {
            self.stop_running(r).await;
        }
    }
}

/// `wcm_plugins_refused_total{reason}` of a plugin that needs more list+watch streams than its
/// budget.
pub const REFUSED_WATCH_BUDGET: &str = "watch_budget";

/// How many list+watch streams these informer keys are: one per distinct key (kind, namespace,
/// canonical selector, metadata-only). A stream another plugin shares still counts.
pub fn distinct_streams<'a>(keys: impl IntoIterator<Item = &'a InformerKey>) -> usize {
    keys.into_iter()
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// What a plugin's identity must be allowed so the host serves it from shared informers: list and
/// watch of each watched kind, in the watched namespace (or all).
fn watch_accesses(watches: &[(InformerKey, bool)]) -> Vec<Access> {
    let mut out = Vec::new();
    for (k, _) in watches {
        for verb in ["list", "watch"] {
            let a = Access {
                verb,
                group: k.group.clone(),
                resource: k.plural.clone(),
                namespace: k.namespace.clone(),
            };
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

fn missing_grant(identity: &PluginIdentity, denied: &Access) -> String {
    format!(
        "{} may not {denied}: apply the RBAC that `wasm-controller-manager rbac` prints for this plugin",
        identity.username
    )
}

/// The API server's addresses: outbound HTTP from plugins never reaches them unless the operator
/// allowed one by address.
async fn api_server_ips(config: &kube::Config) -> Vec<IpAddr> {
    let Some(host) = config.cluster_url.host() else {
        return Vec::new();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![ip];
    }
    let port = config.cluster_url.port_u16().unwrap_or(443);
    match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => addrs.map(|a| a.ip()).collect(),
        Err(_) => Vec::new(),
    }
}

fn wasm_stem(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    // Hidden files are editors' and ConfigMap mounts' own (`..data`, `.swp`).
    if name.starts_with('.') {
        return None;
    }
    name.strip_suffix(".wasm").map(str::to_string)
}

/// A digest of resolved Secret values (kept instead of a second copy of them).
fn digest_of(secrets: &BTreeMap<String, String>) -> String {
    let mut text = String::new();
    for (k, v) in secrets {
        text.push_str(&format!("{}:{k}{}:{v}", k.len(), v.len()));
    }
    crate::sandbox::sha256_hex(text.as_bytes())
}
