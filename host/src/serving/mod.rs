//! What the manager serves over HTTP on `--metrics-addr`: `/metrics` (Prometheus), `/healthz`,
//! `/readyz`, `/plugins` (each file's state and why, and which replica leads it) and
//! `/debug/controllers` (JSON: whether this replica leads; each plugin's state, version, digest,
//! workers, queue depth, in-flight reconciles, leader and latest failure).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::cluster::reach::{ApiReach, Reach};
use crate::loading::plugins::{FileStatus, PluginManager};
use crate::metrics::Metrics;

/// What the HTTP routes read.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub plugins: Arc<PluginManager>,
    /// Whether the API server answers this replica (`/readyz`).
    pub reach: Arc<ApiReach>,
}

pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let app = health_routes()
        .route(
            "/metrics",
            get(|State(s): State<HttpState>| async move { s.metrics.encode() }),
        )
        .route("/plugins", get(plugins_status))
        .route(
            "/debug/controllers",
            get(|State(s): State<HttpState>| async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    s.plugins.debug().await.to_string(),
                )
            }),
        )
        .with_state(state);
    listen(
        addr,
        app,
        "--metrics-addr",
        "/metrics, /healthz, /readyz, /plugins, /debug/controllers",
    )
    .await
}

/// `--health-addr`: /healthz and /readyz alone, for the kubelet's probes.
pub async fn serve_health(
    addr: SocketAddr,
    state: HttpState,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let app = health_routes().with_state(state);
    listen(addr, app, "--health-addr", "/healthz, /readyz").await
}

/// The probes' routes, served on both addresses.
fn health_routes() -> Router<HttpState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// Binds `addr` (named by `flag` in errors) and serves `app` on it until the task is aborted.
async fn listen(
    addr: SocketAddr,
    app: Router,
    flag: &str,
    what: &str,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr} ({flag})"))?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "serving {what}");
    let flag = flag.to_string();
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the server of {flag} ended: {e}");
        }
    });
    Ok((task, bound))
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready once the first scan is done (every plugin that loads has synced its informers) and
/// while the API server answers this replica.
async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    if let Reach::Silent(silent, error) = s.reach.now() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the API server has not answered for {}s{}\n",
                silent.as_secs(),
                error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
        );
    }
    if !s.plugins.scanned() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: loading the plugins directory\n".into(),
        );
    }
    // Every file has settled: running, disabled, waiting for a named reason (retried on its own),
    // or refused until it changes. None of these is a reason to take the host out of service; the
    // body says which is which.
    let status = s.plugins.status().await;
    let running = status
        .values()
        .filter(|s| matches!(s, FileStatus::Running { .. }))
        .count();
    let mut body = format!("ok: {running} of {} plugin files running\n", status.len());
    for (file, st) in &status {
        let state = match st {
            FileStatus::Running { .. } => "running".to_string(),
            FileStatus::Disabled { .. } => "disabled".to_string(),
            FileStatus::Waiting { reason, .. } => format!("waiting ({})", reason.as_str()),
            FileStatus::Refused { .. } => "refused (until the file changes)".to_string(),
            FileStatus::Loading => "loading".to_string(),
        };
        body.push_str(&format!(
            "{}: {state}\n",
            crate::loading::plugins::shown(file)
        ));
    }
    (StatusCode::OK, body)
}

/// One line per file: name, state, plugin, digest or reason; for a running plugin under an
/// election, `leader=IDENTITY` (the replica that reconciles it) and `leading` when that is this one.
async fn plugins_status(State(s): State<HttpState>) -> String {
    let mut out = String::new();
    let leaders = s.plugins.leaders().await;
    for (key, st) in s.plugins.status().await {
        let file = crate::loading::plugins::shown(&key);
        let lead = match leaders.get(&key) {
            Some((leading, Some(leader))) => {
                let here = if *leading { "\tleading" } else { "" };
                // The identity comes from a Lease any peer may write: escaped like guest text.
                format!(
                    "\tleader={}{here}",
                    crate::contract::validate::log_text(leader, 256)
                )
            }
            Some((_, None)) if s.plugins.elects() => "\tleader=(none)".to_string(),
            _ => String::new(),
        };
        let line = match st {
            FileStatus::Running {
                plugin,
                sha256,
                update_refused: None,
            } => {
                format!("{file}\trunning\t{plugin}\t{sha256}{lead}\n")
            }
            FileStatus::Running {
                plugin,
                sha256,
                update_refused: Some(e),
            } => {
                format!("{file}\trunning\t{plugin}\t{sha256}{lead}\tupdate refused: {e}\n")
            }
            FileStatus::Disabled { plugin } => format!("{file}\tdisabled\t{plugin}\n"),
            FileStatus::Waiting {
                plugin,
                reason,
                message,
            } => format!(
                "{file}\twaiting\t{plugin}\t{}: {}\n",
                reason.as_str(),
                // API-server and client texts: one line, whatever they hold.
                crate::contract::validate::log_text(&message, 4096)
            ),
            FileStatus::Refused { error } => format!("{file}\trefused\t{error}\n"),
            FileStatus::Loading => format!("{file}\tloading\n"),
        };
        out.push_str(&line);
    }
    out
}
