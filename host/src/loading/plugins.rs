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
use crate::contract::{Description, isolation};
use crate::engine::controller::{
    Controller, ControllerDebug, ControllerParts, Version, plugin_cache, resolve_watches,
};
use crate::engine::informer::{InformerKey, ShardedStream};
use crate::loading::files;
use crate::loading::settings::{ControllerSelection, PluginSettings, SecretRef};
use crate::sandbox::http::effective_hosts;
use crate::sandbox::tape::Recorder;
use crate::sandbox::{CallError, Compiled, Limits};

mod load;
use load::missing_grant;

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
    /// Wall time a plugin's `describe` may take (`--describe-timeout-seconds`), sleeping included.
    pub describe_timeout: Duration,
    /// Plugin objects (`plugins.wcm.dev`), loaded beside the directory's files under the keys
    /// `Plugin/NAME` (`--plugin-objects`).
    pub objects: Option<Arc<crate::loading::objects::ObjectSource>>,
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
    /// `describe` did not answer within its deadline once (a busy host can make an honest plugin
    /// late): it is tried again once, and refused if late again.
    SlowDescribe,
}

impl WaitReason {
    pub const ALL: [WaitReason; 6] = [
        WaitReason::Forbidden,
        WaitReason::NotServed,
        WaitReason::Unreachable,
        WaitReason::NameTaken,
        WaitReason::InstancePool,
        WaitReason::SlowDescribe,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Forbidden => "forbidden",
            WaitReason::NotServed => "not_served",
            WaitReason::Unreachable => "unreachable",
            WaitReason::NameTaken => "name_taken",
            WaitReason::InstancePool => "instance_pool",
            WaitReason::SlowDescribe => "slow_describe",
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
    /// Seen for the first time and being loaded now (compiled, described, granted, started).
    Loading,
}

impl FileStatus {
    /// The plugin's name, when the file got far enough to declare one.
    pub fn plugin(&self) -> Option<&str> {
        match self {
            FileStatus::Running { plugin, .. }
            | FileStatus::Disabled { plugin }
            | FileStatus::Waiting { plugin, .. } => Some(plugin),
            FileStatus::Refused { .. } | FileStatus::Loading => None,
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
    /// A turn per digest being compiled now: files with the same bytes loading at once wait for
    /// the first compile and take its result from `compiled` (an entry lives while someone holds or
    /// waits for it).
    compiling: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What `describe` returned, by file stem, for the content and settings it was for (pruned at
    /// each rescan): a file that waits is not described again each time it is tried.
    described: std::sync::Mutex<HashMap<String, (OnDisk, Arc<Description>)>>,
    /// Files being loaded now, each by a task of its own (one at a time per file).
    loading: std::sync::Mutex<HashMap<String, Loading>>,
    /// Plugin names claimed by a load in progress, with the file claiming each.
    claims: std::sync::Mutex<HashMap<String, String>>,
    /// Plugin names whose controller is being stopped in the background (its in-flight calls end
    /// first): no file starts a plugin under such a name until the stop is done.
    stopping_names: std::sync::Mutex<HashMap<String, usize>>,
    /// The background stops, so [`PluginManager::stop_all`] can wait for them.
    retiring: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Files whose `describe` missed its deadline once, with the content it was for.
    late_describes: std::sync::Mutex<HashMap<String, OnDisk>>,
    /// `describe` calls at once: as many as the instance pool keeps slots for.
    describe_turns: tokio::sync::Semaphore,
    /// A load ended whose file changed (or went) meanwhile: rescan at once.
    load_ended: tokio::sync::Notify,
    /// Set by [`PluginManager::stop_all`]: nothing is loaded any more.
    stopping: std::sync::atomic::AtomicBool,
    /// Set once the first scan has loaded what was there (for `/readyz`).
    scanned: std::sync::atomic::AtomicBool,
}

/// A load in progress.
struct Loading {
    /// The content being loaded.
    disk: OnDisk,
    /// A rescan saw the file change or go while it was being loaded: it is looked at again as soon
    /// as this load ends.
    changed: bool,
    /// To cancel the load at shutdown.
    abort: Option<tokio::task::AbortHandle>,
    /// Stops its compile once the file changed or went: the one-compile lock is not held for
    /// content no one wants any more.
    cancel_compile: crate::sandbox::compiler::CompileCancel,
}

/// Ends a load's bookkeeping however the load ends (a panic included): the file is no longer
/// loading, the name it claimed is free, and a rescan follows if the file changed meanwhile.
struct LoadGuard {
    manager: Arc<PluginManager>,
    stem: String,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        let m = &self.manager;
        let ended = lock(&m.loading).remove(&self.stem);
        lock(&m.claims).retain(|_, stem| *stem != self.stem);
        if ended.is_some_and(|l| l.changed) {
            m.load_ended.notify_one();
        }
    }
}

/// A plugin name whose controller is being stopped: free again when dropped (however the stop
/// ends), and the files waiting for it are tried at once.
struct NameStopping {
    manager: Arc<PluginManager>,
    name: String,
}

impl Drop for NameStopping {
    fn drop(&mut self) {
        let mut names = lock(&self.manager.stopping_names);
        if let Some(n) = names.get_mut(&self.name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                names.remove(&self.name);
            }
        }
        drop(names);
        self.manager.load_ended.notify_one();
    }
}

/// How long one plugin's grant or Secret check at a rescan may take; one that does not answer in
/// time changes nothing.
const RECHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// A std mutex's guard; its data stays usable after a panic elsewhere (every holder leaves it
/// consistent: single inserts and removals).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
            compiling: std::sync::Mutex::default(),
            described: Default::default(),
            loading: Default::default(),
            claims: Default::default(),
            stopping_names: Default::default(),
            retiring: Default::default(),
            late_describes: Default::default(),
            describe_turns: tokio::sync::Semaphore::new(
                crate::sandbox::pool::DESCRIBE_SLOTS as usize,
            ),
            load_ended: tokio::sync::Notify::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
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
                _ = self.load_ended.notified() => {}
                _ = async {
                    match &self.settings.objects {
                        Some(o) => o.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    // Plugin objects change at the pace of whoever writes them: at most one
                    // rescan a second for them (changes meanwhile are taken by that one).
                    tokio::time::sleep(Duration::from_secs(1)).await;
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
        {
            let loading = lock(&self.loading);
            for (stem, (disk, err)) in refused.iter() {
                // A refused file being loaded again has changed since: it shows as loading.
                if loading.get(stem).is_none_or(|l| l.disk == *disk) {
                    out.entry(stem.clone())
                        .or_insert_with(|| FileStatus::Refused { error: err.clone() });
                }
            }
            for stem in loading.keys() {
                out.entry(stem.clone()).or_insert(FileStatus::Loading);
            }
        }
        out
    }

    /// What each described file declares, as `inspect` shows it: contract, watches, permissions
    /// and outbound hosts (for the status of Plugin objects).
    pub async fn declared(&self) -> BTreeMap<String, serde_json::Value> {
        let described: Vec<(String, OnDisk, Arc<Description>)> = lock(&self.described)
            .iter()
            .map(|(k, (d, desc))| (k.clone(), d.clone(), desc.clone()))
            .collect();
        let compiled = self.compiled.lock().await;
        described
            .into_iter()
            .map(|(stem, disk, d)| {
                let contract = compiled
                    .get(&disk.wasm_sha)
                    .map(|c| c.contract_version().to_string());
                let watches: Vec<String> = std::iter::once(&d.primary)
                    .chain(d.secondaries.iter().map(|s| &s.watch))
                    .map(crate::loading::inspect::fmt_watch)
                    .collect();
                let permissions: Vec<String> = d
                    .permissions
                    .iter()
                    .map(|p| {
                        format!(
                            "{} {} ({})",
                            p.verbs.join(","),
                            p.resource,
                            if p.group.is_empty() { "core" } else { &p.group }
                        )
                    })
                    .collect();
                (
                    stem,
                    serde_json::json!({
                        "plugin": d.name,
                        "version": d.version,
                        "contract": contract,
                        "watches": watches,
                        "permissions": permissions,
                        "hosts": d.outbound_hosts,
                    }),
                )
            })
            .collect()
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
                    FileStatus::Loading => serde_json::json!({"state": "loading"}),
                };
                v["file"] = shown(stem).into();
                if let Some(d) = running.get(stem) {
                    v["version"] = d.version.clone().into();
                    v["isolation"] = d.isolation.into();
                    v["workers"] = d.workers.into();
                    v["queueDepth"] = d.queue_depth.into();
                    v["inFlight"] = d.in_flight.into();
                    v["leading"] = d.leading.into();
                    v["leader"] = d.leader.clone().into();
                    v["lastError"] = serde_json::to_value(&d.last_error).unwrap_or_default();
                    if !d.schedules.is_empty() {
                        v["schedules"] =
                            serde_json::to_value(&d.schedules).unwrap_or_default();
                    }
                    if let Some(shards) = &d.shards {
                        v["shards"] = serde_json::to_value(shards).unwrap_or_default();
                    }
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

    /// Compares the directory with what runs and applies the difference. Removed files, revoked
    /// grants, rotated Secrets and kinds served differently are dealt with here, before anything
    /// is loaded; each new or changed file is then loaded by a task of its own, so one file's slow
    /// load (a `describe` that sleeps, caches slow to fill) never delays another file's load nor
    /// the next rescan. Returns the loads it started.
    pub async fn rescan(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let _one_at_a_time = self.rescan_lock.lock().await;
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return Vec::new();
        }
        let on_disk = match self.read_dir() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(dir = %self.settings.dir.display(), "cannot read the plugins directory: {e:#}");
                return Vec::new();
            }
        };
        // A file being loaded that changed or went meanwhile is looked at again once its load ends.
        for (stem, l) in lock(&self.loading).iter_mut() {
            let now = on_disk.get(stem);
            l.changed |= now != Some(&l.disk);
            // Other bytes, or no file: its compile is of no use (a changed NAME.toml alone keeps it).
            if now.is_none_or(|d| d.wasm_sha != l.disk.wasm_sha) {
                l.cancel_compile.cancel();
            }
        }
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
            if let Some(disk) = self.retire(&stem, true).await {
                tracing::info!(file = %disk.wasm.display(), "plugin file removed: stopping its plugin");
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
            if !self.runs_or_waits(&plugin).await {
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
            let named: std::collections::HashSet<String> =
                on_disk_shas.into_iter().cloned().collect();
            self.parts.runtime.trim_compile_cache(&named);
        }
        lock(&self.described).retain(|stem, (disk, _)| on_disk.get(stem) == Some(disk));
        lock(&self.late_describes).retain(|stem, disk| on_disk.get(stem) == Some(disk));
        // New and changed files, in name order.
        let mut stems: Vec<&String> = on_disk.keys().collect();
        stems.sort();
        let mut loads = Vec::new();
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
            {
                let mut loading = lock(&self.loading);
                if loading.contains_key(stem) {
                    // One load per file at a time.
                    continue;
                }
                loading.insert(
                    stem.clone(),
                    Loading {
                        disk: disk.clone(),
                        changed: false,
                        abort: None,
                        cancel_compile: Default::default(),
                    },
                );
            }
            let guard = LoadGuard {
                manager: self.clone(),
                stem: stem.clone(),
            };
            let disk = disk.clone();
            let load = tokio::spawn(async move {
                let m = guard.manager.clone();
                m.load_and_record(&guard.stem, &disk).await;
                drop(guard);
            });
            if let Some(l) = lock(&self.loading).get_mut(stem) {
                l.abort = Some(load.abort_handle());
            }
            loads.push(load);
        }
        self.count_loaded().await;
        loads
    }

    /// Scans the directory once and waits until every file it found has loaded, waits or is
    /// refused; `/readyz` answers ready from then on.
    pub async fn first_scan(self: &Arc<Self>) {
        for load in self.rescan().await {
            let _ = load.await;
        }
        self.scanned
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// `wcm_plugins_loaded`: the files whose plugin runs.
    async fn count_loaded(&self) {
        let n = self
            .running
            .lock()
            .await
            .values()
            .filter(|r| r.controller.is_some())
            .count();
        self.parts.metrics.plugins_loaded(n);
    }

    /// Loads one file and records how it went: running, waiting (tried again by itself) or
    /// refused until the file changes.
    async fn load_and_record(&self, stem: &str, disk: &OnDisk) {
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
                let mut waiting = self.waiting.lock().await;
                // It waited under its file's name before it was described (no instance slot).
                if let Some(old) = waiting.get(stem)
                    && old.plugin != plugin
                {
                    self.set_waiting(&old.plugin, None);
                }
                self.set_waiting(&plugin, Some(reason));
                let changed = waiting
                    .get(stem)
                    .is_none_or(|w| w.message != message || w.disk != *disk);
                if changed {
                    tracing::warn!(plugin = %plugin, file = %disk.wasm.display(), reason = reason.as_str(), "plugin waits: {message}");
                }
                waiting.insert(
                    stem.to_string(),
                    Waiting {
                        disk: disk.clone(),
                        plugin,
                        reason,
                        message,
                    },
                );
            }
            // The file changed or went while it compiled: nothing to record for this content; the
            // rescan that follows this load looks at the file as it is now.
            Err(LoadError::Refused(e)) if crate::sandbox::compiler::is_cancelled(&e) => {
                tracing::info!(file = %disk.wasm.display(), "compile cancelled: the file changed or was removed meanwhile");
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
                    .insert(stem.to_string(), (disk.clone(), msg));
            }
        }
        self.count_loaded().await;
    }

    /// Whether the first scan is done.
    pub fn scanned(&self) -> bool {
        self.scanned.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops every running plugin whose identity lost a grant it needs; it waits again. The
    /// plugins are checked side by side, each within [`RECHECK_TIMEOUT`].
    async fn recheck_grants(self: &Arc<Self>) {
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
        let verdicts = futures::future::join_all(checks.into_iter().map(
            |(stem, name, identity, accesses)| async move {
                // An API server that does not answer (in time) revokes nothing.
                let denied =
                    tokio::time::timeout(RECHECK_TIMEOUT, identity.first_denied(&accesses)).await;
                let message = match denied {
                    Ok(Ok(Some(denied))) => Some(missing_grant(&identity, &denied)),
                    _ => None,
                };
                (stem, name, message)
            },
        ))
        .await;
        for (stem, name, message) in verdicts {
            let Some(message) = message else {
                continue;
            };
            let Some(disk) = self.retire(&stem, false).await else {
                continue;
            };
            tracing::warn!(plugin = %name, "grant revoked, stopping the plugin: {message}");
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
    /// Secret that cannot be read now (or within [`RECHECK_TIMEOUT`]) leaves the plugin running
    /// with what it has.
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
        let rotated = futures::future::join_all(checks.into_iter().map(
            |(stem, settings, identity, digest)| async move {
                let now = tokio::time::timeout(
                    RECHECK_TIMEOUT,
                    self.resolve_secrets(&settings, &identity),
                )
                .await;
                let rotated = matches!(now, Ok(Ok(now)) if digest_of(&now) != digest);
                (stem, rotated)
            },
        ))
        .await;
        for (stem, rotated) in rotated {
            if rotated && let Some(r) = self.running.lock().await.get_mut(&stem) {
                tracing::info!(plugin = %r.name, "a Secret it reads changed: loading it again");
                r.secrets_rotated = true;
            }
        }
    }

    /// Resolves the kinds every running plugin watches again (from the discovery cache, which
    /// forgets a group when one of its CRDs changes): a plugin whose kinds now resolve to other
    /// informers — a CRD re-created with another scope — or are no longer served is stopped and
    /// loaded again by this rescan, and waits if its kind is gone.
    async fn recheck_kinds(self: &Arc<Self>) {
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
        let verdicts = futures::future::join_all(running.into_iter().map(
            |(stem, keys, version)| async move {
                let now = resolve_watches(&self.parts.api, &version.description).await;
                let same = match &now {
                    // A sharded plugin's own stream of its primaries is the same kind's.
                    Ok(watches) => watches.iter().map(|(k, _)| k).eq(keys
                        .iter()
                        .map(|k| InformerKey {
                            shard: None,
                            ..k.clone()
                        })
                        .collect::<Vec<_>>()
                        .iter()),
                    // Not served any more (a 404); anything else (the API server unreachable) is
                    // no reason to stop a running plugin.
                    Err(f) => f.code != 404,
                };
                (stem, version.description.name.clone(), same)
            },
        ))
        .await;
        for (stem, name, same) in verdicts {
            // Stopped and loaded again by this rescan: it runs on the new informers, or waits
            // (not served) until its kind is back.
            if !same && self.retire(&stem, false).await.is_some() {
                tracing::info!(plugin = %name, "a kind it watches is served differently now, or not at all: loading it again");
            }
        }
    }

    /// Takes `stem`'s plugin out of what runs and stops it in the background: its in-flight calls
    /// end first (up to their wall timeout), and neither the rescan nor any other file waits for
    /// that. Its name stays taken until the stop is done. With `forget`, its metric series go
    /// afterwards, unless another file runs or waits under its name by then. Returns the content it
    /// ran.
    async fn retire(self: &Arc<Self>, stem: &str, forget: bool) -> Option<OnDisk> {
        let r = {
            let mut running = self.running.lock().await;
            let r = running.remove(stem)?;
            *lock(&self.stopping_names)
                .entry(r.name.clone())
                .or_default() += 1;
            r
        };
        let disk = r.disk.clone();
        let name = NameStopping {
            manager: self.clone(),
            name: r.name.clone(),
        };
        let stop = tokio::spawn(async move {
            let m = name.manager.clone();
            m.stop_running(r).await;
            let plugin = name.name.clone();
            // The name is free from here; a file waiting for it is tried at once.
            drop(name);
            if forget && !m.runs_or_waits(&plugin).await {
                m.parts.metrics.forget_plugin(&plugin);
            }
        });
        let mut retiring = lock(&self.retiring);
        retiring.retain(|t| !t.is_finished());
        retiring.push(stop);
        Some(disk)
    }

    /// Whether a file runs, waits or stops under the plugin name `plugin`.
    async fn runs_or_waits(&self, plugin: &str) -> bool {
        self.running.lock().await.values().any(|r| r.name == plugin)
            || self
                .waiting
                .lock()
                .await
                .values()
                .any(|w| w.plugin == plugin)
            || lock(&self.stopping_names).contains_key(plugin)
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
        // Plugin objects, as files would be (their keys hold a `/`, which no file stem can).
        if let Some(objects) = &self.settings.objects {
            for (key, l) in objects.snapshot() {
                let refusal = (l.bytes.len() as u64 > self.settings.max_wasm_bytes).then(|| {
                    format!(
                        "larger than --max-plugin-bytes ({})",
                        self.settings.max_wasm_bytes
                    )
                });
                out.insert(
                    key.clone(),
                    OnDisk {
                        wasm: PathBuf::from(&key),
                        wasm_sha: l.sha256,
                        bytes: l.bytes,
                        settings_text: l.settings_text,
                        refusal,
                    },
                );
            }
        }
        Ok(out)
    }

    /// Stops every plugin: no load starts any more; the loads in progress get a few seconds to end
    /// by themselves and are then cancelled (a controller a cancelled load held ends its tasks when
    /// dropped); the plugins being stopped in the background and then every running plugin stop,
    /// each letting its in-flight calls end.
    pub async fn stop_all(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        // Held: no rescan is between its check of `stopping` and the start of its loads.
        drop(self.rescan_lock.lock().await);
        let deadline = tokio::time::Instant::now() + LOADS_AT_STOP;
        while !lock(&self.loading).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for l in lock(&self.loading).values() {
            if let Some(a) = &l.abort {
                a.abort();
            }
        }
        while !lock(&self.loading).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let retiring = std::mem::take(&mut *lock(&self.retiring));
        for stop in retiring {
            let _ = stop.await;
        }
        let all: Vec<Running> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in all {
            self.stop_running(r).await;
        }
    }
}

/// How long the loads in progress at a stop may take to end by themselves.
const LOADS_AT_STOP: Duration = Duration::from_secs(5);

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

/// How a loader key is shown: `NAME.wasm` for a file of the directory, `Plugin/NAME` for a
/// Plugin object.
pub fn shown(key: &str) -> String {
    if key.contains('/') {
        key.to_string()
    } else {
        format!("{key}.wasm")
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
