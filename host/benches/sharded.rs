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
//! replica's ranges is reconciled again). **Throughput at saturation** is the sum over replicas
//! of each replica's reconciles divided by the time it was busy with them (its first to its last
//! reconcile of the round, read from its `controller_runtime_reconcile_total` every 50 ms), so a
//! replica that noticed the change later does not count against the others; the median of 3
//! rounds. **RSS** is each replica's resident memory after the rounds; its **cache memory** is
//! that less the RSS of one replica with the plugin running before the objects were made.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench sharded`, as
//! root (cgroups), with `WCM_TESTENV_BIN` set (about 12 minutes; prints a report;
//! docs/benchmarks.md keeps the numbers).

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
            .env("RUST_LOG", "wasm_controller_manager=info")
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

/// Waits until the replicas split the 12 ranges evenly and cache them (with the gate, `total`
/// objects among them; without, `total` each), and no reconcile ran for 2 s.
async fn settle(replicas: &[Replica], total: usize, gate: bool) {
    let share = SHARDS / replicas.len();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut quiet_since = Instant::now();
    let mut last = -1.0;
    loop {
        assert!(Instant::now() < deadline, "the replicas did not settle");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut ok = true;
        let mut cached = 0;
        for r in replicas {
            match r.shards().await {
                Some((held, c, filter)) => {
                    ok &= held == share && filter == if gate { "api-server" } else { "host" };
                    ok &= gate || c == total;
                    cached += c;
                }
                None => ok = false,
            }
        }
        ok &= !gate || cached == total;
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

/// One round: every replica's settings change at once; each replica's reconciles and the time it
/// was busy with them.
async fn round(replicas: &[Replica], burn_k: u64, r: usize, keys: usize) -> Vec<(f64, f64)> {
    let before: Vec<f64> = futures::future::join_all(replicas.iter().map(|x| x.reconciles())).await;
    for x in replicas {
        std::fs::write(
            x.dir.join(format!("{PLUGIN}.toml")),
            settings(&x.name, &x.ns, burn_k, r),
        )
        .expect("settings");
    }
    let t0 = Instant::now();
    let mut first: Vec<Option<Instant>> = vec![None; replicas.len()];
    let mut last_change: Vec<Instant> = vec![t0; replicas.len()];
    let mut now_count = before.clone();
    let mut quiet = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let counts: Vec<f64> =
            futures::future::join_all(replicas.iter().map(|x| x.reconciles())).await;
        let at = Instant::now();
        for (i, c) in counts.iter().enumerate() {
            if *c != now_count[i] {
                if first[i].is_none() {
                    // Its first reconcile of the round happened within the last poll.
                    first[i] = Some(at - Duration::from_millis(25));
                }
                last_change[i] = at;
                now_count[i] = *c;
                quiet = at;
            }
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
    (0..replicas.len())
        .map(|i| {
            let n = now_count[i] - before[i];
            let busy = first[i].map_or(0.0, |f| (last_change[i] - f).as_secs_f64());
            (n, busy)
        })
        .collect()
}

struct Row {
    mode: &'static str,
    replicas: usize,
    throughput: f64,
    per_replica: Vec<f64>,
    rss: Vec<f64>,
    cache: Vec<f64>,
    cached: Vec<usize>,
    cpu_ms: f64,
}

async fn run() {
    let n: usize = env_or("WCM_BENCH_SHARD_N", 8000);
    let cpu: f64 = env_or("WCM_BENCH_SHARD_CPU", 0.4);
    let burn_k: u64 = env_or("WCM_BENCH_SHARD_BURN_K", 600);
    let pad = "x".repeat(1024);
    let mut rows = Vec::new();
    for (mode, gate) in [("server-side", true), ("fallback", false)] {
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
        std::fs::create_dir_all(&logs).expect("logs");
        let grant_dir = std::env::temp_dir().join(format!("wcm-bench-shards-grant-{mode}"));
        std::fs::create_dir_all(&grant_dir).expect("grant dir");
        std::fs::copy(
            artifact("shard_stamper"),
            grant_dir.join(format!("{PLUGIN}.wasm")),
        )
        .expect("plugin");
        granted(&env, &grant_dir).await;
        let every: Api<ConfigMap> = Api::all(client.clone());
        let count = || async {
            every
                .list_metadata(&Default::default())
                .await
                .expect("list")
                .items
                .len()
        };

        // The memory of a replica running the plugin before the objects exist.
        let leases = env.namespace("bench-leases").await.expect("namespace");
        let base = {
            let r = Replica::start(
                "base",
                &ns.name,
                &kubeconfig,
                &leases.name,
                burn_k,
                cpu,
                &logs,
            );
            let one = [r];
            settle(&one, count().await, gate).await;
            rss_mib_of(&one[0].pid())
        };

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
        let total = count().await;

        for k in 1..=4usize {
            let leases = env.namespace("bench-leases").await.expect("namespace");
            let replicas: Vec<Replica> = (0..k)
                .map(|i| {
                    Replica::start(
                        &format!("r{k}-{i}"),
                        &ns.name,
                        &kubeconfig,
                        &leases.name,
                        burn_k,
                        cpu,
                        &logs,
                    )
                })
                .collect();
            let started = Instant::now();
            settle(&replicas, total, gate).await;
            println!(
                "{mode}, {k} replicas: settled after {:?}",
                started.elapsed()
            );
            let cpu0: f64 = replicas.iter().map(|r| cpu_seconds_of(&r.pid())).sum();
            let mut results = Vec::new();
            let mut reconciled = 0.0;
            for r in 1..=ROUNDS {
                let per = round(&replicas, burn_k, r, n).await;
                reconciled += per.iter().map(|(c, _)| c).sum::<f64>();
                let tput: f64 = per
                    .iter()
                    .map(|(c, b)| if *b > 0.0 { c / b } else { 0.0 })
                    .sum();
                println!("{mode}, {k} replicas, round {r}: {tput:.0}/s ({per:?})");
                results.push((tput, per));
            }
            let cpu1: f64 = replicas.iter().map(|r| cpu_seconds_of(&r.pid())).sum();
            results.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (throughput, per) = results[ROUNDS / 2].clone();
            let rss: Vec<f64> = replicas.iter().map(|r| rss_mib_of(&r.pid())).collect();
            let mut cached = Vec::new();
            for r in &replicas {
                cached.push(r.shards().await.map_or(0, |s| s.1));
            }
            rows.push(Row {
                mode,
                replicas: k,
                throughput,
                per_replica: per
                    .iter()
                    .map(|(c, b)| if *b > 0.0 { c / b } else { 0.0 })
                    .collect(),
                cache: rss.iter().map(|r| r - base).collect(),
                rss,
                cached,
                // Everything the replicas spent in the rounds (settings reloads and idle ticks
                // included), per reconcile.
                cpu_ms: (cpu1 - cpu0) * 1000.0 / reconciled.max(1.0),
            });
            drop(replicas);
        }
        println!("{mode}: base RSS {base:.1} MiB (one replica, the plugin running, no object)");
    }

    println!(
        "\n{n} ConfigMaps (1 KiB each), shards = 12, burn_k = {burn_k}, {cpu} CPU per replica\n"
    );
    println!(
        "| mode | replicas | throughput /s | × 1 replica | per replica /s | CPU per reconcile | RSS per replica MiB | cache MiB per replica | × 1 replica's cache | primaries cached |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut one: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for r in &rows {
        let cache = r.cache.iter().cloned().fold(0.0, f64::max);
        let (t1, c1) = *one.entry(r.mode).or_insert((r.throughput, cache));
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "| {} | {} | {:.0} | {:.2}× | {} | {:.2} ms | {} | {} | {:.2} | {} |",
            r.mode,
            r.replicas,
            r.throughput,
            r.throughput / t1,
            fmt(&r.per_replica),
            r.cpu_ms,
            r.rss
                .iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            r.cache
                .iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            cache / c1,
            r.cached
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
        );
    }
}
