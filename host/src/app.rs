//! `wasm-controller-manager run`: wires the parts together and serves metrics and health.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::controller::ControllerParts;
use crate::events::{self, EventSettings};
use crate::informer::Informers;
use crate::kubeapi::ApiAccess;
use crate::metrics::Metrics;
use crate::plugins::{DirSettings, FileStatus, PluginManager};
use crate::rate_limit::{RateLimits, TokenBucket};
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
}

/// A running manager (for tests and `run`).
pub struct Manager {
    pub plugins: Arc<PluginManager>,
    pub metrics: Arc<Metrics>,
    pub informers: Arc<Informers>,
    plugin_task: tokio::task::JoinHandle<()>,
    http_task: Option<tokio::task::JoinHandle<()>>,
    pub metrics_addr: Option<SocketAddr>,
}

/// A kube client from a kubeconfig file, or the usual inference (KUBECONFIG, in-cluster).
pub async fn kube_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("use the kubeconfig")?
        }
        None => kube::Config::infer().await.context(
            "no kubeconfig given and none found (KUBECONFIG, ~/.kube/config, in-cluster)",
        )?,
    };
    kube::Client::try_from(config).context("build the API client")
}

impl Manager {
    pub async fn start(cfg: RunConfig, client: kube::Client) -> Result<Manager> {
        anyhow::ensure!(
            cfg.plugins_dir.is_dir(),
            "--plugins-dir {} is not a directory",
            cfg.plugins_dir.display()
        );
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
            client.clone(),
            EventSettings {
                qps: cfg.event_qps,
                burst: cfg.event_burst,
                ..EventSettings::default()
            },
            metrics.clone(),
        );
        let parts = Arc::new(ControllerParts {
            runtime,
            informers: informers.clone(),
            api,
            metrics: metrics.clone(),
            rate_limits: cfg.rate_limits,
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
            },
        );
        // The first scan happens before start returns, so a caller sees the plugins that were there.
        plugins.rescan().await;
        let p = plugins.clone();
        let plugin_task = tokio::spawn(async move {
            if let Err(e) = p.run().await {
                tracing::error!("plugins directory watch ended: {e:#}");
            }
        });
        let (http_task, metrics_addr) = match cfg.metrics_addr {
            Some(addr) => {
                let (task, bound) = serve_http(addr, metrics.clone(), plugins.clone()).await?;
                (Some(task), Some(bound))
            }
            None => (None, None),
        };
        Ok(Manager {
            plugins,
            metrics,
            informers,
            plugin_task,
            http_task,
            metrics_addr,
        })
    }

    pub async fn stop(self) {
        self.plugin_task.abort();
        if let Some(t) = self.http_task {
            t.abort();
        }
        self.plugins.stop_all().await;
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    plugins: Arc<PluginManager>,
}

async fn serve_http(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    plugins: Arc<PluginManager>,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<HttpState>| async move { s.metrics.encode() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/plugins", get(plugins_status))
        .with_state(HttpState { metrics, plugins });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr} (--metrics-addr)"))?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "serving /metrics, /healthz, /readyz, /plugins");
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server ended: {e}");
        }
    });
    Ok((task, bound))
}

/// Ready once the first scan is done: every plugin that loads has synced its informers.
async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    let status = s.plugins.status().await;
    let running = status
        .values()
        .filter(|s| matches!(s, FileStatus::Running { .. }))
        .count();
    (StatusCode::OK, format!("ok: {running} plugins running\n"))
}

async fn plugins_status(State(s): State<HttpState>) -> String {
    let mut out = String::new();
    for (file, st) in s.plugins.status().await {
        let line = match st {
            FileStatus::Running {
                plugin,
                sha256,
                update_refused: None,
            } => {
                format!("{file}.wasm\trunning\t{plugin}\t{sha256}\n")
            }
            FileStatus::Running {
                plugin,
                sha256,
                update_refused: Some(e),
            } => {
                format!("{file}.wasm\trunning\t{plugin}\t{sha256}\tupdate refused: {e}\n")
            }
            FileStatus::Disabled { plugin } => format!("{file}.wasm\tdisabled\t{plugin}\n"),
            FileStatus::Refused { error } => format!("{file}.wasm\trefused\t{error}\n"),
        };
        out.push_str(&line);
    }
    out
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(cfg: RunConfig) -> Result<()> {
    let client = kube_client(cfg.kubeconfig.as_ref()).await?;
    let version = client
        .apiserver_version()
        .await
        .context("reach the API server")?;
    tracing::info!(server = %version.git_version, plugins_dir = %cfg.plugins_dir.display(), "connected");
    let manager = Manager::start(cfg, client).await?;
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
