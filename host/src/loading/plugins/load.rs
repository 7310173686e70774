//! Loading one plugin file: compile, `describe`, validate, resolve its watches, grants and
//! Secrets, reserve its instance slot, then start its controller or swap the new version in place.

use super::*;

impl PluginManager {
    pub(super) async fn load(&self, stem: &str, disk: &OnDisk) -> Result<(), LoadError> {
        if let Some(why) = &disk.refusal {
            return Err(anyhow::anyhow!("{why}").into());
        }
        let settings = match &disk.settings_text {
            Some(text) => PluginSettings::parse(text).map_err(|e| {
                anyhow::anyhow!("{}: {e}", disk.wasm.with_extension("toml").display())
            })?,
            None => PluginSettings::default(),
        };
        let compiled = self.compile(stem, disk).await?;
        let limits = settings.limits(&self.settings.default_limits);
        let description = (*self
            .describe(stem, disk, &settings, &compiled, &limits)
            .await?)
            .clone();
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
        // A name is a file's before it is a Plugin object's: a file of the plugins directory is
        // the operator's own, an object may be anyone's the cluster lets write Plugins.
        let is_object = |key: &str| key.contains('/');
        let first = |a: &str, b: &str| {
            if is_object(a) != is_object(b) {
                !is_object(a)
            } else {
                a < b
            }
        };
        {
            let mut running = self.running.lock().await;
            let other = running
                .iter()
                .find(|(s, r)| r.name == name && s.as_str() != stem)
                .map(|(s, _)| s.clone());
            if let Some(other) = other {
                if !is_object(stem) && is_object(&other) {
                    // The file takes its name back; the object waits for it (NameTaken).
                    let taken = running.remove(&other);
                    drop(running);
                    tracing::warn!(plugin = %name, file = %shown(stem), "the Plugin object {} ran this name: stopped, the file of the plugins directory runs it", shown(&other));
                    if let Some(p) = taken {
                        self.stop_running(p).await;
                    }
                } else {
                    return Err(waiting(
                        WaitReason::NameTaken,
                        format!(
                            "plugin name {name:?} is used by {}; this one starts when that one goes",
                            shown(&other)
                        ),
                    ));
                }
            } else {
                drop(running);
            }
            if lock(&self.stopping_names).contains_key(&name) {
                return Err(waiting(
                    WaitReason::NameTaken,
                    format!(
                        "the previous controller of plugin {name:?} is still stopping (its in-flight calls end first); this file starts when it has"
                    ),
                ));
            }
            // Of two files loading at once under one name, the first in name order runs (once
            // it has been described; before that, the first to get here).
            let loading = lock(&self.loading);
            let described = lock(&self.described);
            if let Some(lower) = loading.iter().find_map(|(other, l)| {
                let (d, desc) = described.get(other)?;
                (first(other, stem) && *d == l.disk && desc.name == name).then_some(other)
            }) {
                return Err(waiting(
                    WaitReason::NameTaken,
                    format!(
                        "plugin name {name:?} is being loaded from {}; this one starts when that one goes",
                        shown(lower)
                    ),
                ));
            }
            drop((loading, described));
            // Files load side by side: the name is claimed until this load has ended (and the
            // plugin runs under it), so two files never start one plugin twice.
            let mut claims = lock(&self.claims);
            match claims.get(&name) {
                Some(other) if other != stem => {
                    return Err(waiting(
                        WaitReason::NameTaken,
                        format!(
                            "plugin name {name:?} is being loaded from {}; this one starts when that one goes",
                            shown(other)
                        ),
                    ));
                }
                _ => {
                    claims.insert(name.clone(), stem.to_string());
                }
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
        let previous = {
            let mut running = self.running.lock().await;
            // Checked under the lock a background stop takes its plugin out with: a revoked or
            // re-kinded version of this plugin may have been taken out meanwhile.
            if lock(&self.stopping_names).contains_key(&name) {
                return Err(waiting(
                    WaitReason::NameTaken,
                    format!(
                        "the previous controller of plugin {name:?} is still stopping (its in-flight calls end first); this file starts when it has"
                    ),
                ));
            }
            running.remove(stem)
        };
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
        // Sharded only where replicas share plugins by Lease; elsewhere one replica reconciles
        // every key anyway.
        let sharded = settings.sharding().filter(|_| {
            let per_plugin = matches!(
                *self.parts.election,
                crate::cluster::election::Election::PerPlugin(_)
            );
            if !per_plugin {
                tracing::warn!(plugin = %name, "`shards` is set but the replicas do not share plugins (--leader-elect-mode per-plugin): the plugin runs unsharded");
            }
            per_plugin
        });
        if sharded.is_some() && !description.schedules.is_empty() {
            return Err(anyhow::anyhow!(
                "a sharded plugin (`shards` in its settings) may not declare schedules yet: each \
                 replica would tick them; run it unsharded, or move the schedules to a plugin of \
                 their own"
            )
            .into());
        }
        // A sharded plugin's primaries come by a stream of its own that asks the API server for
        // the ranges this replica holds, where the API server filters by range (KEP-5866);
        // elsewhere by the shared stream of every object, the host dividing the work.
        let mut keys = keys;
        // By UID, a fixed key of a mapping is placed by its text, and the replica that holds it
        // would not cache its object: such a plugin caches every primary on every replica.
        let fixed_keys = description
            .secondaries
            .iter()
            .any(|s| matches!(s.mapping, crate::contract::Mapping::FixedKey(_)));
        if let Some((_, crate::engine::shard::ShardBy::Uid)) = sharded
            && fixed_keys
        {
            tracing::info!(plugin = %name, "a fixed-key mapping with shard_by = \"uid\": each replica caches every primary of the plugin, and the host divides the work (shard_by = \"namespace\" caches only the replica's share)");
        } else if let (Some((count, by)), Some(primary)) = (sharded, keys.first_mut()) {
            let client = self.parts.informers.client();
            match crate::engine::shard_watch::served(client, primary, by).await {
                Ok(true) => {
                    primary.shard = Some(ShardedStream {
                        by,
                        count,
                        plugin: name.clone(),
                    })
                }
                Ok(false) => {
                    tracing::warn!(plugin = %name, "the API server does not filter lists and watches by shardSelector (its ShardedListAndWatch gate is off): each replica caches every primary of the plugin, and the host divides the work")
                }
                Err(e) => {
                    tracing::warn!(plugin = %name, "could not tell whether the API server filters by shardSelector ({e:#}): each replica caches every primary of the plugin, and the host divides the work")
                }
            }
        }
        let same_shape = match &previous {
            Some(c) => {
                c.name == name
                    && c.sharded() == sharded
                    && c.fits(&keys, workers, &description, resync).await
            }
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
        // Per plugin, the plugin's election; a version swapped in keeps the running one's.
        let gate = self.parts.election.gate(&name, sharded);
        let informers: Vec<_> = keys
            .iter()
            .map(|k| match (&k.shard, &gate.sharding) {
                (Some(_), Some(s)) => self
                    .parts
                    .informers
                    .acquire_sharded(k.clone(), s.held_ranges()),
                _ => self.parts.informers.acquire(k.clone()),
            })
            .collect();
        self.events
            .register(&name, identity.client().clone(), gate.tenure.clone());
        // The plugin's own metrics, exported from here on (a new version's replace the old ones').
        let plugin_metrics = (!description.metrics.is_empty()).then(|| {
            Arc::new(crate::plugin_metrics::PluginMetrics::new(
                &name,
                &description.metrics,
                budgets.max_metric_series as usize,
            ))
        });
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
            .with_share(share)
            .with_plugin_metrics(plugin_metrics.clone())
            .with_trace_context(description.propagate_trace_context),
        );
        // The new version's metrics replace the old one's; a version declaring none has none.
        match &plugin_metrics {
            Some(m) => self.parts.metrics.plugin_metrics().insert(&name, m.clone()),
            None => self.parts.metrics.plugin_metrics().forget(&name),
        }
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

    /// What the component declares, from the memo when this content with these settings was
    /// described before. `describe` runs under the plugin's limits and a wall deadline of its own
    /// (`--describe-timeout-seconds`, sleeping included), so a component that sleeps in it is
    /// refused within that deadline and described no more until its file changes.
    async fn describe(
        &self,
        stem: &str,
        disk: &OnDisk,
        settings: &PluginSettings,
        compiled: &Compiled,
        limits: &Limits,
    ) -> Result<Arc<Description>, LoadError> {
        if let Some((d, description)) = lock(&self.described).get(stem)
            && d == disk
        {
            return Ok(description.clone());
        }
        let deadline = self.settings.describe_timeout.min(limits.wall_timeout);
        let limits = Limits {
            wall_timeout: deadline,
            ..limits.clone()
        };
        let services = Arc::new(Services::for_describe(stem, settings.config.clone()));
        // No more describes at once than the instance pool keeps slots for; the wait for a turn is
        // not part of the deadline.
        let _turn = self
            .describe_turns
            .acquire()
            .await
            .map_err(|_| anyhow::anyhow!("the loader is stopping"))?;
        let late_before = lock(&self.late_describes).get(stem) == Some(disk);
        let mut description = self
            .parts
            .runtime
            .describe(compiled, services, &limits)
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
                    // A busy host can make an honest describe late once: tried again, and refused
                    // only when late twice for the same content.
                    CallError::WallTimeout(_) if !late_before => {
                        lock(&self.late_describes).insert(stem.to_string(), disk.clone());
                        LoadError::Waiting {
                            plugin: stem.to_string(),
                            reason: WaitReason::SlowDescribe,
                            message: format!(
                                "describe took longer than its deadline of {deadline:?} (--describe-timeout-seconds): tried once more"
                            ),
                        }
                    }
                    CallError::WallTimeout(_) => anyhow::anyhow!(
                        "describe failed: it took longer than its deadline of {deadline:?} (--describe-timeout-seconds) twice; a plugin's describe only says what it is, and must not wait on anything"
                    )
                    .into(),
                    _ => anyhow::anyhow!("describe failed: {why}").into(),
                }
            })?;
        lock(&self.late_describes).remove(stem);
        // The operator's name for it (NAME.toml) is the one every check below uses.
        if let Some(name) = &settings.name {
            description.name = name.clone();
        }
        let description = Arc::new(description);
        lock(&self.described).insert(stem.to_string(), (disk.clone(), description.clone()));
        Ok(description)
    }

    /// The compiled component of these bytes: from the memo when the same bytes were compiled
    /// before (a waiting plugin is tried again every few seconds; it is not compiled each time).
    /// The compile stops when the file changes or goes meanwhile (the rescan cancels it), and when
    /// this future is dropped (the load cancelled, the host stopping): its child is killed.
    /// Files with the same bytes loading at once compile them once: the others wait for that turn
    /// and take its result (a cancelled compile leaves the turn to the next one, which compiles).
    async fn compile(&self, stem: &str, disk: &OnDisk) -> anyhow::Result<Arc<Compiled>> {
        if let Some(c) = self.compiled.lock().await.get(&disk.wasm_sha) {
            return Ok(c.clone());
        }
        let turn = CompileTurn::take(&self.compiling, &disk.wasm_sha);
        let mutex = turn.turn();
        let _held = mutex.lock().await;
        if let Some(c) = self.compiled.lock().await.get(&disk.wasm_sha) {
            return Ok(c.clone());
        }
        let bytes = disk.bytes.clone();
        let runtime = self.parts.runtime.clone();
        let cancel = lock(&self.loading)
            .get(stem)
            .map(|l| l.cancel_compile.clone())
            .unwrap_or_default();
        let _dropped = crate::sandbox::compiler::CancelOnDrop(cancel.clone());
        let compiled = Arc::new(
            tokio::task::spawn_blocking(move || runtime.compile_cancellable(&bytes, &cancel))
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
    pub(super) async fn resolve_secrets(
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

pub(super) fn missing_grant(identity: &PluginIdentity, denied: &Access) -> String {
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

/// A place in the line for one digest's compile; the entry leaves the map with the last one
/// holding or waiting for it (also when the load is dropped).
struct CompileTurn<'a> {
    map: &'a std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    sha: String,
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl<'a> CompileTurn<'a> {
    fn take(
        map: &'a std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
        sha: &str,
    ) -> Self {
        let turn = lock(map).entry(sha.to_string()).or_default().clone();
        CompileTurn {
            map,
            sha: sha.to_string(),
            turn: Some(turn),
        }
    }

    fn turn(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.turn.clone().unwrap_or_default()
    }
}

impl Drop for CompileTurn<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        // Let go of this one's under the lock; then only the map's left means no one else holds or
        // waits for the turn (a clone is made only under this lock).
        drop(self.turn.take());
        if map
            .get(&self.sha)
            .is_some_and(|t| Arc::strong_count(t) == 1)
        {
            map.remove(&self.sha);
        }
    }
}
