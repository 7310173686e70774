//! Per-plugin budgets against plugins that try to take the host, on the real test cluster
//! (testenv), in one run of one manager:
//! 1. Baseline: `well-behaved` alone. 100 ConfigMaps created at 10/s; each one's time from create
//!    to the plugin's annotation (seen through a watch), and `/healthz` sampled every 10 ms over
//!    the same window; p50/p99 of both.
//! 2. The same with four `infinite-loop` plugins beside it, each spinning to its 1 s CPU deadline
//!    on every call. Target: /healthz p99 < 100 ms, well-behaved within 2× of the baseline.
//! 3. Floods, one at a time for ~20 s, with well-behaved measured alongside as above: `flood` in
//!    modes `events`, `logs`, `http` and `api` (see plugins/test-plugins/examples/flood.rs), the
//!    events flood a second time (retained memory must be reused, not added to), then
//!    `many-workers`. For each: this process's RSS before, 5 s in, at the end and after the plugin
//!    is removed, the size of /metrics, and the counters that show the bound held.
//!
//! Before the baseline, 30 objects go through unmeasured (new connections, a cold API server).
//!
//! The manager runs on a 2-thread runtime, as `run` does on this 2-core machine. The load
//! generator and the watch that times annotations run on a runtime of their own, and the /healthz
//! prober on a plain thread, so a starved manager cannot hide its latency by starving the probes.
//! Log lines go through a text formatter into a counting sink, so the host pays for formatting
//! them as it would in production.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench isolation`
//! (about 2.5 minutes after the build; prints markdown tables; docs/benchmarks.md keeps the
//! numbers).

mod common;

use common::{
    COMPILE_CACHE, artifact, cpu_seconds, diff_histogram, granted, histogram_quantile, metric,
    rss_mib,
};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use wasm_controller_manager::app::{Manager, RunConfig};
use wasm_controller_manager::cluster::identity::IdentitySettings;
use wasm_controller_manager::cluster::services::BudgetSettings;
use wasm_controller_manager::engine::rate_limit::RateLimits;
use wasm_controller_manager::loading::plugins::FileStatus;
use wasm_controller_manager::sandbox::Limits;

type Res<T> = Result<T, String>;

const ANNOTATION: &str = "wcm.test/reconciled";
/// Fixed in flood.rs and many_workers.rs.
const FLOOD_NAMESPACE: &str = "wcm-flood";
const LATENCY_OBJECTS: usize = 100;
const LATENCY_RATE: f64 = 10.0;
const FLOOD_SECONDS: u64 = 20;
const HTTP_DENIALS_WANTED: f64 = 100_000.0;

// ---------------------------------------------------------------------------------------------
// Log lines, counted

/// The host's log lines: how many name each plugin (their `plugin` field), and all lines with
/// their bytes as the text formatter wrote them.
#[derive(Default)]
struct LogCounts {
    by_plugin: Mutex<HashMap<String, u64>>,
    lines: AtomicU64,
    bytes: AtomicU64,
    longest: AtomicU64,
}

static LOGS: LazyLock<LogCounts> = LazyLock::new(LogCounts::default);

impl LogCounts {
    fn of(&self, plugin: &str) -> u64 {
        let m = self.by_plugin.lock().unwrap_or_else(|p| p.into_inner());
        m.get(plugin).copied().unwrap_or(0)
    }
}

struct CountByPlugin;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountByPlugin {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut field = PluginField(None);
        event.record(&mut field);
        if let Some(p) = field.0 {
            let mut m = LOGS.by_plugin.lock().unwrap_or_else(|p| p.into_inner());
            *m.entry(p).or_default() += 1;
        }
    }
}

struct PluginField(Option<String>);

impl tracing::field::Visit for PluginField {
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        if f.name() == "plugin" {
            self.0 = Some(v.to_string());
        }
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        // `plugin = %name` arrives here; its Debug is the name's Display.
        if f.name() == "plugin" {
            self.0 = Some(format!("{v:?}"));
        }
    }
}

/// Where formatted lines go: counted, then dropped (the formatter writes one line per call).
struct Sink;

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOGS.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
        let lines = b.iter().filter(|&&c| c == b'\n').count() as u64;
        LOGS.lines.fetch_add(lines, Ordering::Relaxed);
        LOGS.longest.fetch_max(b.len() as u64, Ordering::Relaxed);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Process and manager helpers (as in engine.rs)

/// Asks glibc to return free heap pages to the system: what RSS keeps after it is live or leaked,
/// not free memory the allocator holds on to.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The command line's defaults (budgets included: they are what is measured), with /metrics and
/// /healthz on a free port and a quick rescan of the directory.
fn config(dir: &Path) -> RunConfig {
    RunConfig {
        plugin_objects: None,
        kubeconfig: None,
        plugins_dir: dir.to_path_buf(),
        compile_cache: Some(std::env::temp_dir().join(COMPILE_CACHE)),
        // Shared by every test (many variants of the same plugins): never trimmed here.
        compile_cache_max_mb: 1 << 20,
        metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        kube_qps: 50.0,
        kube_burst: 100,
        api_timeout: Duration::from_secs(30),
        default_workers: 1,
        limits: Limits::default(),
        max_instances: 128,
        max_plugin_bytes: 64 << 20,
        rescan: Duration::from_secs(2),
        allowed_hosts: vec![],
        event_qps: 20.0,
        event_burst: 50,
        identity: IdentitySettings::default(),
        budgets: BudgetSettings::default(),
        max_workers_per_plugin: 16,
        wait_retry: Duration::from_secs(1),
        describe_timeout: Duration::from_secs(10),
        sync_timeout: Duration::from_secs(30),
        leader_election: None,
        leader_mode: Default::default(),
        health_addr: None,
        controllers: Default::default(),
        shutdown_grace: Duration::from_secs(10),
        rate_limits: RateLimits::default(),
        memory_reset: Default::default(),
        record: None,
    }
}

/// Every series of `name` whose labels include `plugin="…"`: (the other labels, value).
fn series(exposition: &str, name: &str, plugin: &str) -> Vec<(String, f64)> {
    let want = format!("plugin=\"{plugin}\"");
    exposition
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            if !labels.split(',').any(|kv| kv == want) {
                return None;
            }
            let others: Vec<&str> = labels.split(',').filter(|kv| *kv != want).collect();
            Some((others.join(","), value.parse().ok()?))
        })
        .collect()
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Res<Duration> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(start.elapsed())
}

async fn file_status(m: &Manager, stem: &str) -> Option<FileStatus> {
    m.plugins.status().await.remove(stem)
}

/// Copies `stem`.wasm (and its settings) from `staging` into the manager's directory — the
/// settings first, the .wasm by rename, so the manager never reads half a file — and waits until
/// it runs.
async fn install(m: &Manager, dir: &Path, staging: &Path, stem: &str) -> Res<()> {
    let toml = staging.join(format!("{stem}.toml"));
    if toml.is_file() {
        std::fs::copy(&toml, dir.join(format!("{stem}.toml"))).map_err(|e| e.to_string())?;
    }
    let tmp = dir.join(format!(".{stem}.wasm.tmp"));
    std::fs::copy(staging.join(format!("{stem}.wasm")), &tmp).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, dir.join(format!("{stem}.wasm"))).map_err(|e| e.to_string())?;
    m.plugins.rescan().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match file_status(m, stem).await {
            Some(FileStatus::Running { .. }) => return Ok(()),
            st if Instant::now() > deadline => {
                return Err(format!("{stem} not running within 60 s: {st:?}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Removes `stem` from the manager's directory and waits until it has stopped.
async fn remove(m: &Manager, dir: &Path, stem: &str) -> Res<()> {
    let _ = std::fs::remove_file(dir.join(format!("{stem}.wasm")));
    let _ = std::fs::remove_file(dir.join(format!("{stem}.toml")));
    m.plugins.rescan().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while file_status(m, stem).await.is_some() {
        if Instant::now() > deadline {
            return Err(format!(
                "{stem} still loaded 60 s after its file was removed"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Res<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("create namespace {name}: {e}")),
    }
}

/// Creates a ConfigMap, retrying a few times (an already existing one counts as created).
async fn create_cm(api: &Api<ConfigMap>, name: &str) -> Res<()> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut last = String::new();
    for _ in 0..4 {
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("create ConfigMap {name}: {last}"))
}

// ---------------------------------------------------------------------------------------------
// Measurements

/// Nearest-rank quantile of samples in milliseconds.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn sorted_ms(d: &[Duration]) -> Vec<f64> {
    let mut v: Vec<f64> = d.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// One GET /healthz on a new connection (as a kubelet probe makes it); its time, and whether it
/// answered 200 within the 5 s a probe waits.
fn healthz(addr: SocketAddr) -> (Duration, bool) {
    let start = Instant::now();
    let ok = (|| -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        Ok(buf.starts_with(b"HTTP/1.1 200"))
    })()
    .unwrap_or(false);
    (start.elapsed(), ok)
}

/// Probes /healthz every 10 ms on its own thread until stopped.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Duration, bool)>>,
}

impl Prober {
    fn start(addr: SocketAddr) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                out.push(healthz(addr));
                next += Duration::from_millis(10);
                let now = Instant::now();
                // A slow answer delays the next probe rather than bunching the missed ones.
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            out
        });
        Prober { stop, thread }
    }

    fn stop(self) -> Vec<(Duration, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Creates `n` ConfigMaps in `ns` at `per_second`; each one's time from just before its create
/// request to the watch event that carries well-behaved's annotation. Runs on the observer runtime.
async fn annotation_latencies(
    client: kube::Client,
    ns: String,
    n: usize,
    per_second: f64,
    timeout: Duration,
) -> Res<(Vec<Duration>, Vec<String>)> {
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn({
        let (api, seen, watched) = (api.clone(), seen.clone(), ns.clone());
        async move {
            let mut ready = Some(ready_tx);
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(e) = events.next().await {
                let now = Instant::now();
                match e {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                        let annotated = cm
                            .metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(ANNOTATION));
                        if let (true, Some(name)) = (annotated, cm.metadata.name) {
                            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                            s.entry(name).or_insert(now);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("latency watch in {watched}: {e}"),
                }
            }
        }
    });
    let ready = tokio::time::timeout(Duration::from_secs(30), ready_rx).await;
    if !matches!(ready, Ok(Ok(()))) {
        watch.abort();
        return Err(format!("the watch of {ns} did not sync within 30 s"));
    }
    let mut started = HashMap::new();
    let mut creates = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    for i in 0..n {
        tick.tick().await;
        let name = format!("lat-{i}");
        started.insert(name.clone(), Instant::now());
        let api = api.clone();
        creates.push(tokio::spawn(async move { create_cm(&api, &name).await }));
    }
    let mut problems = Vec::new();
    for c in creates {
        match c.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => problems.push(e),
            Err(e) => problems.push(format!("create task: {e}")),
        }
    }
    let expected = n - problems.len();
    let count = || seen.lock().unwrap_or_else(|p| p.into_inner()).len();
    let deadline = Instant::now() + timeout;
    while count() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let latencies: Vec<Duration> = started
        .iter()
        .filter_map(|(name, t0)| Some(seen.get(name)?.saturating_duration_since(*t0)))
        .collect();
    if latencies.len() < expected {
        problems.push(format!(
            "{} of {n} ConfigMaps not annotated within {timeout:?} of the last create",
            n - latencies.len()
        ));
    }
    Ok((latencies, problems))
}

/// What one window measured.
struct Window {
    /// Create → annotation, ms, sorted.
    latency: Vec<f64>,
    healthz: Vec<f64>,
    healthz_failed: usize,
    /// Well-behaved inside the manager (its histograms, this window only), ms: p50 and p99 of the
    /// wait in its work queue, and of the reconcile call (its patch to the API server included).
    queue_wait: [f64; 2],
    reconcile: [f64; 2],
    /// Well-behaved's reconciles that failed in the window (each retried with backoff).
    errors: f64,
    problems: Vec<String>,
    wall: Duration,
    cpu: f64,
}

struct Bench {
    env: &'static testenv::TestEnv,
    manager: Manager,
    addr: SocketAddr,
    dir: PathBuf,
    staging: PathBuf,
    observer: tokio::runtime::Handle,
    observer_client: kube::Client,
}

impl Bench {
    /// 30 objects through well-behaved and the watch, not measured.
    async fn warm_up(&self) -> Res<()> {
        let ns = self
            .env
            .namespace("iso-warm-up")
            .await
            .map_err(|e| format!("namespace: {e:#}"))?
            .name;
        let (_, problems) = self
            .observer
            .spawn(annotation_latencies(
                self.observer_client.clone(),
                ns,
                30,
                LATENCY_RATE,
                Duration::from_secs(60),
            ))
            .await
            .map_err(|e| format!("observer task: {e}"))??;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Well-behaved's create→annotation latency and /healthz over one window (~11 s).
    async fn window(&self, label: &str) -> Res<Window> {
        let ns = self
            .env
            .namespace(&format!("iso-{label}"))
            .await
            .map_err(|e| format!("namespace: {e:#}"))?
            .name;
        let cpu = cpu_seconds();
        let start = Instant::now();
        let before = self.manager.metrics.encode();
        let prober = Prober::start(self.addr);
        let measured = self
            .observer
            .spawn(annotation_latencies(
                self.observer_client.clone(),
                ns,
                LATENCY_OBJECTS,
                LATENCY_RATE,
                Duration::from_secs(60),
            ))
            .await;
        let probes = prober.stop();
        let (latencies, problems) = measured.map_err(|e| format!("observer task: {e}"))??;
        let failed = probes.iter().filter(|(_, ok)| !ok).count();
        let probe_times: Vec<Duration> = probes.iter().map(|(d, _)| *d).collect();
        let after = self.manager.metrics.encode();
        let hist = |name: &str, label: &str| {
            let h = diff_histogram(&before, &after, name);
            [0.5, 0.99].map(|q| histogram_quantile(&h, name, label, q) * 1e3)
        };
        let errors = |text: &str| {
            testenv::sum_metric(
                text,
                "controller_runtime_reconcile_total",
                &[("controller", "well-behaved"), ("result", "error")],
            )
        };
        Ok(Window {
            latency: sorted_ms(&latencies),
            healthz: sorted_ms(&probe_times),
            healthz_failed: failed,
            queue_wait: hist("workqueue_queue_duration_seconds", "name=\"well-behaved\""),
            reconcile: hist(
                "controller_runtime_reconcile_time_seconds",
                "controller=\"well-behaved\"",
            ),
            errors: errors(&after) - errors(&before),
            problems,
            wall: start.elapsed(),
            cpu: cpu_seconds() - cpu,
        })
    }
}

const WINDOW_HEADER: &str = "| window (well-behaved measured alongside) | create→annotation p50 / p99 / max | in the manager: queue wait p50 / p99 | reconcile p50 / p99 | its failed reconciles | /healthz p50 / p99 / max | probes failed | CPU of the process (cores) |\n|---|---|---|---|---|---|---|---|";

fn window_row(label: &str, w: &Res<Window>) -> String {
    match w {
        Ok(w) => format!(
            "| {label} | {:.0} / {:.0} / {:.0} ms | {:.2} / {:.1} ms | {:.1} / {:.1} ms | {} | {:.1} / {:.1} / {:.0} ms | {} of {} | {:.2} |",
            quantile(&w.latency, 0.5),
            quantile(&w.latency, 0.99),
            w.latency.last().copied().unwrap_or(f64::NAN),
            w.queue_wait[0],
            w.queue_wait[1],
            w.reconcile[0],
            w.reconcile[1],
            w.errors,
            quantile(&w.healthz, 0.5),
            quantile(&w.healthz, 0.99),
            w.healthz.last().copied().unwrap_or(f64::NAN),
            w.healthz_failed,
            w.healthz.len(),
            w.cpu / w.wall.as_secs_f64(),
        ),
        Err(e) => format!("| {label} | not measured: {e} | | | | | | |"),
    }
}

// ---------------------------------------------------------------------------------------------
// Floods

struct FloodRun {
    stem: String,
    /// The stem, or what tells a second run of it apart.
    label: String,
    ran: Duration,
    /// Before, 5 s into the flood, at its end, after its removal, and after that once the
    /// allocator has been asked to give free memory back (retained is not leaked).
    rss: [f64; 5],
    metrics_bytes: [usize; 2],
    window: Res<Window>,
    exposition: String,
    log_lines: [u64; 2],
    all_log_lines: u64,
    all_log_bytes: u64,
    audit: Option<Vec<testenv::AuditEvent>>,
    problems: Vec<String>,
}

async fn run_flood(b: &Bench, stem: &str, label: &str) -> FloodRun {
    let m = &b.manager;
    let mut problems = Vec::new();
    let rss_before = rss_mib();
    let metrics_before = m.metrics.encode().len();
    let log_before = LOGS.of(stem);
    let (lines0, bytes0) = (
        LOGS.lines.load(Ordering::Relaxed),
        LOGS.bytes.load(Ordering::Relaxed),
    );
    let mark = b.env.audit_mark().ok();
    let started = Instant::now();
    if let Err(e) = install(m, &b.dir, &b.staging, stem).await {
        problems.push(e);
    }
    let reconciles = |m: &Manager| {
        metric(
            m,
            "controller_runtime_reconcile_total",
            &[("controller", stem)],
        )
    };
    if let Err(e) = wait_until(
        &format!("the first reconcile of {stem}"),
        Duration::from_secs(60),
        || reconciles(m) >= 1.0,
    )
    .await
    {
        problems.push(e);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_early = rss_mib();
    let window = b.window(stem).await;
    // The rest of the ~20 s; the http flood goes on until 100,000 denials (60 s at most).
    let denials = |m: &Manager| {
        metric(
            m,
            "wcm_forbidden_host_calls_total",
            &[("plugin", stem), ("resource", "outbound-http")],
        )
    };
    loop {
        let t = started.elapsed();
        let enough = stem != "flood-http" || denials(m) >= HTTP_DENIALS_WANTED;
        if (t >= Duration::from_secs(FLOOD_SECONDS) && enough) || t >= Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ran = started.elapsed();
    let exposition = m.metrics.encode();
    let rss_end = rss_mib();
    let log_after = LOGS.of(stem);
    let (lines1, bytes1) = (
        LOGS.lines.load(Ordering::Relaxed),
        LOGS.bytes.load(Ordering::Relaxed),
    );
    let audit = mark.and_then(|mk| b.env.audit_events_since(mk).ok());
    if let Err(e) = remove(m, &b.dir, stem).await {
        problems.push(e);
    }
    // Time for freed memory to be given back before it is read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = rss_mib();
    trim_heap();
    let rss_trimmed = rss_mib();
    FloodRun {
        stem: stem.to_string(),
        label: label.to_string(),
        ran,
        rss: [rss_before, rss_early, rss_end, rss_after, rss_trimmed],
        metrics_bytes: [metrics_before, exposition.len()],
        window,
        exposition,
        log_lines: [log_before, log_after],
        all_log_lines: lines1 - lines0,
        all_log_bytes: bytes1 - bytes0,
        audit,
        problems,
    }
}

fn value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    testenv::sum_metric(exposition, name, labels)
}

/// The lines that say what bounded each flood.
async fn flood_details(b: &Bench, r: &FloodRun) -> Vec<String> {
    let e = &r.exposition;
    let p = r.stem.as_str();
    let reconciles = value(
        e,
        "controller_runtime_reconcile_total",
        &[("controller", p)],
    );
    let failures: Vec<String> = series(e, "wcm_plugin_call_failures_total", p)
        .into_iter()
        .map(|(l, v)| format!("{l}: {v}"))
        .collect();
    let mut out = vec![format!(
        "| {p} | reconciles in {:.0} s | {reconciles} (failed calls: {}) |",
        r.ran.as_secs_f64(),
        if failures.is_empty() {
            "none".to_string()
        } else {
            failures.join(", ")
        }
    )];
    match p {
        "flood-events" => {
            let refused = value(
                e,
                "wcm_invalid_host_calls_total",
                &[("plugin", p), ("call", "event")],
            );
            // Three in ten of the plugin's events are bad ones: the refusals count them all.
            out.push(format!(
                "| {p} | events recorded by the plugin, 1 MiB notes (refused × 10/3) | ≈{:.0} |",
                refused * 10.0 / 3.0
            ));
            out.push(format!(
                "| {p} | refused by the host (`wcm_invalid_host_calls_total{{call=\"event\"}}`) | {refused} |"
            ));
            for (labels, v) in series(e, "wcm_events_dropped_total", p) {
                out.push(format!(
                    "| {p} | `wcm_events_dropped_total{{{labels}}}` | {v} |"
                ));
            }
            for (labels, v) in series(e, "wcm_events_written_total", p) {
                out.push(format!(
                    "| {p} | `wcm_events_written_total{{{labels}}}` | {v} |"
                ));
            }
            // The notes that reached the API server.
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(b.observer_client.clone(), FLOOD_NAMESPACE);
            let listed = b
                .observer
                .spawn(async move { events.list(&ListParams::default()).await })
                .await;
            match listed {
                Ok(Ok(list)) => {
                    let longest = list
                        .items
                        .iter()
                        .filter_map(|e| e.note.as_ref().map(String::len))
                        .max()
                        .unwrap_or(0);
                    out.push(format!(
                        "| {p} | events in {FLOOD_NAMESPACE} on the API server; longest note | {}; {longest} bytes |",
                        list.items.len()
                    ));
                }
                Ok(Err(err)) => out.push(format!("| {p} | events listed | failed: {err} |")),
                Err(err) => out.push(format!("| {p} | events listed | failed: {err} |")),
            }
        }
        "flood-logs" => {
            out.push(format!(
                "| {p} | log calls by the plugin (64 KiB, newlines) | ≈{:.0} |",
                reconciles * 4000.0
            ));
            out.push(format!(
                "| {p} | host log lines naming the plugin | {} |",
                r.log_lines[1] - r.log_lines[0]
            ));
            out.push(format!(
                "| {p} | all host log lines / bytes in the phase; longest line so far | {} / {} KiB; {} bytes |",
                r.all_log_lines,
                r.all_log_bytes / 1024,
                LOGS.longest.load(Ordering::Relaxed)
            ));
        }
        "flood-http" => {
            let s = series(e, "wcm_forbidden_host_calls_total", p);
            let shown: Vec<String> = s.iter().map(|(l, v)| format!("{{{l}}} {v}")).collect();
            out.push(format!(
                "| {p} | `wcm_forbidden_host_calls_total` series of the plugin | {}: {} |",
                s.len(),
                shown.join("; ")
            ));
            out.push(format!(
                "| {p} | host log lines naming the plugin | {} |",
                r.log_lines[1] - r.log_lines[0]
            ));
        }
        "flood-api" => {
            let user = format!("system:serviceaccount:wcm-system:wcm-plugin-{p}");
            match &r.audit {
                Some(events) => {
                    let lists: Vec<&testenv::AuditEvent> = events
                        .iter()
                        .filter(|a| {
                            a.effective_user() == user
                                && a.verb == "list"
                                && a.stage == "ResponseComplete"
                        })
                        .collect();
                    out.push(format!(
                        "| {p} | LISTs the API server saw from the plugin (audit log); per second | {}; {:.1} (budget 20/s, burst 40) |",
                        lists.len(),
                        lists.len() as f64 / r.ran.as_secs_f64()
                    ));
                    let wb = "system:serviceaccount:wcm-system:wcm-plugin-well-behaved";
                    let complete = |a: &&testenv::AuditEvent| a.stage == "ResponseComplete";
                    let throttled = events
                        .iter()
                        .filter(complete)
                        .filter(|a| a.code() == Some(429))
                        .count();
                    let wb_failed: Vec<String> = events
                        .iter()
                        .filter(complete)
                        .filter(|a| a.effective_user() == wb && a.code().is_some_and(|c| c >= 300))
                        .map(|a| format!("{} {}", a.verb, a.code().unwrap_or(0)))
                        .collect();
                    out.push(format!(
                        "| {p} | 429 answers from the API server (anyone); well-behaved's failed requests | {throttled}; {} |",
                        if wb_failed.is_empty() {
                            "none".to_string()
                        } else {
                            wb_failed.join(", ")
                        }
                    ));
                }
                None => out.push(format!(
                    "| {p} | LISTs seen by the API server | no audit log |"
                )),
            }
        }
        _ => {}
    }
    out
}

// ---------------------------------------------------------------------------------------------

fn main() {
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(CountByPlugin)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(|| Sink),
        )
        .init();
    // The load generator's own runtime: one thread, apart from the manager's two.
    let observer = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-observer")
        .enable_all()
        .build()
        .expect("observer runtime");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(observer.handle().clone()));
    drop(rt);
    drop(observer);
}

async fn run(observer: tokio::runtime::Handle) {
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    let client = env.client().await.expect("client");
    let observer_client = observer
        .spawn(async move { env.client().await })
        .await
        .expect("observer task")
        .expect("observer client");
    println!(
        "machine: {} cores; {LATENCY_OBJECTS} ConfigMaps per window at {LATENCY_RATE}/s; floods of ~{FLOOD_SECONDS} s",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    // Every plugin of the run, granted once; the manager's directory starts with well-behaved.
    let pid = std::process::id();
    let staging = std::env::temp_dir().join(format!("wcm-bench-isolation-staging-{pid}"));
    let dir = std::env::temp_dir().join(format!("wcm-bench-isolation-{pid}"));
    std::fs::create_dir_all(&staging).expect("dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let copy = |from: &str, stem: &str| {
        std::fs::copy(artifact(from), staging.join(format!("{stem}.wasm"))).expect("copy plugin");
    };
    let settings = |stem: &str, text: String| {
        std::fs::write(staging.join(format!("{stem}.toml")), text).expect("write settings");
    };
    copy("well_behaved", "well-behaved");
    for i in 1..=4 {
        let stem = format!("spin-{i}");
        copy("infinite_loop", &stem);
        settings(
            &stem,
            format!("name = \"{stem}\"\ncpu_deadline_ms = 1000\n"),
        );
    }
    for mode in ["events", "logs", "http", "api"] {
        let stem = format!("flood-{mode}");
        copy("flood", &stem);
        settings(
            &stem,
            format!("name = \"{stem}\"\n[config]\nmode = \"{mode}\"\n"),
        );
    }
    copy("many_workers", "many-workers");
    ensure_namespace(&client, FLOOD_NAMESPACE)
        .await
        .expect("flood namespace");
    let flood_cms: Api<ConfigMap> = Api::namespaced(client.clone(), FLOOD_NAMESPACE);
    for i in 0..4 {
        create_cm(&flood_cms, &format!("flood-{i}"))
            .await
            .expect("flood ConfigMap");
    }
    let kube_config = granted(env, &staging).await;
    std::fs::copy(
        staging.join("well-behaved.wasm"),
        dir.join("well-behaved.wasm"),
    )
    .expect("copy well-behaved");
    let manager = Manager::start(config(&dir), kube_config)
        .await
        .expect("manager");
    let addr = manager.metrics_addr.expect("metrics address");
    let b = Bench {
        env,
        manager,
        addr,
        dir,
        staging,
        observer,
        observer_client,
    };
    // Well-behaved annotates what is already there first (the flood's ConfigMaps), outside timing.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Unmeasured: the first objects pay for new connections (and a cold API server).
    if let Err(e) = b.warm_up().await {
        println!("warm-up: {e}");
    }

    // 1. Baseline.
    let rss0 = rss_mib();
    let base = b.window("base").await;

    // 2. Four plugins spinning to their CPU deadline on every call, on ConfigMaps of their own
    // (they watch every ConfigMap, the measured ones included).
    let spin_ns = env.namespace("iso-spin").await.expect("namespace").name;
    let spin_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &spin_ns);
    for i in 0..20 {
        if let Err(e) = create_cm(&spin_cms, &format!("spin-{i}")).await {
            eprintln!("{e}");
        }
    }
    let mut spin_problems = Vec::new();
    for i in 1..=4 {
        if let Err(e) = install(&b.manager, &b.dir, &b.staging, &format!("spin-{i}")).await {
            spin_problems.push(e);
        }
    }
    let deadline_failures = |m: &Manager| {
        (1..=4)
            .map(|i| {
                metric(
                    m,
                    "wcm_plugin_call_failures_total",
                    &[("plugin", &format!("spin-{i}")), ("reason", "deadline")],
                )
            })
            .collect::<Vec<f64>>()
    };
    if let Err(e) = wait_until(
        "a CPU-deadline failure of each infinite-loop plugin",
        Duration::from_secs(60),
        || deadline_failures(&b.manager).iter().all(|&n| n >= 1.0),
    )
    .await
    {
        spin_problems.push(e);
    }
    let spun0: f64 = deadline_failures(&b.manager).iter().sum();
    let spin = b.window("spin").await;
    let spun = deadline_failures(&b.manager).iter().sum::<f64>() - spun0;
    for i in 1..=4 {
        if let Err(e) = remove(&b.manager, &b.dir, &format!("spin-{i}")).await {
            spin_problems.push(e);
        }
    }

    // 3. Floods, one at a time.
    let mut floods = Vec::new();
    for mode in ["events", "logs", "http", "api"] {
        let stem = format!("flood-{mode}");
        floods.push(run_flood(&b, &stem, &stem).await);
    }
    // The biggest grower again: memory the first run kept must be reused, not added to.
    floods.push(run_flood(&b, "flood-events", "flood-events, second run").await);

    // many-workers: what its million workers became.
    let rss_mw = rss_mib();
    let tasks_mw = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mw_installed = install(&b.manager, &b.dir, &b.staging, "many-workers").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mw_gauge = metric(
        &b.manager,
        "controller_runtime_max_concurrent_reconciles",
        &[("controller", "many-workers")],
    );
    let mw_tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mw_rss = rss_mib();
    let mw_removed = remove(&b.manager, &b.dir, "many-workers").await;

    // Report.
    println!();
    println!("{WINDOW_HEADER}");
    println!("{}", window_row("well-behaved alone (baseline)", &base));
    println!(
        "{}",
        window_row("+ 4 infinite-loop at their 1 s CPU deadline", &spin)
    );
    for f in &floods {
        println!("{}", window_row(&format!("+ {}", f.label), &f.window));
    }
    if let (Ok(bw), Ok(sw)) = (&base, &spin) {
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        let p99 = quantile(&sw.healthz, 0.99);
        let ratio = |q| quantile(&sw.latency, q) / quantile(&bw.latency, q);
        let (r50, r99) = (ratio(0.5), ratio(0.99));
        println!();
        println!(
            "with the spinners: /healthz p99 {p99:.1} ms (target < 100 ms: {}); well-behaved create→annotation {r50:.2}× the baseline at p50, {r99:.2}× at p99 (target ≤ 2×: {} / {}); {spun} calls ended by the CPU deadline in the window",
            met(p99 < 100.0),
            met(r50 <= 2.0),
            met(r99 <= 2.0),
        );
    }
    for (what, w) in [("baseline", &base), ("spinners", &spin)] {
        if let Ok(w) = w {
            for p in &w.problems {
                println!("{what}: {p}");
            }
        }
    }
    for p in &spin_problems {
        println!("spinners: {p}");
    }

    println!();
    println!(
        "| flood | ran | RSS before → 5 s in → end → after removal | after `malloc_trim` | /metrics bytes before → end |"
    );
    println!("|---|---|---|---|---|");
    println!("| (RSS at the start of the run, before the baseline) | | {rss0:.0} MiB | | |");
    for f in &floods {
        println!(
            "| {} | {:.0} s | {:.0} → {:.0} → {:.0} → {:.0} MiB | {:.0} MiB | {} → {} |",
            f.label,
            f.ran.as_secs_f64(),
            f.rss[0],
            f.rss[1],
            f.rss[2],
            f.rss[3],
            f.rss[4],
            f.metrics_bytes[0],
            f.metrics_bytes[1]
        );
    }
    println!(
        "| many-workers (asks for 1,000,000 workers) | 2 s | {rss_mw:.0} → {mw_rss:.0} MiB | | |"
    );

    println!();
    println!("| plugin | counter | value |");
    println!("|---|---|---|");
    // A second run's counters add to the first's: only first runs are shown.
    for f in floods.iter().filter(|f| f.label == f.stem) {
        for line in flood_details(&b, f).await {
            println!("{line}");
        }
    }
    println!(
        "| many-workers | `controller_runtime_max_concurrent_reconciles` (--max-workers-per-plugin 16) | {mw_gauge} |"
    );
    println!(
        "| many-workers | tasks alive in the manager's runtime before → with it | {tasks_mw} → {mw_tasks} |"
    );
    for f in &floods {
        for p in &f.problems {
            println!("{}: {p}", f.label);
        }
        if let Ok(w) = &f.window {
            for p in &w.problems {
                println!("{}: {p}", f.label);
            }
        }
    }
    for r in [mw_installed, mw_removed] {
        if let Err(e) = r {
            println!("many-workers: {e}");
        }
    }
    b.manager.stop().await;
}
