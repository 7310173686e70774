//! `wasm-controller-manager run`: wires the parts together and serves metrics and health.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cluster::api::ApiAccess;
use crate::cluster::events::{self, EventSettings};
use crate::cluster::identity::IdentitySettings;
use crate::cluster::services::BudgetSettings;
use crate::engine::controller::ControllerParts;
use crate::engine::informer::Informers;
use crate::engine::rate_limit::{RateLimits, TokenBucket};
use crate::loading::plugins::{DirSettings, PluginManager};
use crate::metrics::Metrics;
use crate::sandbox::{Limits, Runtime, RuntimeSettings};

/// Everything `run` needs, as parsed from the command line.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub kubeconfig: Option<PathBuf>,
    pub plugins_dir: PathBuf,
    pub compile_cache: Option<PathBuf>,
    pub metrics_addr: Option<SocketAddr>,
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
    /// How long a plugin's caches may take to sync before it waits and is tried again.
    pub sync_timeout: Duration,
}

/// A running manager (for tests and `run`).
pub struct Manager {
    pub plugins: Arc<PluginManager>,
    pub metrics: Arc<Metrics>,
    pub informers: Arc<Informers>,
    plugin_task: tokio::task::JoinHandle<()>,
    crd_task: tokio::task::JoinHandle<()>,
    http_task: Option<tokio::task::JoinHandle<()>>,
    pub metrics_addr: Option<SocketAddr>,
}

/// The client configuration from a kubeconfig file, or the usual inference (KUBECONFIG,
/// in-cluster).
pub async fn kube_config(kubeconfig: Option<&PathBuf>) -> Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("use the kubeconfig")
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig given and none found (KUBECONFIG, ~/.kube/config, in-cluster)"),
    }
}

impl Manager {
    /// Starts the manager with the host's own client configuration (`config`); plugins act under
    /// identities derived from it.
    pub async fn start(cfg: RunConfig, config: kube::Config) -> Result<Manager> {
        anyhow::ensure!(
            cfg.plugins_dir.is_dir(),
            "--plugins-dir {} is not a directory",
            cfg.plugins_dir.display()
        );
        let client = kube::Client::try_from(config.clone()).context("build the API client")?;
        let metrics = Metrics::new();
        let runtime = Arc::new(Runtime::new(RuntimeSettings {
            compile_cache: cfg.compile_cache.clone(),
            max_instances: cfg.max_instances,
            max_memory: cfg.limits.memory.max(256 << 20),
            ..RuntimeSettings::default()
        })?);
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
                ..EventSettings::default()
            },
            metrics.clone(),
        );
        let crd_task = api.discovery().follow_crds();
        let parts = Arc::new(ControllerParts {
            runtime,
            informers: informers.clone(),
            api,
            metrics: metrics.clone(),
            rate_limits: cfg.rate_limits,
            sync_timeout: cfg.sync_timeout,
        });
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
                max_workers: cfg.max_workers_per_plugin,
                budgets: cfg.budgets,
                identity: cfg.identity.clone(),
            },
            config,
        );
        // Health and metrics answer from the start, also while the first scan loads plugins.
        let (http_task, metrics_addr) = match cfg.metrics_addr {
            Some(addr) => {
                let (task, bound) =
                    crate::serving::serve(addr, metrics.clone(), plugins.clone()).await?;
                (Some(task), Some(bound))
            }
            None => (None, None),
        };
        // The first scan happens before start returns, so a caller sees the plugins that were there.
        plugins.rescan().await;
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
            metrics_addr,
        })
    }

    pub async fn stop(self) {
        self.plugin_task.abort();
        self.crd_task.abort();
        if let Some(t) = self.http_task {
            t.abort();
        }
        self.plugins.stop_all().await;
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(cfg: RunConfig) -> Result<()> {
    let config = kube_config(cfg.kubeconfig.as_ref()).await?;
    let client = kube::Client::try_from(config.clone()).context("build the API client")?;
    let version = client
        .apiserver_version()
        .await
        .context("reach the API server")?;
    tracing::info!(server = %version.git_version, plugins_dir = %cfg.plugins_dir.display(), "connected");
    let manager = Manager::start(cfg, config).await?;
    shutdown_signal().await;
    tracing::info!("shutting down: waiting for in-flight reconciles");
    manager.stop().await;
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
