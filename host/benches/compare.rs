//! The host next to a native kube-runtime controller, each in its own process, against the real
//! test cluster (testenv), in one run:
//! 1. CPU per event: 2,000 Pods created in a burst (32 creates in flight), then 2,000 more at a
//!    steady 200/s, while, side by side, the host (`wasm-controller-manager run`
//!    with the `noop` plugin, fresh instance per call), a second host with `noop` under
//!    `isolation = "worker"`, and a native kube-runtime `Controller` with a no-op reconcile (this
//!    binary, re-executed with `--native-baseline`) watch every Pod. Each process's utime+stime over
//!    each load, divided by 2,000; RSS after.
//! 2. Memory: a host with 100 copies of `noop` (one shared watch), RSS idle (no Pods) and with the
//!    4,000 Pods cached and reconciled; a host with one copy, idle, for the per-plugin share.
//! 3. Latency at 1,000 events/s: 10 copies of `noop`, 100 Pods created per second for 10 s. Each
//!    latency runs from the moment this process's own watch of the API server delivers a Pod to
//!    the moment the host starts that Pod's reconcile in a plugin (the host's debug log line,
//!    timestamped in microseconds on the same clock).
//!
//! 0. A plugin that reads its objects: the host with `typed-pod-noop` (each Pod parsed into the
//!    k8s-openapi `Pod`) compiled cold (no compile cache) and from a warm cache, beside the host
//!    with `noop`: peak and idle RSS once loaded, RSS after a burst of 2,000 Pods, CPU per event,
//!    the compile child's peak; and the compile peak of each shipped plugin (`inspect`, no cache).
//!    `--typed-only` runs this phase alone.
//! 4. The Python plugin (`config-reloader`, CPython inside the component), run right after phase
//!    0: a host with `noop` alone, and hosts with `noop` plus the config-reloader warm (`isolation = "worker"`, what it
//!    declares) and fresh (`isolation = "call"`), from a warm compile cache: RSS once loaded (the
//!    marginal memory of a loaded Python plugin), then a burst of 1,000 labelled Deployments that
//!    each reconciles once (no write: the Deployments carry the hash of their missing ConfigMaps):
//!    CPU and reconcile time per event, RSS after. About a minute. `--python-only` runs it alone.
//!
//! Run: `scripts/bench-compare` (builds the plugins, then
//! `cargo bench -p wasm-controller-manager --bench compare`; about 6 minutes; prints a report).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{artifact, create_pod, create_pods, granted, wait_until};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;

const PODS: usize = 2000;
const CONCURRENCY: usize = 32;
/// The second load: Pods at the rate a busy cluster creates them, each event on its own.
const PACED_PER_SECOND: f64 = 200.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let typed_only = args.iter().any(|a| a == "--typed-only");
    let python_only = args.iter().any(|a| a == "--python-only");
    if let Some(i) = args.iter().position(|a| a == "--native-baseline") {
        let kubeconfig = args.get(i + 1).expect("--native-baseline KUBECONFIG");
        native_baseline(Path::new(kubeconfig));
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(typed_only, python_only));
}

/// The native baseline: a kube-runtime `Controller` over every Pod with a no-op reconcile, on a
/// runtime like the host's (one thread per core). Prints its reconcile count as it grows.
fn native_baseline(kubeconfig: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(config).expect("client");
        let count = Arc::new(AtomicUsize::new(0));
        let printer = tokio::spawn({
            let count = count.clone();
            async move {
                let mut last = usize::MAX;
                loop {
                    let n = count.load(Ordering::Relaxed);
                    if n != last {
                        println!("reconciled {n}");
                        last = n;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        common::native_noop_controller(client, count).await;
        printer.abort();
    });
}

/// utime+stime of a process, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    common::cpu_seconds_of(&pid.to_string())
}

/// Resident memory of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    common::rss_mib_of(&pid.to_string())
}

/// A running `wasm-controller-manager run`, its /metrics address and its log file.
struct Host {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Host {
    /// Starts the host binary on `dir` with the CLI's defaults, logging warnings only.
    fn start(env: &testenv::TestEnv, dir: &Path, tag: &str) -> Host {
        Host::start_logging(env, dir, tag, "warn")
    }

    /// Starts it with a log filter of its own.
    fn start_logging(env: &testenv::TestEnv, dir: &Path, tag: &str, filter: &str) -> Host {
        let cache = std::env::temp_dir().join(common::COMPILE_CACHE);
        Host::start_with(env, dir, tag, filter, Some(&cache))
    }

    /// Starts it with a log filter and a compile cache of its own (`None`: no cache given).
    fn start_with(
        env: &testenv::TestEnv,
        dir: &Path,
        tag: &str,
        filter: &str,
        cache: Option<&Path>,
    ) -> Host {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!(
            "wcm-bench-compare-{}-{tag}.log",
            std::process::id()
        ));
        let out = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(host_binary());
        cmd.arg("--log")
            .arg(filter)
            .arg("--log-format")
            .arg("json")
            .arg("run")
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path().expect("kubeconfig"))
            .arg("--plugins-dir")
            .arg(dir);
        if let Some(cache) = cache {
            cmd.arg("--compile-cache").arg(cache);
        }
        let child = cmd
            .arg("--metrics-addr")
            .arg(&addr)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start the host binary");
        Host { child, addr, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn metrics(&self) -> String {
        http_get(&self.addr, "/metrics").unwrap_or_default()
    }

    fn reconciles(&self) -> f64 {
        testenv::sum_metric(&self.metrics(), "controller_runtime_reconcile_total", &[])
    }

    fn running_plugins(&self) -> usize {
        http_get(&self.addr, "/plugins")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split('\t').nth(1) == Some("running"))
            .count()
    }

    fn stop(mut self) {
        common::terminate(&mut self.child);
    }
}

/// The native baseline in its own process, and its latest reconcile count.
struct Native {
    child: Child,
    count: Arc<AtomicUsize>,
}

impl Native {
    fn start(env: &testenv::TestEnv) -> Native {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .arg("--native-baseline")
            .arg(env.kubeconfig_path().expect("kubeconfig"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the native baseline");
        let count = Arc::new(AtomicUsize::new(0));
        let stdout = child.stdout.take().expect("stdout");
        let c = count.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("reconciled ") {
                    c.store(n.parse().unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
        Native { child, count }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host binary: this build's, or another (`WCM_BENCH_HOST_BIN`, e.g. an earlier commit's
/// release build) for a before/after comparison in the same run conditions.
fn host_binary() -> PathBuf {
    std::env::var_os("WCM_BENCH_HOST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_wasm-controller-manager")))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body.split_once("\r\n\r\n")?.1.to_string())
}

/// Creates `n` pods named `prefix-i` at a steady `per_second`; returns the time it took.
async fn create_paced(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
    per_second: f64,
) -> Duration {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    let start = Instant::now();
    let mut creates = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let api = api.clone();
        let name = format!("{prefix}-{i}");
        creates.push(tokio::spawn(async move { create_pod(&api, &name).await }));
    }
    for c in creates {
        let _ = c.await;
    }
    start.elapsed()
}

/// A plugins directory with `n` copies of `noop` (each renamed in its NAME.toml, so each is a
/// plugin of its own), with `extra` lines in every NAME.toml; granted their RBAC.
async fn noop_dir(env: &testenv::TestEnv, tag: &str, n: usize, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wcm-bench-compare-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let noop = artifact("noop");
    for i in 0..n {
        let name = if n == 1 {
            tag.to_string()
        } else {
            format!("{tag}-{i:03}")
        };
        std::fs::copy(&noop, dir.join(format!("{name}.wasm"))).expect("copy noop");
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!("name = \"{name}\"\n{extra}"),
        )
        .expect("NAME.toml");
    }
    granted(env, &dir).await;
    dir
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Seconds since the Unix epoch of an RFC 3339 UTC timestamp as tracing writes it
/// (`2026-11-24T01:30:09.123456Z`).
fn parse_utc(ts: &str) -> Option<f64> {
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    let s = t.next()?.parse::<f64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// When each reconcile of a Pod in `ns` started, per plugin, from the host's debug log.
fn reconcile_starts(log: &Path, ns: &str) -> Vec<(String, String, f64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "reconcile started")
        .filter_map(|v| {
            let key = v["fields"]["key"].as_str()?;
            let (kns, name) = key.split_once('/')?;
            if kns != ns {
                return None;
            }
            Some((
                v["fields"]["plugin"].as_str()?.to_string(),
                name.to_string(),
                parse_utc(v["timestamp"].as_str()?)?,
            ))
        })
        .collect()
}

fn report_row(what: &str, cpu: f64, rss: f64, native_cpu: f64) {
    println!(
        "| {what} | {:.0} µs | {:.2}× | {rss:.0} MiB |",
        cpu / PODS as f64 * 1e6,
        cpu / native_cpu
    );
}

/// Peak resident memory of a process so far (VmHWM), MiB.
fn peak_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// A process's resident memory by kind (RssAnon, RssFile, RssShmem) and its proportional set size
/// (Pss: a page mapped twice, e.g. one memfd page in two pooled slots, counts once), MiB: the
/// compiled code is file-backed (mapped from the compile cache), a module's initial memory image is
/// a memfd.
fn rss_parts(pid: u32) -> [f64; 4] {
    let read =
        |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    let (status, rollup) = (read("status"), read("smaps_rollup"));
    let field = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    [
        field(&status, "RssAnon:"),
        field(&status, "RssFile:"),
        field(&status, "RssShmem:"),
        field(&rollup, "Pss:"),
    ]
}

/// A plugins directory with one file of the test plugin `name`, granted its RBAC.
async fn single_plugin_dir(env: &testenv::TestEnv, tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wcm-bench-compare-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::copy(artifact(name), dir.join(format!("{tag}.wasm"))).expect("copy plugin");
    std::fs::write(
        dir.join(format!("{tag}.toml")),
        format!("name = \"{tag}\"\n"),
    )
    .expect("toml");
    granted(env, &dir).await;
    dir
}

/// The peak RSS of each compile child a host logged (`component compiled in a child process`).
fn child_compile_peaks(log: &Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "component compiled in a child process")
        .filter_map(|v| v["fields"]["compile_peak_rss_mib"].as_f64())
        .collect()
}

/// `inspect` of a plugin file (which compiles it, with no cache): the inspect process's own peak
/// RSS (its VmHWM, read every 10 ms until it exits: a build that compiles in its own process peaks
/// here), and the compile child's peak and the inspect process's own as the build reports them,
/// MiB; and the wall time. (Not `wait4`'s maxrss: a child forked from this large process starts
/// with this process's peak.)
fn inspect_peak(path: &Path) -> (f64, Option<f64>, Option<f64>, Duration) {
    let started = Instant::now();
    let mut child = Command::new(host_binary())
        .arg("inspect")
        .arg("--json")
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start inspect");
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(mut o) = stdout {
            let _ = o.read_to_string(&mut out);
        }
        out
    });
    let mut polled: f64 = 0.0;
    while matches!(child.try_wait(), Ok(None)) {
        polled = polled.max(peak_mib(child.id()));
        std::thread::sleep(Duration::from_millis(10));
    }
    let wall = started.elapsed();
    let out = reader.join().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let mib = |b: &serde_json::Value| b.as_f64().map(|b| b / f64::from(1 << 20));
    (
        polled,
        mib(&v["compilePeakRssBytes"]),
        mib(&v["processPeakRssBytes"]),
        wall,
    )
}

/// What the typed phase measured of one host.
struct TypedRow {
    what: &'static str,
    /// VmHWM once its plugin runs: the host process's peak over the load, compile included when
    /// it compiles in its own process.
    load_peak: f64,
    idle: f64,
    after_burst: f64,
    cpu: f64,
    child_peak: Option<f64>,
}

/// The host with a plugin that reads its objects (`typed-pod-noop`: every Pod parsed into the
/// k8s-openapi `Pod`, as real plugins do) beside the host with `noop`, in one run: `noop` from the
/// warm cache, the typed plugin with no compile cache (it compiles at start: cold) and from a
/// warm cache. RSS once loaded (idle), after a burst of 2,000 Pods, CPU per event; then the
/// compile peak of each shipped plugin (`inspect`, no cache).
async fn typed_beside_noop(env: &testenv::TestEnv, client: &kube::Client) {
    let noop = noop_dir(env, "tnoop", 1, "").await;
    let typed = single_plugin_dir(env, "typed", "typed_pod_noop").await;
    // A cache of its own, filled by a host that is then stopped.
    let warm_cache = std::env::temp_dir().join(format!(
        "wcm-bench-compare-{}-typed-cache",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&warm_cache);
    let filler = Host::start_with(env, &typed, "typed-fill", "warn", Some(&warm_cache));
    wait_until("the typed plugin's cache", Duration::from_secs(300), || {
        filler.running_plugins() >= 1
    })
    .await;
    filler.stop();

    let compile_line = "warn,wasm_controller_manager::sandbox=info";
    let hosts = [
        (
            "host, `noop` (warm cache)",
            Host::start_logging(env, &noop, "tnoop", compile_line),
        ),
        (
            "host, `typed-pod-noop`, cold (no compile cache)",
            Host::start_with(env, &typed, "typed-cold", compile_line, None),
        ),
        (
            "host, `typed-pod-noop`, warm cache",
            Host::start_with(env, &typed, "typed-warm", compile_line, Some(&warm_cache)),
        ),
    ];
    wait_until("the three hosts running", Duration::from_secs(300), || {
        hosts.iter().all(|(_, h)| h.running_plugins() >= 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let load_peak: Vec<f64> = hosts.iter().map(|(_, h)| peak_mib(h.pid())).collect();
    let idle: Vec<f64> = hosts.iter().map(|(_, h)| rss_mib(h.pid())).collect();
    let r0: Vec<f64> = hosts.iter().map(|(_, h)| h.reconciles()).collect();
    let cpu0: Vec<f64> = hosts.iter().map(|(_, h)| cpu_seconds(h.pid())).collect();
    let ns = env.namespace("bench-typed").await.expect("ns").name;
    let created = create_pods(client, &ns, "p", PODS, CONCURRENCY).await;
    wait_until(
        "the three hosts reconciled the pods",
        Duration::from_secs(300),
        || {
            hosts
                .iter()
                .zip(&r0)
                .all(|((_, h), r)| h.reconciles() >= r + PODS as f64)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows: Vec<TypedRow> = hosts
        .iter()
        .enumerate()
        .map(|(i, (what, h))| TypedRow {
            what,
            load_peak: load_peak[i],
            idle: idle[i],
            after_burst: rss_mib(h.pid()),
            cpu: cpu_seconds(h.pid()) - cpu0[i],
            child_peak: child_compile_peaks(&h.log).into_iter().reduce(f64::max),
        })
        .collect();
    for (_, h) in hosts {
        h.stop();
    }

    println!();
    println!(
        "typed beside noop: {PODS} pods created in {:.2} s; host {}",
        created.as_secs_f64(),
        host_binary().display()
    );
    println!();
    println!(
        "| process | RSS peak over the load | RSS idle, loaded | RSS after the burst | CPU per event | compile child's peak |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.0} µs | {} |",
            r.what,
            r.load_peak,
            r.idle,
            r.after_burst,
            r.cpu / PODS as f64 * 1e6,
            r.child_peak
                .map(|p| format!("{p:.0} MiB"))
                .unwrap_or_else(|| "—".into())
        );
    }
    println!();
    println!(
        "| plugin (`inspect`, no cache) | size | inspect wall | `inspect`'s peak RSS (polled) | compile child's peak | `inspect`'s own, reported |"
    );
    println!("|---|---|---|---|---|---|");
    for name in [
        "noop",
        "typed_pod_noop",
        "pod_counter",
        "network",
        "config_reloader",
    ] {
        let path = artifact(name);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (tree, child, own, wall) = inspect_peak(&path);
        let show = |v: Option<f64>| {
            v.map(|v| format!("{v:.1} MiB"))
                .unwrap_or_else(|| "—".into())
        };
        println!(
            "| {name} | {:.0} KB | {:.2} s | {tree:.1} MiB | {} | {} |",
            size as f64 / 1000.0,
            wall.as_secs_f64(),
            show(child),
            show(own)
        );
    }
    for d in [&noop, &typed, &warm_cache] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Deployments in the Python phase.
const DEPLOYMENTS: usize = 1000;

/// The languages bench's Deployment (three ConfigMaps referenced, none of which exists; its template
/// carries the hash of exactly that), as `name` in `ns`.
fn deployment(ns: &str, name: &str) -> k8s_openapi::api::apps::v1::Deployment {
    let mut v: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/deployment.json")).expect("fixture");
    v.as_object_mut().map(|o| o.remove("status"));
    v["metadata"] = serde_json::json!({
        "name": name,
        "namespace": ns,
        "labels": {"app": "web", "config-reloader.wcm.io/enabled": "true"},
    });
    serde_json::from_value(v).expect("a Deployment")
}

/// The Python config-reloader beside `noop`, in one run: its marginal memory once loaded, and its
/// cost per event warm (`isolation = "worker"`) and fresh (`isolation = "call"`).
async fn python_beside_noop(env: &testenv::TestEnv, client: &kube::Client) {
    use k8s_openapi::api::apps::v1::Deployment;
    let plain = noop_dir(env, "pnoop", 1, "").await;
    let with_python = |tag: &'static str, isolation: &'static str| async move {
        let dir = noop_dir(env, &format!("{tag}-noop"), 1, "").await;
        std::fs::copy(artifact("config_reloader"), dir.join(format!("{tag}.wasm")))
            .expect("copy the config-reloader");
        std::fs::write(
            dir.join(format!("{tag}.toml")),
            format!("name = \"{tag}\"\nisolation = \"{isolation}\"\n"),
        )
        .expect("NAME.toml");
        // Granted (and compiled into the bench's compile cache: every host maps it from there).
        granted(env, &dir).await;
        dir
    };
    let warm_dir = with_python("pyw", "worker").await;
    let fresh_dir = with_python("pyc", "call").await;
    let compile_line = "warn,wasm_controller_manager::sandbox=info";
    let hosts = [
        (
            "host, `noop`",
            Host::start_logging(env, &plain, "pnoop", compile_line),
            None,
        ),
        (
            "host, `noop` + config-reloader, `isolation = \"worker\"` (declared)",
            Host::start_logging(env, &warm_dir, "pyw", compile_line),
            Some("pyw"),
        ),
        (
            "host, `noop` + config-reloader, `isolation = \"call\"` (fresh instance)",
            Host::start_logging(env, &fresh_dir, "pyc", compile_line),
            Some("pyc"),
        ),
    ];
    let started = Instant::now();
    wait_until("the python hosts running", Duration::from_secs(300), || {
        hosts
            .iter()
            .all(|(_, h, py)| h.running_plugins() > usize::from(py.is_some()))
    })
    .await;
    let load_wall = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak: Vec<f64> = hosts.iter().map(|(_, h, _)| peak_mib(h.pid())).collect();
    let idle: Vec<f64> = hosts.iter().map(|(_, h, _)| rss_mib(h.pid())).collect();
    let idle_parts: Vec<[f64; 4]> = hosts.iter().map(|(_, h, _)| rss_parts(h.pid())).collect();
    let reconciles = |h: &Host, py: &str| {
        testenv::sum_metric(
            &h.metrics(),
            "controller_runtime_reconcile_total",
            &[("controller", py)],
        )
    };
    let reconcile_time = |h: &Host, py: &str| {
        let m = h.metrics();
        let labels = [("controller", py)];
        (
            testenv::sum_metric(&m, "controller_runtime_reconcile_time_seconds_sum", &labels),
            testenv::sum_metric(
                &m,
                "controller_runtime_reconcile_time_seconds_count",
                &labels,
            ),
        )
    };
    let r0: Vec<f64> = hosts
        .iter()
        .map(|(_, h, py)| py.map_or(0.0, |py| reconciles(h, py)))
        .collect();
    let t0: Vec<(f64, f64)> = hosts
        .iter()
        .map(|(_, h, py)| py.map_or((0.0, 0.0), |py| reconcile_time(h, py)))
        .collect();
    let cpu0: Vec<f64> = hosts.iter().map(|(_, h, _)| cpu_seconds(h.pid())).collect();
    let ns = env.namespace("bench-python").await.expect("ns").name;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let created = Instant::now();
    futures::stream::iter(0..DEPLOYMENTS)
        .map(|i| {
            let (api, d) = (api.clone(), deployment(&ns, &format!("d-{i}")));
            async move {
                for _ in 0..5 {
                    if api.create(&Default::default(), &d).await.is_ok() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                panic!("could not create a Deployment");
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let created = created.elapsed();
    wait_until(
        "the config-reloaders reconciled the Deployments",
        Duration::from_secs(300),
        || {
            hosts.iter().zip(&r0).all(|((_, h, py), r)| {
                py.is_none_or(|py| reconciles(h, py) >= r + DEPLOYMENTS as f64)
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, (what, h, py))| {
            let (sum, count) = py.map_or((0.0, 0.0), |py| reconcile_time(h, py));
            let per_reconcile = (count > t0[i].1).then(|| (sum - t0[i].0) / (count - t0[i].1));
            let n = py.map_or(0.0, |py| reconciles(h, py) - r0[i]);
            (
                *what,
                peak[i],
                idle[i],
                rss_mib(h.pid()),
                cpu_seconds(h.pid()) - cpu0[i],
                per_reconcile,
                n,
                child_compile_peaks(&h.log).into_iter().reduce(f64::max),
            )
        })
        .collect();
    let after_parts: Vec<[f64; 4]> = hosts.iter().map(|(_, h, _)| rss_parts(h.pid())).collect();
    for (_, h, _) in hosts {
        h.stop();
    }
    println!();
    println!(
        "python beside noop: hosts loaded (from the compile cache) in {:.1} s; {DEPLOYMENTS} Deployments created in {:.2} s",
        load_wall.as_secs_f64(),
        created.as_secs_f64()
    );
    println!();
    println!(
        "| host | RSS peak | RSS idle, loaded | Python's marginal RSS, loaded | RSS after the burst | reconciles | CPU per event | reconcile time per event | compiled in a child |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (what, peak, idle, after, cpu, per_reconcile, n, child) in &rows {
        let noop_idle = rows[0].2;
        println!(
            "| {what} | {peak:.1} MiB | {idle:.1} MiB | {} | {after:.1} MiB | {n:.0} | {} | {} | {} |",
            if *n > 0.0 {
                format!("{:.1} MiB", idle - noop_idle)
            } else {
                "—".into()
            },
            if *n > 0.0 {
                format!("{:.0} µs", cpu / DEPLOYMENTS as f64 * 1e6)
            } else {
                format!("({:.2} s over the burst)", cpu)
            },
            per_reconcile
                .map(|s| format!("{:.0} µs", s * 1e6))
                .unwrap_or_else(|| "—".into()),
            child
                .map(|p| format!("{p:.0} MiB"))
                .unwrap_or_else(|| "no (cache)".into())
        );
    }
    println!();
    println!(
        "| host | idle: anonymous / file-backed / shared (memfd) RSS; PSS | after the burst: the same |"
    );
    println!("|---|---|---|");
    for (i, (what, ..)) in rows.iter().enumerate() {
        let show = |p: [f64; 4]| {
            format!(
                "{:.1} / {:.1} / {:.1} MiB; PSS {:.1} MiB",
                p[0], p[1], p[2], p[3]
            )
        };
        println!(
            "| {what} | {} | {} |",
            show(idle_parts[i]),
            show(after_parts[i])
        );
    }
    for d in [&plain, &warm_dir, &fresh_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
}

async fn run(typed_only: bool, python_only: bool) {
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    let client = env.client().await.expect("client");
    if python_only {
        python_beside_noop(env, &client).await;
        return;
    }
    // Phase 0, first: the typed plugin beside noop, and each shipped plugin's compile peak.
    typed_beside_noop(env, &client).await;
    if typed_only {
        return;
    }
    python_beside_noop(env, &client).await;
    println!(
        "machine: {} cores; {PODS} pods per burst, {CONCURRENCY} creates in flight; host {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        host_binary().display()
    );
    // Compile once, outside every measurement.
    let warm_dir = noop_dir(env, "noop", 1, "").await;
    let warmup = Host::start(env, &warm_dir, "warmup");
    wait_until("the compile cache", Duration::from_secs(120), || {
        warmup.running_plugins() >= 1
    })
    .await;
    warmup.stop();

    // Phase 2a: idle memory, 1 plugin and 100 plugins, before any Pod exists.
    let one = Host::start(env, &warm_dir, "one");
    let hundred_dir = noop_dir(env, "n", 100, "").await;
    let hundred = Host::start(env, &hundred_dir, "hundred");
    wait_until("1 plugin running", Duration::from_secs(120), || {
        one.running_plugins() >= 1
    })
    .await;
    wait_until("100 plugins running", Duration::from_secs(300), || {
        hundred.running_plugins() >= 100
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (one_idle, hundred_idle) = (rss_mib(one.pid()), rss_mib(hundred.pid()));
    one.stop();
    hundred.stop();

    // Phase 1: the burst, side by side.
    let fresh = Host::start(env, &warm_dir, "fresh");
    let warm_dir2 = noop_dir(env, "noop-warm", 1, "isolation = \"worker\"\n").await;
    let warm = Host::start(env, &warm_dir2, "warm");
    let native = Native::start(env);
    wait_until("hosts running", Duration::from_secs(120), || {
        fresh.running_plugins() >= 1 && warm.running_plugins() >= 1
    })
    .await;
    // Every process has listed and reconciled what exists (nothing in the bench's namespaces yet).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (f0, w0, n0) = (
        fresh.reconciles(),
        warm.reconciles(),
        native.count.load(Ordering::Relaxed),
    );
    let pids = [fresh.pid(), warm.pid(), native.child.id()];
    let mut loads = Vec::new();
    for (i, paced) in [false, true].into_iter().enumerate() {
        let ns = env.namespace("bench-compare").await.expect("ns").name;
        let cpu0: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
        let started = Instant::now();
        let created = if paced {
            create_paced(&client, &ns, "p", PODS, PACED_PER_SECOND).await
        } else {
            create_pods(&client, &ns, "p", PODS, CONCURRENCY).await
        };
        let more = ((i + 1) * PODS) as f64;
        wait_until(
            "every process reconciled the pods",
            Duration::from_secs(300),
            || {
                fresh.reconciles() >= f0 + more
                    && warm.reconciles() >= w0 + more
                    && native.count.load(Ordering::Relaxed) as f64 >= n0 as f64 + more
            },
        )
        .await;
        let wall = started.elapsed();
        // Let the last watch events and their bookkeeping settle before reading the counters.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cpu: Vec<f64> = pids
            .iter()
            .zip(&cpu0)
            .map(|(p, c0)| cpu_seconds(*p) - c0)
            .collect();
        loads.push((paced, created, wall, cpu));
    }
    let rss: Vec<f64> = pids.iter().map(|p| rss_mib(*p)).collect();
    fresh.stop();
    warm.stop();
    native.stop();

    // Phase 2b: 100 plugins with the 2,000 Pods cached (and reconciled by each).
    let hundred = Host::start(env, &hundred_dir, "hundred-pods");
    wait_until("100 plugins running", Duration::from_secs(300), || {
        hundred.running_plugins() >= 100
    })
    .await;
    wait_until(
        "100 plugins reconciled the pods",
        Duration::from_secs(600),
        || hundred.reconciles() >= (100 * 2 * PODS) as f64,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hundred_pods = rss_mib(hundred.pid());
    hundred.stop();

    // Phase 3: latency at 1,000 events/s (10 plugins × 100 Pods/s).
    let ten_dir = noop_dir(env, "t", 10, "").await;
    // The debug line at each reconcile's start is what the latencies are read from.
    let ten = Host::start_logging(
        env,
        &ten_dir,
        "ten",
        "warn,wasm_controller_manager::engine::controller=debug",
    );
    wait_until("10 plugins running", Duration::from_secs(120), || {
        ten.running_plugins() >= 10
    })
    .await;
    wait_until("10 plugins synced", Duration::from_secs(300), || {
        ten.reconciles() >= (10 * 2 * PODS) as f64
    })
    .await;
    let lat_ns = env.namespace("bench-latency").await.expect("ns").name;
    let seen: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
    let watch = tokio::spawn({
        let (api, seen) = (
            Api::<Pod>::namespaced(client.clone(), &lat_ns),
            seen.clone(),
        );
        async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(e)) = events.try_next().await {
                if let watcher::Event::Apply(p) = e {
                    let t = now_unix();
                    if let Some(name) = p.metadata.name
                        && let Ok(mut seen) = seen.lock()
                    {
                        seen.entry(name).or_insert(t);
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    const LATENCY_PODS: usize = 1000;
    let paced = create_paced(&client, &lat_ns, "l", LATENCY_PODS, 100.0).await;
    let target = (10 * 2 * PODS + 10 * LATENCY_PODS) as f64;
    wait_until("latency pods reconciled", Duration::from_secs(120), || {
        ten.reconciles() >= target
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch.abort();
    let ten_log = ten.log.clone();
    ten.stop();
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let mut first: HashMap<(String, String), f64> = HashMap::new();
    for (plugin, name, t) in reconcile_starts(&ten_log, &lat_ns) {
        first
            .entry((plugin, name))
            .and_modify(|e| *e = e.min(t))
            .or_insert(t);
    }
    let mut lat: Vec<f64> = first
        .iter()
        .filter_map(|((_, name), t)| Some((t - seen.get(name)?) * 1e3))
        .collect();
    lat.sort_by(f64::total_cmp);

    for (paced, created, wall, cpu) in &loads {
        println!();
        println!(
            "{}: {PODS} pods created in {:.2} s ({:.0}/s); all three processes done after {:.2} s",
            if *paced { "paced" } else { "burst" },
            created.as_secs_f64(),
            PODS as f64 / created.as_secs_f64(),
            wall.as_secs_f64()
        );
        println!();
        println!("| process (each watches every Pod) | CPU per event | × native | RSS after |");
        println!("|---|---|---|---|");
        report_row(
            "host, `noop`, fresh instance per call (default)",
            cpu[0],
            rss[0],
            cpu[2],
        );
        report_row(
            "host, `noop`, `isolation = \"worker\"`",
            cpu[1],
            rss[1],
            cpu[2],
        );
        report_row(
            "native kube-runtime `Controller`, no-op",
            cpu[2],
            rss[2],
            cpu[2],
        );
    }
    println!();
    println!("| host RSS | value |");
    println!("|---|---|");
    println!("| 1 plugin, idle | {one_idle:.1} MiB |");
    println!("| 100 plugins, idle | {hundred_idle:.1} MiB |");
    println!(
        "| per idle plugin ((100 − 1) / 99) | {:.0} KiB |",
        (hundred_idle - one_idle) * 1024.0 / 99.0
    );
    println!(
        "| 100 plugins, {} Pods cached and reconciled | {hundred_pods:.1} MiB |",
        2 * PODS
    );
    println!(
        "| native controller, {} Pods cached (phase 1) | {:.1} MiB |",
        2 * PODS,
        rss[2]
    );
    println!();
    println!(
        "latency: {LATENCY_PODS} pods at {:.0}/s × 10 plugins = {:.0} events/s; {} of {} (plugin, pod) pairs timed",
        LATENCY_PODS as f64 / paced.as_secs_f64(),
        10.0 * LATENCY_PODS as f64 / paced.as_secs_f64(),
        lat.len(),
        10 * LATENCY_PODS
    );
    println!(
        "| watch delivery → reconcile start | p50 {:.2} ms | p99 {:.2} ms | max {:.2} ms |",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    for d in [&warm_dir, &warm_dir2, &hundred_dir, &ten_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
}
