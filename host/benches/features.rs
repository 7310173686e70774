//! The cost of each feature contract 0.3 added (issue 27), against the real test cluster (testenv),
//! in one run of one in-process host (`Manager`, as `engine.rs`), side by side:
//! 1. **baseline**: `features-probe` reconciling N primary ConfigMaps (N=500, `WCM_BENCH_FEATURES_N`)
//!    and returning no children and updating no metrics;
//! 2. **children**: the same N returning 1 and then 3 ConfigMap children each: the first burst (the
//!    ApplySet record on the primary, one create per child, and the reconciles their watch events
//!    wake) and a steady re-reconcile with the set unchanged; the API calls, counted per verb in the
//!    API server's audit log;
//! 3. **plugin metrics**: a counter inc and a histogram observe per reconcile, and the RSS and
//!    `/metrics` size once the plugin holds its 1,000-series budget;
//! 4. **schedules**: one tick of `features-schedule` (`* * * * *`, the finest cron) enqueuing every
//!    primary, around a minute boundary;
//! 5. **traces**: the baseline and the 1-child steady re-reconcile with traces exported to a real
//!    OpenTelemetry Collector (`testenv::Collector`) at sample ratio 1.0, next to the same rounds
//!    off (first every round off, then the global subscriber installed and every round on).
//!
//! A round is one NAME.toml change (`[config]`, an in-place swap that reconciles every key again:
//! no load generator in the process) and every reconcile it causes, until the queue is empty and
//! no reconcile ran for 1 s. CPU is this process's CPU clock (utime+stime, to the ns) over the
//! round, less the bench's own metric reads (their thread CPU time, measured); each round is
//! repeated (`WCM_BENCH_FEATURES_REPEATS`, 5) and the median taken.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench features`, with
//! `WCM_TESTENV_BIN` and `WCM_TESTENV_OTELCOL_BIN` set (about 8 minutes; prints a report;
//! docs/benchmarks.md keeps the numbers).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use common::{artifact, granted, rss_mib};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use wasm_controller_manager::app::Manager;

const PROBE: &str = "features-probe";
const SCHEDULE: &str = "features-schedule";
/// The plugins' identity as the API server sees it (the default identity settings).
const PROBE_USER: &str = "system:serviceaccount:wcm-system:wcm-plugin-features-probe";
/// No reconcile for this long, with an empty queue: the round is over.
const SETTLE: Duration = Duration::from_secs(1);
/// After a traced round, long enough for the batch exporter (5 s schedule) to send its spans
/// inside the round's window; the same tail is given to the rounds it is compared with.
const TRACE_TAIL: Duration = Duration::from_secs(6);
/// The plugin metrics' series budget (`wcm_rules::metrics::DEFAULT_MAX_SERIES`).
const SERIES_BUDGET: usize = 1000;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

fn cpu_clock(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU time of the calling thread, seconds.
fn thread_cpu() -> f64 {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// utime+stime of this process, seconds, to the nanosecond: `common::cpu_seconds` reads
/// `/proc/self/stat` in 10 ms ticks, 20 µs per primary at N = 500, too coarse for a round.
fn cpu_seconds() -> f64 {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a round measured.
#[derive(Clone, Debug)]
struct Round {
    label: String,
    reconciles: f64,
    /// CPU of this process over the round, less the bench's metric reads, seconds.
    cpu: f64,
    /// From the NAME.toml write (or the schedule's tick) to the last reconcile seen.
    wall: Duration,
    /// The plugin's API calls (its own identity), by "verb resource", access reviews included.
    plugin_calls: BTreeMap<String, usize>,
    /// Every other completed request (the host's own identity: leases, access reviews of its own).
    other_calls: usize,
    rss: f64,
}

impl Round {
    /// The plugin's calls that are its reconciles' (not the swap's access reviews, not the
    /// events the host writes in its own time).
    fn reconcile_calls(&self) -> impl Iterator<Item = (&String, &usize)> {
        self.plugin_calls
            .iter()
            .filter(|(k, _)| !k.contains("selfsubjectaccessreviews") && !k.ends_with(" events"))
    }
}

struct Bench {
    env: &'static testenv::TestEnv,
    manager: Manager,
    dir: PathBuf,
    n: usize,
    round: u64,
    /// Thread CPU spent reading the host's metrics, seconds.
    poll_cpu: f64,
}

struct Snapshot {
    reconciles: f64,
    depth: f64,
    active: f64,
    /// Events written or dropped for the plugin (prunes record one per child, at `--event-qps`).
    events: f64,
}

impl Bench {
    fn snapshot(&mut self, plugin: &str) -> Snapshot {
        let t = thread_cpu();
        let text = self.manager.metrics.encode();
        let s = Snapshot {
            reconciles: testenv::sum_metric(
                &text,
                "controller_runtime_reconcile_total",
                &[("controller", plugin)],
            ),
            depth: testenv::sum_metric(&text, "workqueue_depth", &[("name", plugin)]),
            active: testenv::sum_metric(
                &text,
                "controller_runtime_active_workers",
                &[("controller", plugin)],
            ),
            events: testenv::sum_metric(&text, "wcm_events_written_total", &[("plugin", plugin)])
                + testenv::sum_metric(&text, "wcm_events_dropped_total", &[("plugin", plugin)]),
        };
        self.poll_cpu += thread_cpu() - t;
        s
    }

    /// Waits until `plugin` has run at least `at_least` reconciles in all, its queue is empty and
    /// no reconcile ran and no event was written for [`SETTLE`] (the events a round causes are
    /// its cost); the total and when it last changed.
    async fn settle(&mut self, plugin: &str, at_least: f64, what: &str) -> (f64, Instant) {
        let start = Instant::now();
        let mut last = f64::NAN;
        let mut changed = Instant::now();
        let mut events = f64::NAN;
        let mut events_changed = Instant::now();
        loop {
            let s = self.snapshot(plugin);
            if s.reconciles != last {
                last = s.reconciles;
                changed = Instant::now();
            }
            if s.events != events {
                events = s.events;
                events_changed = Instant::now();
            }
            if s.reconciles >= at_least
                && s.depth == 0.0
                && s.active == 0.0
                && changed.elapsed() >= SETTLE
                && events_changed.elapsed() >= SETTLE
            {
                return (last, changed);
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "timed out waiting for {what}: {} of {at_least} reconciles",
                s.reconciles
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes the plugin's NAME.toml (atomically: a rename into the directory).
    fn write_settings(&mut self, config: &[(&str, &str)]) {
        self.round += 1;
        let mut toml = String::from("[config]\n");
        for (k, v) in config {
            toml.push_str(&format!("{k} = \"{v}\"\n"));
        }
        toml.push_str(&format!("round = \"{}\"\n", self.round));
        let tmp = self.dir.with_extension("toml-tmp");
        std::fs::write(&tmp, toml).expect("write settings");
        std::fs::rename(&tmp, self.dir.join(format!("{PROBE}.toml"))).expect("rename settings");
    }

    /// One round of features-probe with `config`: the swap and every reconcile it causes.
    async fn round(&mut self, label: &str, config: &[(&str, &str)], tail: Duration) -> Round {
        let mark = self.env.audit_mark().expect("audit mark");
        let before = self.snapshot(PROBE).reconciles;
        let poll0 = self.poll_cpu;
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        self.write_settings(config);
        let (total, last) = self.settle(PROBE, before + self.n as f64, label).await;
        tokio::time::sleep(tail).await;
        let cpu = cpu_seconds() - cpu0 - (self.poll_cpu - poll0);
        let r = self.finish(
            label,
            total - before,
            cpu,
            last.saturating_duration_since(t0),
            mark,
        );
        print_round(&r, self.n);
        r
    }

    fn finish(
        &self,
        label: &str,
        reconciles: f64,
        cpu: f64,
        wall: Duration,
        mark: testenv::AuditMark,
    ) -> Round {
        let mut plugin_calls = BTreeMap::new();
        let mut other_calls = 0;
        for e in self.env.audit_events_since(mark).expect("audit events") {
            if e.stage != "ResponseComplete" || e.verb == "watch" {
                continue;
            }
            if e.effective_user() == PROBE_USER {
                let resource = e
                    .object_ref
                    .as_ref()
                    .map(|o| o.resource.clone())
                    .unwrap_or_default();
                *plugin_calls
                    .entry(format!("{} {resource}", e.verb))
                    .or_insert(0) += 1;
            } else {
                other_calls += 1;
            }
        }
        Round {
            label: label.to_string(),
            reconciles,
            cpu,
            wall,
            plugin_calls,
            other_calls,
            rss: rss_mib(),
        }
    }
}

fn print_round(r: &Round, n: usize) {
    println!(
        "  {:<28} {:>6.0} reconciles ({:.2}/primary)  CPU {:>7.1} ms = {:>6.0} µs/primary, {:>5.0} µs/reconcile  wall {:>6.2} s  plugin calls {:?}  other calls {}  RSS {:.1} MiB",
        r.label,
        r.reconciles,
        r.reconciles / n as f64,
        r.cpu * 1e3,
        r.cpu / n as f64 * 1e6,
        r.cpu / r.reconciles.max(1.0) * 1e6,
        r.wall.as_secs_f64(),
        r.plugin_calls,
        r.other_calls,
        r.rss
    );
}

/// The median per primary of each "verb resource" of the reconciles' calls: `2 patch configmaps`.
fn calls_per_primary(rs: &[&Round], n: usize) -> String {
    let mut keys: Vec<&String> = rs
        .iter()
        .flat_map(|r| r.reconcile_calls().map(|(k, _)| k))
        .collect();
    keys.sort();
    keys.dedup();
    let parts: Vec<String> = keys
        .into_iter()
        .map(|k| {
            let per = median(
                rs.iter()
                    .map(|r| *r.plugin_calls.get(k).unwrap_or(&0) as f64 / n as f64)
                    .collect(),
            );
            format!("{per:.2} {k}")
        })
        .collect();
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(" + ")
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Creates `n` ConfigMaps `p-i` labelled as features-probe's primaries.
async fn create_primaries(client: &kube::Client, ns: &str, n: usize) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("p-{i}"), "labels": {"wcm.bench/features": ""}},
                    "data": {"value": "x"}
                }))
                .expect("static configmap");
                for attempt in 0..5 {
                    match api.create(&Default::default(), &cm).await {
                        Ok(_) => return,
                        Err(e) if attempt < 4 => {
                            eprintln!("create p-{i}: {e}; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => panic!("create p-{i}: {e}"),
                    }
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
}

fn copy_plugin(example: &str, name: &str, dir: &Path) {
    std::fs::copy(artifact(example), dir.join(format!("{name}.wasm"))).expect("copy plugin");
}

async fn run() {
    let n = env_usize("WCM_BENCH_FEATURES_N", 500);
    let repeats = env_usize("WCM_BENCH_FEATURES_REPEATS", 5).max(1);
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    assert!(
        env.has_audit_log(),
        "the bench counts API calls in the local test cluster's audit log"
    );
    let client = env.client().await.expect("client");
    println!(
        "machine: {} cores; primaries N = {n}; repeats {repeats}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let ns = env.namespace("bench-features").await.expect("ns").name;
    create_primaries(&client, &ns, n).await;

    // Both plugins are granted their generated RBAC up front; the schedule one runs later.
    let base = std::env::temp_dir().join(format!("wcm-bench-features-{}", std::process::id()));
    let staging = base.join("staging");
    let dir = base.join("plugins");
    std::fs::create_dir_all(&staging).expect("dir");
    std::fs::create_dir_all(&dir).expect("dir");
    copy_plugin("features_probe", PROBE, &staging);
    copy_plugin("features_schedule", SCHEDULE, &staging);
    let kube_config = granted(env, &staging).await;
    copy_plugin("features_probe", PROBE, &dir);
    std::fs::write(
        dir.join(format!("{PROBE}.toml")),
        "[config]\nround = \"0\"\n",
    )
    .expect("settings");
    let mut config = common::bench_config(&dir);
    // The host-wide client bucket is not what this bench measures: 3 children for 500 primaries
    // is 2,000 writes in one burst, 40 s at the CLI's 50 qps.
    config.kube_qps = 5000.0;
    config.kube_burst = 10000;
    let rss_before_manager = rss_mib();
    let manager = Manager::start(config, kube_config).await.expect("manager");
    let mut b = Bench {
        env,
        manager,
        dir,
        n,
        round: 0,
        poll_cpu: 0.0,
    };
    let t = Instant::now();
    b.settle(PROBE, n as f64, "the first sync").await;
    println!(
        "first sync of {n} primaries: {:.1} s; RSS {:.1} MiB (before the manager: {:.1} MiB)",
        t.elapsed().as_secs_f64(),
        rss_mib(),
        rss_before_manager
    );

    // 1–3: the rounds, repeated.
    println!("\nrounds (each a NAME.toml change: an in-place swap + every reconcile it causes):");
    b.round("warm-up (baseline)", &[], Duration::ZERO).await;
    let mut rounds: Vec<Round> = Vec::new();
    for rep in 0..repeats {
        println!("repeat {}:", rep + 1);
        for (label, config) in [
            ("baseline", &[][..]),
            ("metrics", &[("metrics", "true")][..]),
            ("1 child, first", &[("children", "1")][..]),
            ("1 child, steady", &[("children", "1")][..]),
            ("prune 1 child", &[("children", "0")][..]),
            ("3 children, first", &[("children", "3")][..]),
            ("3 children, steady", &[("children", "3")][..]),
            ("prune 3 children", &[("children", "0")][..]),
        ] {
            rounds.push(b.round(label, config, Duration::ZERO).await);
        }
    }

    // 3: the series budget filled.
    println!("\nplugin metrics at the series budget:");
    let scrape_before = b.manager.metrics.encode();
    let rss_metrics_before = rss_mib();
    let flood = SERIES_BUDGET.div_ceil(n).to_string();
    let flood_round = b
        .round(
            "metrics, budget filled",
            &[("metrics", "true"), ("flood", &flood)],
            Duration::ZERO,
        )
        .await;
    let scrape_after = b.manager.metrics.encode();
    let plugin_series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("wcm_plugin_features_probe__reconciles_total{"))
            .count()
    };
    let rss_metrics_after = rss_mib();
    println!(
        "  counter series {} → {}; /metrics {} B → {} B; RSS {:.1} → {:.1} MiB",
        plugin_series(&scrape_before),
        plugin_series(&scrape_after),
        scrape_before.len(),
        scrape_after.len(),
        rss_metrics_before,
        rss_metrics_after
    );

    // 4: one schedule tick.
    println!("\nschedule:");
    copy_plugin("features_schedule", SCHEDULE, &b.dir);
    b.settle(SCHEDULE, n as f64, "features-schedule's first sync")
        .await;
    let unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock");
    let mut to_boundary = Duration::from_secs(60 - unix.as_secs() % 60)
        - Duration::from_nanos(u64::from(unix.subsec_nanos()));
    if to_boundary < Duration::from_secs(3) {
        to_boundary += Duration::from_secs(60);
    }
    tokio::time::sleep(to_boundary - Duration::from_millis(1500)).await;
    let boundary = Instant::now() + Duration::from_millis(1500);
    let mark = b.env.audit_mark().expect("mark");
    let before = b.snapshot(SCHEDULE).reconciles;
    let poll0 = b.poll_cpu;
    let cpu0 = cpu_seconds();
    let (total, last) = b
        .settle(SCHEDULE, before + n as f64, "the scheduled reconciles")
        .await;
    let cpu = cpu_seconds() - cpu0 - (b.poll_cpu - poll0);
    let ticks = common::metric(
        &b.manager,
        "wcm_schedule_ticks_total",
        &[("plugin", SCHEDULE)],
    );
    let schedule_round = b.finish(
        "schedule tick (N keys)",
        total - before,
        cpu,
        last.saturating_duration_since(boundary),
        mark,
    );
    print_round(&schedule_round, n);
    println!("  ticks counted: {ticks}");
    // It would tick into the next rounds every minute: removed.
    std::fs::remove_file(b.dir.join(format!("{SCHEDULE}.wasm"))).expect("remove");
    common::wait_until("features-schedule stopped", Duration::from_secs(60), || {
        common::metric(&b.manager, "wcm_plugins_loaded", &[]) == 1.0
    })
    .await;

    // 5: traces off, then on (a global subscriber cannot be taken back: last).
    println!("\ntraces:");
    let collector = testenv::Collector::start().expect("collector");
    // What the idle tail of the traced rounds costs by itself.
    let poll0 = b.poll_cpu;
    let cpu0 = cpu_seconds();
    tokio::time::sleep(TRACE_TAIL).await;
    b.snapshot(PROBE);
    let idle = cpu_seconds() - cpu0 - (b.poll_cpu - poll0);
    // Children stay between the rounds: a baseline round returns no set, so nothing is pruned,
    // and every 1-child round after the first is a steady one.
    b.round("(1 child, first)", &[("children", "1")], Duration::ZERO)
        .await;
    let mut traced: Vec<Round> = Vec::new();
    for _ in 0..repeats {
        traced.push(b.round("baseline, traces off", &[], TRACE_TAIL).await);
        traced.push(
            b.round(
                "1 child steady, traces off",
                &[("children", "1")],
                TRACE_TAIL,
            )
            .await,
        );
    }
    let settings = wasm_controller_manager::telemetry::OtlpSettings {
        endpoint: collector.otlp_http_endpoint(),
        service_name: "wcm-bench-features".into(),
        sample_ratio: 1.0,
    };
    // The exporter's blocking HTTP client is made outside the async runtime.
    let (tracing, layer) = std::thread::spawn(move || {
        wasm_controller_manager::telemetry::Tracing::start::<tracing_subscriber::Registry>(
            &settings,
        )
    })
    .join()
    .expect("thread")
    .expect("start the exporter");
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let subscriber = tracing_subscriber::registry().with(layer.with_filter(
            tracing_subscriber::filter::Targets::new().with_target(
                wasm_controller_manager::telemetry::TARGET,
                tracing::Level::TRACE,
            ),
        ));
        tracing::subscriber::set_global_default(subscriber).expect("global subscriber");
    }
    for _ in 0..repeats {
        traced.push(
            b.round(
                "1 child steady, traces on",
                &[("children", "1")],
                TRACE_TAIL,
            )
            .await,
        );
        traced.push(b.round("baseline, traces on", &[], TRACE_TAIL).await);
    }
    let rss_traces = rss_mib();
    std::thread::spawn(move || tracing.shutdown())
        .join()
        .expect("thread");
    let spans = collector.spans().expect("spans");
    let reconcile_spans = spans
        .iter()
        .filter(|s| s.name.starts_with("reconcile"))
        .count();
    println!(
        "  spans received: {} ({} reconcile spans) for {} traced reconciles; RSS with the exporter {:.1} MiB",
        spans.len(),
        reconcile_spans,
        traced
            .iter()
            .filter(|r| r.label.ends_with("traces on"))
            .map(|r| r.reconciles)
            .sum::<f64>(),
        rss_traces
    );
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &spans {
        *names.entry(s.name.as_str()).or_insert(0) += 1;
    }
    println!("  span names: {names:?}");

    // The report.
    let per_primary = |r: &Round| r.cpu / n as f64 * 1e6;
    let per_reconcile = |r: &Round| r.cpu / r.reconciles.max(1.0) * 1e6;
    let of = |label: &str| -> Vec<&Round> { rounds.iter().filter(|r| r.label == label).collect() };
    let base_pp = median(of("baseline").iter().map(|r| per_primary(r)).collect());
    println!();
    println!(
        "| N = {n} primaries, median of {repeats} | CPU per primary | ratio to baseline | CPU per reconcile | reconciles per primary | wall per round | plugin API calls per primary | RSS after |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let row = |label: &str, rs: &[&Round]| {
        let pp = median(rs.iter().map(|r| per_primary(r)).collect());
        let lo = rs
            .iter()
            .map(|r| per_primary(r))
            .fold(f64::INFINITY, f64::min);
        let hi = rs.iter().map(|r| per_primary(r)).fold(0.0, f64::max);
        let calls = calls_per_primary(rs, n);
        println!(
            "| {label} | {pp:.0} µs ({lo:.0}–{hi:.0}) | {:.2}× | {:.0} µs | {:.2} | {:.2} s | {calls} | {:.1} MiB |",
            pp / base_pp,
            median(rs.iter().map(|r| per_reconcile(r)).collect()),
            median(rs.iter().map(|r| r.reconciles / n as f64).collect()),
            median(rs.iter().map(|r| r.wall.as_secs_f64()).collect()),
            rs.last().map(|r| r.rss).unwrap_or(0.0),
        );
    };
    for label in [
        "baseline",
        "metrics",
        "1 child, first",
        "1 child, steady",
        "prune 1 child",
        "3 children, first",
        "3 children, steady",
        "prune 3 children",
    ] {
        row(label, &of(label));
    }
    row("metrics, budget filled (one round)", &[&flood_round]);
    row("schedule tick (one)", &[&schedule_round]);
    for (label, off, on) in [
        (
            "traces: baseline",
            "baseline, traces off",
            "baseline, traces on",
        ),
        (
            "traces: 1 child steady",
            "1 child steady, traces off",
            "1 child steady, traces on",
        ),
    ] {
        let of = |l: &str| -> Vec<&Round> { traced.iter().filter(|r| r.label == l).collect() };
        let (off, on) = (of(off), of(on));
        let pp = |rs: &[&Round]| median(rs.iter().map(|r| per_primary(r)).collect());
        let (off_pp, on_pp) = (pp(&off), pp(&on));
        println!(
            "| {label}, off → on (+6 s idle tail each) | {off_pp:.0} → {on_pp:.0} µs (+{:.0} µs) | {:.2}× → {:.2}× | | | | | {:.1} MiB |",
            on_pp - off_pp,
            off_pp / base_pp,
            on_pp / base_pp,
            on.last().map(|r| r.rss).unwrap_or(0.0)
        );
    }
    println!(
        "idle (no reconcile) for the 6 s tail: {:.1} ms of CPU = {:.0} µs per primary",
        idle * 1e3,
        idle / n as f64 * 1e6
    );
    println!();
    println!("API calls per round (audit log; the plugin's identity):");
    for r in rounds.iter().take(8) {
        println!(
            "  {:<24} {:?}; other identities {}",
            r.label, r.plugin_calls, r.other_calls
        );
    }
    println!(
        "  {:<24} {:?}; other identities {}",
        schedule_round.label, schedule_round.plugin_calls, schedule_round.other_calls
    );
    println!(
        "\nplugin metrics budget: counter series {} → {}; /metrics {} → {} bytes; RSS {:.1} → {:.1} MiB",
        plugin_series(&scrape_before),
        plugin_series(&scrape_after),
        scrape_before.len(),
        scrape_after.len(),
        rss_metrics_before,
        rss_metrics_after
    );
    println!(
        "bench's own metric reads: {:.2} s of thread CPU in all (subtracted per round)",
        b.poll_cpu
    );
    b.manager.stop().await;
    drop(collector);
    let _ = std::fs::remove_dir_all(&base);
}
