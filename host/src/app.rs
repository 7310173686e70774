//! `wasm-controller-manager run`: wires the parts together and serves metrics and health.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cluster::api::ApiAccess;
use crate::cluster::election::{Election, LeaderMode, PluginLeases};
use crate::cluster::events::{self, EventSettings};
use crate::cluster::identity::IdentitySettings;
use crate::cluster::leader::{LeaderSettings, Leadership};
use crate::cluster::reach::ApiReach;
use crate::cluster::services::BudgetSettings;
use crate::cluster::tenure::Tenure;
use crate::engine::controller::ControllerParts;
use crate::engine::informer::Informers;
use crate::engine::rate_limit::{RateLimits, TokenBucket};
use crate::loading::objects::ObjectSource;
use crate::loading::plugins::{DirSettings, PluginManager};
use crate::loading::settings::ControllerSelection;
use crate::metrics::Metrics;
use crate::sandbox::tape::{RecordWhat, Recorder};
use crate::sandbox::{Limits, MemoryReset, Runtime, RuntimeSettings};
use crate::serving::HttpState;

/// Everything `run` needs, as parsed from the command line.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Plugin objects (`--plugin-objects`) and where their components may come from.
    pub plugin_objects: Option<crate::loading::objects::ObjectSettings>,
    pub kubeconfig: Option<PathBuf>,
    pub plugins_dir: PathBuf,
    pub compile_cache: Option<PathBuf>,
    /// The compile cache's bound, MiB (`--compile-cache-max-mb`).
    pub compile_cache_max_mb: u64,
    pub metrics_addr: Option<SocketAddr>,
    /// A separate address for /healthz and /readyz.
    pub health_addr: Option<SocketAddr>,
    pub kube_qps: f64,
    pub kube_burst: u32,
    pub api_timeout: Duration,
    pub default_workers: u32,
    pub limits: Limits,
    pub max_instances: u32,
    pub max_plugin_bytes: u64,
    pub rescan: Duration,
    pub allowed_hosts: Vec<String>,
    pub rate_limits: RateLimits,
    /// Event writes per second (all plugins) and the burst above it.
    pub event_qps: f64,
    pub event_burst: u32,
    /// Where plugins' ServiceAccounts live, and their name prefix.
    pub identity: IdentitySettings,
    /// Per-plugin budgets (API calls, log lines, instances).
    pub budgets: BudgetSettings,
    pub max_workers_per_plugin: u32,
    /// How often waiting plugins are tried again.
    pub wait_retry: Duration,
    /// Wall time a plugin's `describe` may take.
    pub describe_timeout: Duration,
    /// How long a plugin's caches may take to sync before it waits and is tried again.
    pub sync_timeout: Duration,
    /// Which plugins run (`--controllers`).
    pub controllers: ControllerSelection,
    /// Leader election among replicas; none: this process always reconciles.
    pub leader_election: Option<LeaderSettings>,
    /// One Lease for the manager, or one per plugin.
    pub leader_mode: LeaderMode,
    /// How long in-flight reconciles may take at shutdown.
    pub shutdown_grace: Duration,
    /// How pooled linear memories are reset between instances.
    pub memory_reset: MemoryReset,
    /// Where to record reconciles, and which.
    pub record: Option<(PathBuf, RecordWhat)>,
}

/// Recordings kept per plugin (the newest).
pub const RECORDINGS_KEPT: usize = 20;

/// A running manager (for tests and `run`).
pub struct Manager {
    pub plugins: Arc<PluginManager>,
    pub metrics: Arc<Metrics>,
    pub informers: Arc<Informers>,
    plugin_task: tokio::task::JoinHandle<()>,
    crd_task: tokio::task::JoinHandle<()>,
    http_task: Option<tokio::task::JoinHandle<()>>,
    health_task: Option<tokio::task::JoinHandle<()>>,
    object_tasks: Vec<tokio::task::JoinHandle<()>>,
    objects: Option<Arc<ObjectSource>>,
    /// Stopped when the manager stops or is dropped.
    _reach_task: crate::cluster::reach::ReachTask,
    pub metrics_addr: Option<SocketAddr>,
    pub health_addr: Option<SocketAddr>,
    /// What the workers see: true while this replica may reconcile.
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    leadership: Option<Leadership>,
    gate_task: Option<tokio::task::JoinHandle<()>>,
    election: Arc<Election>,
}

/// The client configuration from a kubeconfig file (`--kubeconfig` or KUBECONFIG); without one,
/// in a Pod the in-cluster ServiceAccount first (as kube-controller-manager), else
/// ~/.kube/config.
pub async fn kube_config(kubeconfig: Option<&PathBuf>) -> Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("use the kubeconfig")
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            let config = kube::Config::incluster().context(
                "in a Pod (KUBERNETES_SERVICE_HOST is set) but the in-cluster configuration \
                 cannot be read (/var/run/secrets/kubernetes.io/serviceaccount)",
            )?;
            tracing::info!(server = %config.cluster_url, "using the in-cluster configuration (the Pod's ServiceAccount)");
            Ok(config)
        }
        None => kube::Config::infer().await.context(
            "no kubeconfig given and none found (--kubeconfig, KUBECONFIG, ~/.kube/config, in-cluster)",
        ),
    }
}

impl Manager {
    /// Starts the manager with the host's own client configuration (`config`); plugins act under
    /// identities derived from it.
    pub async fn start(cfg: RunConfig, mut config: kube::Config) -> Result<Manager> {
        anyhow::ensure!(
            cfg.plugins_dir.is_dir(),
            "--plugins-dir {} is not a directory",
            cfg.plugins_dir.display()
        );
        // Every request (the host's own and those made as a plugin) names this replica, so an
        // audit log tells replicas apart and ties a write to the holder of a Lease.
        let replica = cfg
            .leader_election
            .as_ref()
            .map(|l| l.identity.clone())
            .or_else(|| std::env::var("POD_NAME").ok());
        if let Ok(ua) = http::HeaderValue::from_str(&user_agent(replica.as_deref())) {
            config.headers.push((http::header::USER_AGENT, ua));
        }
        let client = kube::Client::try_from(config.clone()).context("build the API client")?;
        let metrics = Metrics::new();
        let runtime = Arc::new(Runtime::new(RuntimeSettings {
            compile_cache: cfg.compile_cache.clone(),
            compile_cache_max_bytes: cfg.compile_cache_max_mb << 20,
            max_instances: cfg.max_instances,
            max_memory: cfg.limits.memory.max(256 << 20),
            memory_reset: cfg.memory_reset,
            ..RuntimeSettings::default()
        })?);
        tracing::info!("instance memory is reset by {}", runtime.memory_reset());
        let informers = Arc::new(Informers::new(client.clone(), metrics.clone()));
        let api = ApiAccess::new(
            client.clone(),
            // One token bucket for every API call of every plugin (client-go's QPS and burst).
            Arc::new(TokenBucket::new(cfg.kube_qps, cfg.kube_burst)),
            cfg.api_timeout,
        );
        let events = events::start(
            EventSettings {
                qps: cfg.event_qps,
                burst: cfg.event_burst,
                write_timeout: cfg.api_timeout,
                ..EventSettings::default()
            },
            metrics.clone(),
        );
        let crd_task = api.discovery().follow_crds();
        // Workers reconcile only while the gate is open: always without an election, while
        // leading with one, and never again once stopping.
        let per_plugin = cfg.leader_mode == LeaderMode::PerPlugin;
        let leadership = match &cfg.leader_election {
            Some(settings) if !per_plugin => {
                Some(Leadership::join(client.clone(), settings.clone(), metrics.clone()).await?)
            }
            _ => None,
        };
        // Per plugin, this gate says only "not stopping"; each plugin has its own Lease too.
        let (gate, leading) = tokio::sync::watch::channel(leadership.is_none());
        let gate = Arc::new(gate);
        let gate_task = leadership.as_ref().map(|l| {
            let (gate, mut lead) = (gate.clone(), l.subscribe());
            tokio::spawn(async move {
                loop {
                    gate.send_replace(*lead.borrow_and_update());
                    if lead.changed().await.is_err() {
                        gate.send_replace(false);
                        return;
                    }
                }
            })
        });
        let election = match (&cfg.leader_election, &leadership) {
            (Some(settings), None) => {
                let leases = PluginLeases::start(
                    client.clone(),
                    settings.clone(),
                    metrics.clone(),
                    leading.clone(),
                )?;
                Election::PerPlugin(leases)
            }
            (_, Some(l)) => Election::Shared {
                taking: leading.clone(),
                tenure: l.tenure(),
                leader: Some(l.holder()),
            },
            // Without an election the Lease is, in effect, always held.
            (None, None) => Election::Shared {
                taking: leading.clone(),
                tenure: Tenure::unbounded(),
                leader: None,
            },
        };
        let election = Arc::new(election);
        let parts = Arc::new(ControllerParts {
            election: election.clone(),
            runtime,
            informers: informers.clone(),
            api,
            metrics: metrics.clone(),
            rate_limits: cfg.rate_limits,
            sync_timeout: cfg.sync_timeout,
            // Where the host's Role on Leases is (its leader election's namespace).
            schedule_records: Some(crate::engine::schedule::ScheduleRecords::new(
                client.clone(),
                cfg.leader_election
                    .as_ref()
                    .map_or(&cfg.identity.namespace, |l| &l.namespace),
            )),
        });
        let objects = match &cfg.plugin_objects {
            Some(settings) => {
                let mut settings = settings.clone();
                settings.ceilings.budgets = cfg.budgets;
                settings.ceilings.limits = cfg.limits.clone();
                settings.ceilings.max_workers = cfg.max_workers_per_plugin;
                settings.ceilings.protected = cfg
                    .identity
                    .protected_namespaces()
                    .iter()
                    .map(str::to_string)
                    .collect();
                Some(ObjectSource::new(settings, client.clone())?)
            }
            None => None,
        };
        let plugins = PluginManager::new(
            parts,
            events,
            DirSettings {
                dir: cfg.plugins_dir.clone(),
                max_wasm_bytes: cfg.max_plugin_bytes,
                rescan: cfg.rescan,
                default_limits: cfg.limits.clone(),
                default_workers: cfg.default_workers,
                allowed_hosts: cfg.allowed_hosts.clone(),
                wait_retry: cfg.wait_retry,
                describe_timeout: cfg.describe_timeout,
                max_workers: cfg.max_workers_per_plugin,
                budgets: cfg.budgets,
                identity: cfg.identity.clone(),
                controllers: cfg.controllers.clone(),
                recorder: cfg.record.as_ref().map(|(dir, what)| {
                    Arc::new(Recorder::new(dir.clone(), *what, RECORDINGS_KEPT))
                }),
                objects: objects.clone(),
            },
            config,
        );
        // Health and metrics answer from the start, also while the first scan loads plugins.
        let (reach, reach_task) = ApiReach::start(client.clone());
        let state = HttpState {
            metrics: metrics.clone(),
            plugins: plugins.clone(),
            reach,
        };
        let (http_task, metrics_addr) = match cfg.metrics_addr {
            Some(addr) => {
                let (task, bound) = crate::serving::serve(addr, state.clone()).await?;
                (Some(task), Some(bound))
            }
            None => (None, None),
        };
        let (health_task, health_addr) = match cfg.health_addr {
            Some(addr) => {
                let (task, bound) = crate::serving::serve_health(addr, state).await?;
                (Some(task), Some(bound))
            }
            None => (None, None),
        };
        // Plugin objects are watched, fetched and reported from the start; the loader takes each
        // once fetched.
        let object_tasks = match &objects {
            Some(o) => {
                let status_replica = replica.clone().unwrap_or_else(|| "replica".to_string());
                vec![
                    tokio::spawn(o.clone().run()),
                    tokio::spawn(crate::loading::objects::status::run(
                        o.clone(),
                        plugins.clone(),
                        status_replica,
                    )),
                ]
            }
            None => Vec::new(),
        };
        // The first scan happens before start returns, so a caller sees the plugins that were there.
        plugins.first_scan().await;
        let p = plugins.clone();
        let plugin_task = tokio::spawn(async move {
            if let Err(e) = p.run().await {
                tracing::error!("plugins directory watch ended: {e:#}");
            }
        });
        Ok(Manager {
            plugins,
            metrics,
            informers,
            plugin_task,
            crd_task,
            http_task,
            health_task,
            object_tasks,
            objects: objects.clone(),
            _reach_task: reach_task,
            metrics_addr,
            health_addr,
            gate,
            leadership,
            gate_task,
            election,
        })
    }

    /// Whether this replica may reconcile now (it leads, or no election is held); per plugin,
    /// whether it leads any plugin.
    pub fn is_leading(&self) -> bool {
        self.election.leads_any()
    }

    /// Stops taking keys, lets in-flight reconciles finish (each controller waits for its calls),
    /// stops every plugin, then releases the Lease so a standby takes over at once.
    pub async fn stop(mut self) {
        // The gate task is gone before the gate closes, so nothing opens it again.
        if let Some(t) = self.gate_task.take() {
            t.abort();
            let _ = t.await;
        }
        self.gate.send_replace(false);
        self.plugin_task.abort();
        self.crd_task.abort();
        for t in &self.object_tasks {
            t.abort();
        }
        if let Some(o) = &self.objects {
            o.stop();
        }
        self.plugins.stop_all().await;
        for t in [self.http_task, self.health_task].into_iter().flatten() {
            t.abort();
        }
        if let Some(l) = self.leadership {
            l.release().await;
        }
        if let Election::PerPlugin(leases) = &*self.election {
            leases.release_all().await;
        }
    }
}

/// The User-Agent of every request: `wasm-controller-manager/VERSION`, with this replica's
/// leader-election identity (or Pod name) in parentheses, printable ASCII only and bounded.
pub fn user_agent(replica: Option<&str>) -> String {
    let base = concat!("wasm-controller-manager/", env!("CARGO_PKG_VERSION"));
    let replica: String = replica
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_graphic() && !matches!(c, '(' | ')'))
        .take(128)
        .collect();
    if replica.is_empty() {
        base.to_string()
    } else {
        format!("{base} ({replica})")
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(cfg: RunConfig) -> Result<()> {
    let config = kube_config(cfg.kubeconfig.as_ref()).await?;
    let client = kube::Client::try_from(config.clone()).context("build the API client")?;
    // An API server that does not answer yet (the cluster starting with us) is waited for.
    let mut delay = Duration::from_secs(1);
    let version = loop {
        match client.apiserver_version().await {
            Ok(v) => break v,
            Err(e) => {
                tracing::error!(server = %config.cluster_url, "cannot reach the API server, retrying in {delay:?}: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown_signal() => return Ok(()),
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    tracing::info!(server = %version.git_version, plugins_dir = %cfg.plugins_dir.display(), "connected");
    let grace = cfg.shutdown_grace;
    let named: Vec<String> = cfg.controllers.named().map(str::to_string).collect();
    let manager = Manager::start(cfg, config).await?;
    // A name in --controllers that no plugin file holds is most likely a typo: say so once.
    let present: Vec<String> = manager
        .plugins
        .status()
        .await
        .into_values()
        .filter_map(|s| s.plugin().map(str::to_string))
        .collect();
    for n in named.iter().filter(|n| !present.contains(n)) {
        tracing::warn!(plugin = %n, "--controllers names {n}, which no plugin in the directory declares (yet)");
    }
    shutdown_signal().await;
    tracing::info!(
        ?grace,
        "shutting down: no new keys; waiting for in-flight reconciles"
    );
    if tokio::time::timeout(grace, manager.stop()).await.is_err() {
        tracing::warn!(
            ?grace,
            "in-flight reconciles did not finish within the grace period"
        );
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
