//! Shared by the benchmarks: this process's CPU time and memory, the compiled plugins, metric
//! reads, and a plugins directory granted its generated RBAC on the test cluster.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wasm_controller_manager::app::{Manager, RunConfig};
use wasm_controller_manager::cluster::discovery::Discovery;
use wasm_controller_manager::cluster::identity::IdentitySettings;
use wasm_controller_manager::cluster::rbac as rbac_gen;
use wasm_controller_manager::cluster::services::BudgetSettings;
use wasm_controller_manager::engine::rate_limit::RateLimits;
use wasm_controller_manager::loading::rbac;
use wasm_controller_manager::sandbox::Limits;

/// utime+stime of this process, seconds.
pub fn cpu_seconds() -> f64 {
    cpu_seconds_of("self")
}

/// utime+stime of a process (`"self"` or a pid), seconds.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the command name: state is field 0; utime 11, stime 12 (clock ticks, 100 Hz).
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident memory of this process, MiB.
pub fn rss_mib() -> f64 {
    rss_mib_of("self")
}

/// Resident memory of a process (`"self"` or a pid), MiB.
pub fn rss_mib_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// Stops a host process as a kubelet does: SIGTERM, then up to 30 s for it to drain and exit,
/// then SIGKILL.
pub fn terminate(child: &mut std::process::Child) {
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A compiled plugin from `scripts/build-plugins`.
pub fn artifact(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = std::env::var_os("WCM_PLUGIN_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("wasm32-wasip2/plugin"));
    [
        dir.join("examples").join(format!("{name}.wasm")),
        dir.join(format!("{name}.wasm")),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| {
        panic!(
            "no {name}.wasm under {}: run scripts/build-plugins first",
            dir.display()
        )
    })
}

/// The native baseline: a kube-runtime `Controller` over every Pod with a no-op reconcile that
/// counts its calls in `count`.
pub fn native_noop_controller(
    client: kube::Client,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> impl std::future::Future<Output = ()> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::controller::{Action, Controller};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    Controller::new(
        kube::Api::<Pod>::all(client),
        kube::runtime::watcher::Config::default(),
    )
    .run(
        |_pod: Arc<Pod>, ctx: Arc<AtomicUsize>| async move {
            ctx.fetch_add(1, Ordering::Relaxed);
            Ok::<_, kube::Error>(Action::await_change())
        },
        |_pod, _err, _ctx| Action::requeue(Duration::from_secs(1)),
        count,
    )
    .for_each(|_| async {})
}

/// The benchmarks' Pod: one container with env and resources (a typical small Pod).
pub fn pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "load"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/bench:1",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .expect("static pod")
}

/// Creates one Pod, retrying a few times (the API server on 2 shared cores sometimes times out).
pub async fn create_pod(api: &kube::Api<k8s_openapi::api::core::v1::Pod>, name: &str) {
    for attempt in 0..5 {
        match api.create(&Default::default(), &pod(name)).await {
            Ok(_) => return,
            Err(e) if attempt < 4 => {
                eprintln!("create {name}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create {name}: {e}"),
        }
    }
}

/// Creates `n` Pods named `prefix-i` with `concurrency` requests in flight; returns the wall time.
pub async fn create_pods(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> Duration {
    use futures::StreamExt;
    let api = kube::Api::namespaced(client.clone(), ns);
    let start = std::time::Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { create_pod(&api, &format!("{prefix}-{i}")).await }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    start.elapsed()
}

/// Polls `f` every 20 ms until it holds; panics after `timeout`. Returns the time it took.
pub async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// A metric's value summed over the series whose labels include all of `labels`.
pub fn metric(m: &Manager, name: &str, labels: &[(&str, &str)]) -> f64 {
    testenv::sum_metric(&m.metrics.encode(), name, labels)
}

/// Where the benchmarks keep compiled plugins.
pub const COMPILE_CACHE: &str = "wcm-bench-compile-cache";

/// The host's configuration for the test cluster, after granting the plugins in `dir` the RBAC
/// generated from their declarations (as an operator would apply it).
pub async fn granted(env: &testenv::TestEnv, dir: &Path) -> kube::Config {
    let client = env.client().await.expect("client");
    let plugins: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .collect();
    let discovery = Discovery::new(client.clone(), Duration::from_secs(10));
    let req = rbac::RbacRequest {
        compile_cache: Some(std::env::temp_dir().join(COMPILE_CACHE)),
        plugins,
        identity: IdentitySettings::default(),
        host_service_account: None,
        // The bench plays the operator of its own test plugins, which act in its namespaces.
        allow: rbac_gen::Allowances {
            all_namespaces: rbac_gen::Allow::every(),
            risky: rbac_gen::Allow::every(),
        },
    };
    let out = rbac::generate(&req, Some(&discovery)).await.expect("rbac");
    rbac::apply(&client, &out.objects)
        .await
        .expect("apply rbac");
    let path = env.kubeconfig_path().expect("kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config")
}

/// A quantile from a Prometheus histogram's cumulative buckets (linear within a bucket).
pub fn histogram_quantile(exposition: &str, name: &str, label: &str, q: f64) -> f64 {
    let mut buckets: Vec<(f64, f64)> = exposition
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(label))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total <= 0.0 {
        return f64::NAN;
    }
    let target = q * total;
    let mut prev = (0.0, 0.0);
    for (le, c) in buckets {
        if c >= target {
            if !le.is_finite() {
                return prev.0;
            }
            let frac = if c > prev.1 {
                (target - prev.1) / (c - prev.1)
            } else {
                1.0
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    prev.0
}

/// The histogram `name` of `after` with the counts of `before` subtracted (new samples only).
pub fn diff_histogram(before: &str, after: &str, name: &str) -> String {
    let counts = |text: &str| -> HashMap<String, f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket")))
            .filter_map(|l| {
                let (series, v) = l.rsplit_once(' ')?;
                Some((series.to_string(), v.parse().ok()?))
            })
            .collect()
    };
    let b = counts(before);
    counts(after)
        .into_iter()
        .map(|(series, v)| format!("{series} {}\n", v - b.get(&series).copied().unwrap_or(0.0)))
        .collect()
}

/// The host's settings in the benchmarks: the CLI's defaults, without an HTTP server or a per-plugin
/// API budget (the benchmarks measure the engine, not that budget).
pub fn bench_config(dir: &Path) -> RunConfig {
    RunConfig {
        plugin_objects: None,
        kubeconfig: None,
        plugins_dir: dir.to_path_buf(),
        compile_cache: Some(std::env::temp_dir().join(COMPILE_CACHE)),
        // Shared by every test (many variants of the same plugins): never trimmed here.
        compile_cache_max_mb: 1 << 20,
        metrics_addr: None,
        kube_qps: 50.0,
        kube_burst: 100,
        api_timeout: Duration::from_secs(30),
        default_workers: 2,
        limits: Limits::default(),
        max_instances: 64,
        max_plugin_bytes: 64 << 20,
        rescan: Duration::from_secs(30),
        allowed_hosts: vec![],
        event_qps: 20.0,
        event_burst: 50,
        identity: IdentitySettings::default(),
        budgets: BudgetSettings {
            api_qps: 0.0,
            ..BudgetSettings::default()
        },
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
