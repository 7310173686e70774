//! One plugin's keys across 1, 2, 3 and 4 replicas (issue #28), side by side in one run, against
//! real API servers: the server-side mode (testenv with `ShardedListAndWatch` on: each replica
//! lists and watches only its ranges) and the fallback (a cluster of its own with the gate off:
//! every replica caches every object, the host divides the work).
//!
//! Each replica is a `wasm-controller-manager run` process of this build in a CPU cgroup of its
//! own (`cpu.cfs_quota_us`, as a Pod's CPU limit: `WCM_BENCH_SHARD_CPU` cores each, 0.4 by
//! default, so that four fit in this 2-core machine beside the API server). The plugin is
//! `shard-stamper` with `shards = 12`, doing a fixed amount of CPU work per reconcile
//! (`burn_k`, `WCM_BENCH_SHARD_BURN_K`, 600 by default: about 1 ms, measured and printed) and no
//! write once every object is stamped. The objects are `WCM_BENCH_SHARD_N` ConfigMaps (8,000)
//! with 1 KiB of data each.
//!
//! A round is one NAME.toml change on every replica at once (a version swap: every key of the
//! replica's ranges is reconciled again; a replica sees it at its next rescan, within 2 s).
//! **Throughput at saturation** is the sum over replicas of each replica's reconciles divided by
//! the time it was busy with them (from its first to its last reconcile start of the round, in
//! its log), so a replica that noticed the change later does not count against the others; the
//! rate by the wall clock (every reconcile over the first start to the last, on any replica) is
//! shown beside it; the median of 3 rounds. **RSS** is each replica's resident memory after the
//! rounds, the replicas having been rolled once as a Deployment with a surge rolls its Pods (a new
//! one joins and the split settles, then the oldest stops with SIGTERM, giving its Leases back):
//! the first replica up takes every range until the others join, and would keep that list's
//! high-water mark (shown as the RSS before the roll), while no replica of the rolled set ever
//! holds more than its final share. Its **cache memory** is that less the RSS of one replica with
//! the plugin running before the objects were made.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench sharded`, as
//! root (cgroups), with `WCM_TESTENV_BIN` set (about 20 minutes; prints a report;
//! docs/benchmarks.md keeps the numbers). `WCM_BENCH_SHARD_MODES=server-side` (or `fallback`)
//! runs one half.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{artifact, cpu_seconds_of, granted, rss_mib_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

const SHARDS: usize = 12;
const PLUGIN: &str = "stamper";
const ROUNDS: usize = 3;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

/// One host process in a CPU cgroup of its own.
struct Replica {
    name: String,
    ns: String,
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    cgroup: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        common::terminate(&mut self.child);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// The plugin's settings on one replica; `round` changes them (a version swap).
fn settings(replica: &str, ns: &str, burn_k: u64, round: usize) -> String {
    format!(
        "name = \"{PLUGIN}\"\nnamespaces = [\"{ns}\"]\nshards = {SHARDS}\nworkers = 2\n\
         api_qps = 0\n[config]\nreplica = \"{replica}\"\nburn_k = \"{burn_k}\"\n\
         round = \"{round}\"\n"
    )
}

impl Replica {
    fn start(
        name: &str,
        ns: &str,
        kubeconfig: &Path,
        lease_ns: &str,
        burn_k: u64,
        cpu: f64,
        logs: &Path,
    ) -> Replica {
        let dir =
            std::env::temp_dir().join(format!("wcm-bench-shards-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("plugins dir");
        std::fs::copy(
            artifact("shard_stamper"),
            dir.join(format!("{PLUGIN}.wasm")),
        )
        .expect("plugin");
        std::fs::write(
            dir.join(format!("{PLUGIN}.toml")),
            settings(name, ns, burn_k, 0),
        )
        .expect("settings");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .env("POD_NAME", name)
            // Each reconcile's start, for the rate while busy.
            .env(
                "WCM_LOG",
                "info,wasm_controller_manager::engine::controller=debug",
            )
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--plugins-dir")
            .arg(&dir)
            .args(["--metrics-addr", &addr.to_string()])
            .args(["--rescan-seconds", "2"])
            .args([
                "--leader-elect",
                "--leader-elect-mode",
                "per-plugin",
                "--leader-elect-resource-namespace",
                lease_ns,
                "--leader-elect-lease-duration",
                "6s",
                "--leader-elect-renew-deadline",
                "4s",
                "--leader-elect-retry-period",
                "500ms",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(logs.join(format!("{name}.log"))).expect("log"))
            .spawn()
            .expect("start the host");
        let cgroup = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/wcm-bench-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&cgroup)
            .and_then(|()| {
                std::fs::write(
                    cgroup.join("cpu.cfs_quota_us"),
                    format!("{}", (cpu * 100_000.0) as u64),
                )
            })
            .and_then(|()| std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()))
            .unwrap_or_else(|e| {
                panic!(
                    "a CPU cgroup for {name} ({}): run as root on a cgroup v1 cpu hierarchy: {e}",
                    cgroup.display()
                )
            });
        Replica {
            name: name.to_string(),
            ns: ns.to_string(),
            child,
            addr,
            dir,
            cgroup,
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    async fn get(&self, path: &str) -> Option<String> {
        let url = format!("http://{}{path}", self.addr);
        let body = tokio::task::spawn_blocking(move || {
            let out = Command::new("curl")
                .args(["-sf", "--max-time", "5", &url])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        });
        body.await.ok().flatten()
    }

    /// `(held ranges, cached primaries, filter)` from `/debug/controllers`.
    async fn shards(&self) -> Option<(usize, usize, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&self.get("/debug/controllers").await?).ok()?;
        let p = v["plugins"]
            .as_array()?
            .iter()
            .find(|p| p["file"] == format!("{PLUGIN}.wasm"))?;
        let s = &p["shards"];
        Some((
            s["held"].as_array()?.len(),
            s["cached"].as_u64()? as usize,
            s["filter"].as_str()?.to_string(),
        ))
    }

    /// The plugin's reconciles so far.
    async fn reconciles(&self) -> f64 {
        let text = self.get("/metrics").await.unwrap_or_default();
        testenv::sum_metric(
            &text,
            "controller_runtime_reconcile_total",
            &[("controller", PLUGIN)],
        )
    }
}

/// Waits until the replicas split the 12 ranges evenly and cache them (with the gate, every
/// ConfigMap of the cluster among them; without, every one each: the plugin's stream watches every
/// namespace), and no reconcile ran for 2 s.
async fn settle(replicas: &[Replica], every: &Api<ConfigMap>, gate: bool) {
    // Each at most its share (12 over 5 replicas: four hold 3, one none), and every range held.
    let share = SHARDS.div_ceil(replicas.len());
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut quiet_since = Instant::now();
    let mut last = -1.0;
    loop {
        assert!(Instant::now() < deadline, "the replicas did not settle");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let total = every
            .list_metadata(&Default::default())
            .await
            .expect("list")
            .items
            .len();
        let mut ok = true;
        let mut cached = 0;
        let mut held_all = 0;
        for r in replicas {
            match r.shards().await {
                Some((held, c, filter)) => {
                    ok &= held <= share && filter == if gate { "api-server" } else { "host" };
                    held_all += held;
                    ok &= gate || c == total;
                    cached += c;
                }
                None => ok = false,
            }
        }
        ok &= held_all == SHARDS && (!gate || cached == total);
        let mut done = 0.0;
        for r in replicas {
            done += r.reconciles().await;
        }
        if done != last {
            last = done;
            quiet_since = Instant::now();
        }
        if ok && quiet_since.elapsed() >= Duration::from_secs(2) {
            return;
        }
    }
}

/// Seconds since midnight of a log line's RFC 3339 timestamp (`2026-11-27T11:37:40.989922Z …`).
fn log_time(line: &str) -> Option<f64> {
    let t = line.split_once('T')?.1.split_once('Z')?.0;
    let mut parts = t.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// A replica's reconciles since its latest version swap, from its log: how many started, and the
/// times of the first and the last start.
fn reconciles_since_swap(log: &Path) -> (usize, f64, f64) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let swap = lines
        .iter()
        .rposition(|l| l.contains("new version: replacing in place"))
        .unwrap_or(0);
    let starts: Vec<f64> = lines[swap..]
        .iter()
        .filter(|l| l.contains("reconcile started"))
        .filter_map(|l| log_time(l))
        .collect();
    let first = starts.iter().cloned().fold(f64::INFINITY, f64::min);
    let last = starts.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (starts.len(), first, last)
}

/// The most ranges a replica held at once, from its log (each range's elector logs when it
/// starts and stops leading).
fn most_ranges_held(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let (mut now, mut most) = (0usize, 0usize);
    for l in text.lines().filter(|l| l.contains("-shard-")) {
        if l.contains("not leading: reconciling nothing") {
            now = now.saturating_sub(1);
        } else if l.contains("leading: reconciling") {
            now += 1;
            most = most.max(now);
        }
    }
    most
}

/// One round: every replica's settings change at once. Each replica's rate while busy (its
/// reconciles of the round over the time from its first to its last reconcile start, from its
/// log), and the round's rate by the wall clock (every reconcile over the time from the first
/// start on any replica to the last on any: a replica that noticed the change later counts).
async fn round(
    replicas: &[Replica],
    logs: &Path,
    burn_k: u64,
    r: usize,
    keys: usize,
) -> (Vec<f64>, f64) {
    let before: Vec<f64> = futures::future::join_all(replicas.iter().map(|x| x.reconciles())).await;
    for x in replicas {
        std::fs::write(
            x.dir.join(format!("{PLUGIN}.toml")),
            settings(&x.name, &x.ns, burn_k, r),
        )
        .expect("settings");
    }
    let t0 = Instant::now();
    let mut last = before.clone();
    let mut quiet = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let counts: Vec<f64> =
            futures::future::join_all(replicas.iter().map(|x| x.reconciles())).await;
        if counts != last {
            quiet = Instant::now();
            last = counts.clone();
        }
        let done: f64 = counts.iter().zip(&before).map(|(c, b)| c - b).sum();
        if done >= keys as f64 && quiet.elapsed() >= Duration::from_secs(1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "the round did not end: {done} of {keys}"
        );
    }
    let seen: Vec<(usize, f64, f64)> = replicas
        .iter()
        .map(|x| reconciles_since_swap(&logs.join(format!("{}.log", x.name))))
        .collect();
    let rates = seen
        .iter()
        .map(|(n, a, b)| {
            if b > a {
                (*n as f64 - 1.0) / (b - a)
            } else {
                0.0
            }
        })
        .collect();
    let total: usize = seen.iter().map(|s| s.0).sum();
    let first = seen.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    let end = seen.iter().map(|s| s.2).fold(f64::NEG_INFINITY, f64::max);
    let wall = if end > first {
        (total as f64 - 1.0) / (end - first)
    } else {
        0.0
    };
    (rates, wall)
}

struct Row {
    mode: &'static str,
    replicas: usize,
    throughput: f64,
    wall: f64,
    per_replica: Vec<f64>,
    rss: Vec<f64>,
    /// RSS of the first set of replicas, before the roll.
    before_roll: Vec<f64>,
    cache: Vec<f64>,
    cached: Vec<usize>,
    /// The most ranges each replica held at once (from its log).
    most_held: Vec<usize>,
    cpu_ms: f64,
}

async fn run() {
    let n: usize = env_or("WCM_BENCH_SHARD_N", 8000);
    let cpu: f64 = env_or("WCM_BENCH_SHARD_CPU", 0.4);
    let burn_k: u64 = env_or("WCM_BENCH_SHARD_BURN_K", 600);
    let pad = "x".repeat(1024);
    let mut rows = Vec::new();
    let mut bases = BTreeMap::new();
    // `WCM_BENCH_SHARD_MODES=server-side` (or `fallback`) runs one half only.
    let modes = std::env::var("WCM_BENCH_SHARD_MODES").unwrap_or_default();
    for (mode, gate) in [("server-side", true), ("fallback", false)] {
        if !modes.is_empty() && !modes.split(',').any(|m| m.trim() == mode) {
            continue;
        }
        let args: &[&str] = if gate {
            &[]
        } else {
            &["--sharded-list-and-watch=false"]
        };
        let env = testenv::TestEnv::start_own(args).await.expect("a cluster");
        let client = env.client().await.expect("client");
        let ns = env.namespace("bench-shards").await.expect("namespace");
        let kubeconfig = env.kubeconfig_path().expect("kubeconfig").to_path_buf();
        let logs = std::env::temp_dir().join(format!("wcm-bench-shards-logs-{mode}"));
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).expect("logs");
        let grant_dir = std::env::temp_dir().join(format!("wcm-bench-shards-grant-{mode}"));
        std::fs::create_dir_all(&grant_dir).expect("grant dir");
        std::fs::copy(
            artifact("shard_stamper"),
            grant_dir.join(format!("{PLUGIN}.wasm")),
        )
        .expect("plugin");
        // The settings name the plugin (and so its identity) as the replicas' do.
        std::fs::write(
            grant_dir.join(format!("{PLUGIN}.toml")),
            settings("grant", &ns.name, burn_k, 0),
        )
        .expect("settings");
        granted(&env, &grant_dir).await;
        let every: Api<ConfigMap> = Api::all(client.clone());

        // The memory of a replica running the plugin before the objects exist.
        let leases = env.namespace("bench-leases").await.expect("namespace");
        let base = {
            let one = [Replica::start(
                "base",
                &ns.name,
                &kubeconfig,
                &leases.name,
                burn_k,
                cpu,
                &logs,
            )];
            settle(&one, &every, gate).await;
            rss_mib_of(&one[0].pid())
        };
        bases.insert(mode, base);

        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        let made = Instant::now();
        futures::stream::iter(0..n)
            .map(|i| {
                let cms = cms.clone();
                let pad = pad.clone();
                async move {
                    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": format!("cm-{i:05}")},
                        "data": {"value": "v1", "pad": pad},
                    }))
                    .expect("cm");
                    cms.create(&PostParams::default(), &cm)
                        .await
                        .expect("create");
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        println!("{mode}: {n} ConfigMaps made in {:?}", made.elapsed());

        for k in 1..=4usize {
            let leases = env.namespace("bench-leases").await.expect("namespace");
            let start = |name: &str| {
                Replica::start(
                    name,
                    &ns.name,
                    &kubeconfig,
                    &leases.name,
                    burn_k,
                    cpu,
                    &logs,
                )
            };
            let mut replicas: Vec<Replica> = (0..k).map(|i| start(&format!("r{k}-{i}"))).collect();
            let started = Instant::now();
            settle(&replicas, &every, gate).await;
            // The first replica up takes every range until the others join, and keeps the
            // high-water mark of that list (read here). The replicas are then rolled as a
            // Deployment with a surge rolls its Pods: a new one joins, the split settles, then the
            // oldest stops (SIGTERM: its Leases given back, its membership left). No replica of
            // the rolled set ever holds more than its final share.
            let before_roll: Vec<f64> = replicas.iter().map(|r| rss_mib_of(&r.pid())).collect();
            if k > 1 {
                for i in 0..k {
                    replicas.push(start(&format!("r{k}-{i}-rolled")));
                    settle(&replicas, &every, gate).await;
                    // SIGTERM and a wait for its exit: off the runtime's threads.
                    let oldest = replicas.remove(0);
                    tokio::task::spawn_blocking(move || drop(oldest))
                        .await
                        .expect("the oldest replica stopped");
                    settle(&replicas, &every, gate).await;
                }
            }
            println!(
                "{mode}, {k} replicas: settled (rolled once) after {:?}; RSS before the roll {before_roll:.1?} MiB",
                started.elapsed()
            );
            let cpu0: f64 = replicas.iter().map(|r| cpu_seconds_of(&r.pid())).sum();
            let mut results = Vec::new();
            let mut reconciled = 0.0;
            for r in 1..=ROUNDS {
                let before: f64 =
                    futures::future::join_all(replicas.iter().map(|x| x.reconciles()))
                        .await
                        .iter()
                        .sum();
                let (rates, wall) = round(&replicas, &logs, burn_k, r, n).await;
                let after: f64 = futures::future::join_all(replicas.iter().map(|x| x.reconciles()))
                    .await
                    .iter()
                    .sum();
                reconciled += after - before;
                let busy: f64 = rates.iter().sum();
                println!(
                    "{mode}, {k} replicas, round {r}: {busy:.0}/s busy ({rates:.0?}), {wall:.0}/s by the wall clock"
                );
                results.push((busy, wall, rates));
            }
            let cpu1: f64 = replicas.iter().map(|r| cpu_seconds_of(&r.pid())).sum();
            results.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (throughput, wall, per_replica) = results[ROUNDS / 2].clone();
            let rss: Vec<f64> = replicas.iter().map(|r| rss_mib_of(&r.pid())).collect();
            let mut cached = Vec::new();
            for r in &replicas {
                cached.push(r.shards().await.map_or(0, |s| s.1));
            }
            let most_held = replicas
                .iter()
                .map(|r| most_ranges_held(&logs.join(format!("{}.log", r.name))))
                .collect();
            rows.push(Row {
                mode,
                replicas: k,
                throughput,
                wall,
                per_replica,
                cache: rss.iter().map(|r| r - base).collect(),
                rss,
                before_roll,
                cached,
                most_held,
                // Everything the replicas spent in the rounds (settings reloads and idle ticks
                // included), per reconcile.
                cpu_ms: (cpu1 - cpu0) * 1000.0 / reconciled.max(1.0),
            });
        }
    }

    println!(
        "\n{n} ConfigMaps (1 KiB of data each), shards = 12, burn_k = {burn_k}, {cpu} CPU per replica; base RSS (one replica, the plugin running, no object): {bases:.1?} MiB\n"
    );
    println!(
        "| mode | replicas | throughput while busy /s | × 1 replica | by the wall clock /s | per replica /s | CPU per reconcile | RSS per replica MiB | cache MiB per replica | largest cache ÷ 1 replica's | primaries cached | most ranges held at once | RSS before the roll MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut one: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let join = |v: &[String]| v.join(" / ");
    let mib = |v: &[f64]| join(&v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>());
    for r in &rows {
        let cache = r.cache.iter().cloned().fold(0.0, f64::max);
        let (t1, c1) = *one.entry(r.mode).or_insert((r.throughput, cache));
        println!(
            "| {} | {} | {:.0} | {:.2}× | {:.0} | {} | {:.2} ms | {} | {} | {:.2} | {} | {} | {} |",
            r.mode,
            r.replicas,
            r.throughput,
            r.throughput / t1,
            r.wall,
            join(
                &r.per_replica
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
            ),
            r.cpu_ms,
            mib(&r.rss),
            mib(&r.cache),
            cache / c1,
            join(&r.cached.iter().map(|x| x.to_string()).collect::<Vec<_>>()),
            join(
                &r.most_held
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
            ),
            mib(&r.before_roll),
        );
    }
}
