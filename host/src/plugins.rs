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
//! A bad file is refused with a clear error, once per content, and what was running keeps running,
//! including the previous version of a plugin whose update is bad.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tokio::sync::Mutex;

use crate::controller::{Controller, ControllerParts, Version, plugin_cache, resolve_watches};
use crate::events::EventSink;
use crate::permissions::Permissions;
use crate::sandbox::{Compiled, Description, Limits};
use crate::services::Services;
use crate::settings::{PluginSettings, SecretRef};

/// Limits on what the directory may hold.
#[derive(Debug, Clone)]
pub struct DirSettings {
    pub dir: PathBuf,
    pub max_wasm_bytes: u64,
    pub rescan: Duration,
    pub default_limits: Limits,
    pub default_workers: u32,
    /// Hosts the operator allows for any plugin's outbound HTTP.
    pub allowed_hosts: Vec<String>,
}

/// What is on disk for one plugin file.
#[derive(Debug, Clone, PartialEq)]
struct OnDisk {
    wasm: PathBuf,
    wasm_sha: String,
    settings_text: Option<String>,
}

struct Running {
    name: String,
    disk: OnDisk,
    controller: Option<Controller>,
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
    Refused {
        error: String,
    },
}

pub struct PluginManager {
    parts: Arc<ControllerParts>,
    events: EventSink,
    settings: DirSettings,
    /// By file stem.
    running: Mutex<HashMap<String, Running>>,
    /// Errors by file stem, with the content they were for (so each is logged once).
    refused: Mutex<HashMap<String, (OnDisk, String)>>,
    rescan_lock: Mutex<()>,
}

impl PluginManager {
    pub fn new(parts: Arc<ControllerParts>, events: EventSink, settings: DirSettings) -> Arc<Self> {
        Arc::new(PluginManager {
            parts,
            events,
            settings,
            running: Mutex::default(),
            refused: Mutex::default(),
            rescan_lock: Mutex::new(()),
        })
    }

    /// Scans once, then watches the directory until the task is dropped.
    pub async fn run(self: Arc<Self>) -> Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if res.is_ok() {
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
        loop {
            tokio::select! {
                got = rx.recv() => {
                    if got.is_none() { return Ok(()); }
                    // Let a burst of events (write, rename, symlink swap) settle into one rescan.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = tick.tick() => {}
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
        for (stem, (_, err)) in refused.iter() {
            out.entry(stem.clone())
                .or_insert_with(|| FileStatus::Refused { error: err.clone() });
        }
        out
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
        for stem in gone {
            let removed = self.running.lock().await.remove(&stem);
            if let Some(r) = removed {
                tracing::info!(plugin = %r.name, file = %stem, "plugin file removed: stopping");
                if let Some(c) = r.controller {
                    c.stop().await;
                }
            }
        }
        self.refused
            .lock()
            .await
            .retain(|stem, _| on_disk.contains_key(stem));
        // New and changed files.
        for (stem, disk) in on_disk {
            let unchanged = self
                .running
                .lock()
                .await
                .get(&stem)
                .is_some_and(|r| r.disk == disk);
            let already_refused = self
                .refused
                .lock()
                .await
                .get(&stem)
                .is_some_and(|(d, _)| *d == disk);
            if unchanged || already_refused {
                continue;
            }
            match self.load(&stem, &disk).await {
                Ok(()) => {
                    self.refused.lock().await.remove(&stem);
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let keeps = if self.running.lock().await.contains_key(&stem) {
                        "; the previous version keeps running"
                    } else {
                        ""
                    };
                    tracing::error!(file = %disk.wasm.display(), "plugin refused: {msg}{keeps}");
                    self.refused.lock().await.insert(stem, (disk, msg));
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
    }

    fn read_dir(&self) -> Result<HashMap<String, OnDisk>> {
        let mut out = HashMap::new();
        for entry in std::fs::read_dir(&self.settings.dir)? {
            let path = entry?.path();
            let Some(stem) = wasm_stem(&path) else {
                continue;
            };
            // Follow symlinks: a ConfigMap mount swaps `..data` and every file behind it at once.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            if meta.len() > self.settings.max_wasm_bytes {
                out.insert(
                    stem.clone(),
                    OnDisk {
                        wasm: path.clone(),
                        wasm_sha: format!("too-large:{}", meta.len()),
                        settings_text: None,
                    },
                );
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let settings_path = path.with_extension("toml");
            let settings_text = std::fs::read_to_string(&settings_path).ok();
            out.insert(
                stem,
                OnDisk {
                    wasm: path,
                    wasm_sha: crate::sandbox::sha256_hex(&bytes),
                    settings_text,
                },
            );
        }
        Ok(out)
    }

    async fn load(&self, stem: &str, disk: &OnDisk) -> Result<()> {
        if let Some(size) = disk.wasm_sha.strip_prefix("too-large:") {
            bail!(
                "{} is {size} bytes, over the {} byte limit (--max-plugin-bytes)",
                disk.wasm.display(),
                self.settings.max_wasm_bytes
            );
        }
        let settings = match &disk.settings_text {
            Some(text) => PluginSettings::parse(text).map_err(|e| {
                anyhow::anyhow!("{}: {e}", disk.wasm.with_extension("toml").display())
            })?,
            None => PluginSettings::default(),
        };
        let bytes = tokio::fs::read(&disk.wasm)
            .await
            .with_context(|| format!("read {}", disk.wasm.display()))?;
        let runtime = self.parts.runtime.clone();
        let compiled = tokio::task::spawn_blocking(move || runtime.compile(&bytes))
            .await
            .context("compile task")??;
        let limits = settings.limits(&self.settings.default_limits);
        let describe_services = Arc::new(Services::for_describe(stem, settings.config.clone()));
        let mut description = self
            .parts
            .runtime
            .describe(&compiled, describe_services, &limits)
            .await
            .map_err(|e| anyhow::anyhow!("describe failed: {e}"))?;
        if let Some(name) = &settings.name {
            description.name = name.clone();
        }
        validate(&description)?;
        {
            let running = self.running.lock().await;
            if let Some((other, _)) = running
                .iter()
                .find(|(s, r)| r.name == description.name && s.as_str() != stem)
            {
                bail!(
                    "plugin name {:?} is already used by {other}.wasm",
                    description.name
                );
            }
        }
        let secrets = self.resolve_secrets(&settings).await?;
        let watches = resolve_watches(&self.parts.api, &description).await?;
        let keys: Vec<_> = watches.iter().map(|(k, _)| k.clone()).collect();
        let namespaced: Vec<bool> = watches.iter().map(|(_, n)| *n).collect();
        let workers = settings
            .workers
            .or(description.workers)
            .unwrap_or(self.settings.default_workers)
            .max(1);
        let resync = settings
            .resync_seconds
            .or(description.resync_seconds)
            .map(|s| Duration::from_secs(u64::from(s)));

        let mut running = self.running.lock().await;
        let previous = running.remove(stem);
        // Hosts: what the plugin declared and the operator allowed (globally or for this plugin).
        let allowed_hosts: Vec<String> = description
            .outbound_hosts
            .iter()
            .filter(|h| {
                self.settings.allowed_hosts.contains(h) || settings.allowed_hosts.contains(h)
            })
            .cloned()
            .collect();
        if !settings.enabled() {
            if let Some(c) = previous.and_then(|p| p.controller) {
                c.stop().await;
            }
            tracing::info!(plugin = %description.name, "plugin disabled by its settings");
            running.insert(
                stem.to_string(),
                Running {
                    name: description.name.clone(),
                    disk: disk.clone(),
                    controller: None,
                },
            );
            return Ok(());
        }
        let informers: Vec<_> = keys
            .iter()
            .map(|k| self.parts.informers.acquire(k.clone()))
            .collect();
        let services = Arc::new(Services::new(
            &description.name,
            Permissions::new(description.permissions.clone()),
            self.parts.api.clone(),
            plugin_cache(&informers),
            self.events.clone(),
            settings.config.clone(),
            secrets,
            self.parts.metrics.clone(),
            allowed_hosts,
        ));
        let name = description.name.clone();
        let sha = compiled.sha256.clone();
        let version = Version {
            compiled,
            description,
            services,
            limits,
            isolation: settings.isolation.unwrap_or_default(),
            id: Version::next_id(),
        };
        let same_shape = previous
            .as_ref()
            .and_then(|p| p.controller.as_ref())
            .is_some_and(|c| c.name == name && c.informer_keys() == keys && c.workers() == workers);
        let controller = match previous.and_then(|p| p.controller) {
            Some(c) if same_shape => {
                tracing::info!(plugin = %name, sha256 = %sha, "new version: replacing in place (queue kept)");
                c.swap(version).await;
                c
            }
            other => {
                if let Some(c) = other {
                    tracing::info!(plugin = %name, "new version watches differently: restarting its controller");
                    c.stop().await;
                }
                Controller::start(&self.parts, informers, namespaced, version, workers, resync)
                    .await
            }
        };
        tracing::info!(plugin = %name, file = %disk.wasm.display(), sha256 = %sha, "plugin running");
        running.insert(
            stem.to_string(),
            Running {
                name,
                disk: disk.clone(),
                controller: Some(controller),
            },
        );
        Ok(())
    }

    async fn resolve_secrets(&self, settings: &PluginSettings) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (key, reference) in &settings.secrets {
            let r =
                SecretRef::parse(reference).map_err(|e| anyhow::anyhow!("secrets.{key}: {e}"))?;
            let api: Api<Secret> = Api::namespaced(self.parts.api.client().clone(), &r.namespace);
            let secret = api.get(&r.name).await.with_context(|| {
                format!("secrets.{key}: read Secret {}/{}", r.namespace, r.name)
            })?;
            let value = secret
                .data
                .and_then(|d| d.get(&r.key).cloned())
                .with_context(|| {
                    format!(
                        "secrets.{key}: Secret {}/{} has no key {:?}",
                        r.namespace, r.name, r.key
                    )
                })?;
            out.insert(
                key.clone(),
                String::from_utf8(value.0)
                    .with_context(|| format!("secrets.{key}: the value is not UTF-8"))?,
            );
        }
        Ok(out)
    }

    /// Stops every plugin.
    pub async fn stop_all(&self) {
        let all: Vec<Running> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in all {
            if let Some(c) = r.controller {
                c.stop().await;
            }
        }
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

/// Checks what `describe` returned.
pub fn validate(d: &Description) -> Result<()> {
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    if !dns_label(&d.name) {
        bail!(
            "plugin name {:?} is not a DNS label (lowercase letters, digits and '-', at most 63)",
            d.name
        );
    }
    for w in std::iter::once(&d.primary).chain(d.secondaries.iter().map(|s| &s.watch)) {
        if w.kind.version.is_empty() || w.kind.kind.is_empty() {
            bail!("a watch of plugin {} has no version or kind", d.name);
        }
        if let Some(sel) = &w.label_selector {
            crate::selector::Selector::parse(sel)
                .map_err(|e| anyhow::anyhow!("plugin {}: {e}", d.name))?;
        }
    }
    if d.workers == Some(0) {
        bail!("plugin {} declares 0 workers", d.name);
    }
    for (k, v) in &d.extensions {
        if serde_json::from_str::<serde_json::Value>(v).is_err() {
            bail!("plugin {}: extension {k:?} is not JSON", d.name);
        }
        tracing::info!(plugin = %d.name, extension = %k, "extension not known to this host: ignored");
    }
    Ok(())
}

/// What `inspect` prints about a compiled plugin.
pub fn describe_compiled(c: &Compiled) -> String {
    format!(
        "sha256 {}  size {} bytes  loaded in {:?}{}",
        c.sha256,
        c.size,
        c.load_time,
        if c.from_cache {
            " (precompiled cache)"
        } else {
            ""
        }
    )
}
