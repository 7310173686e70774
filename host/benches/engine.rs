//! The engine against the real test cluster (testenv), in one run:
//! 1. 2,000 Pods created; time until a no-op wasm plugin has reconciled all of them, next to the
//!    same logic as a native kube-runtime `Controller`; CPU time per event (utime+stime of this
//!    process, less a phase where only the load generator runs) and resident memory.
//! 2. Event-to-reconcile latency p50/p99 at a steady 50 Pods/s (from the queue-duration histogram).
//! 3. Heap bytes of the cache for 10,000 Pods: ours (full objects, and metadata-only) next to a
//!    kube-runtime reflector store of the same Pods (a counting allocator measures live bytes).
//! 4. pod-counter with 10,000 Pods: time until the label converges, and event writes per second.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench engine`
//! (about 5 minutes; prints a report; docs/benchmarks.md keeps the numbers).

mod common;

use common::{
    artifact, cpu_seconds, create_pods, diff_histogram, granted, histogram_quantile, metric, pod,
    rss_mib, wait_until,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use wasm_controller_manager::app::Manager;
use wasm_controller_manager::engine::informer::{InformerKey, Informers};
use wasm_controller_manager::metrics::Metrics;

/// Counts live heap bytes.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static ALLOC: Counting = Counting;

fn live_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    const PODS: usize = 2000;
    const CONCURRENCY: usize = 32;
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    let client = env.client().await.expect("client");
    println!(
        "machine: {} cores; pods per phase: {PODS}; create concurrency {CONCURRENCY}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    // Phase 0: the load generator alone, for the CPU baseline.
    let ns0 = env.namespace("bench-load").await.expect("ns").name;
    let cpu = cpu_seconds();
    let load_wall = create_pods(&client, &ns0, "p", PODS, CONCURRENCY).await;
    let load_cpu = cpu_seconds() - cpu;
    println!(
        "load only: {PODS} pods created in {:.2} s ({:.0}/s), {:.2} s CPU",
        load_wall.as_secs_f64(),
        PODS as f64 / load_wall.as_secs_f64(),
        load_cpu
    );

    // Phase 1: the wasm no-op plugin, watching this namespace's pods only.
    let ns1 = env.namespace("bench-wasm").await.expect("ns").name;
    let dir = std::env::temp_dir().join(format!("wcm-bench-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::copy(artifact("noop"), dir.join("noop.wasm")).expect("copy noop");
    let manager = Manager::start(common::bench_config(&dir), granted(env, &dir).await)
        .await
        .expect("manager");
    // The plugin watches all namespaces: phase 0's pods are reconciled first, outside the timing.
    let base = PODS as f64;
    wait_until("initial reconciles", Duration::from_secs(120), || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "noop")],
        ) >= base
    })
    .await;
    let rss0 = rss_mib();
    let cpu = cpu_seconds();
    let start = Instant::now();
    let load = tokio::spawn({
        let (c, ns) = (client.clone(), ns1.clone());
        async move { create_pods(&c, &ns, "p", PODS, CONCURRENCY).await }
    });
    wait_until("wasm reconciles", Duration::from_secs(300), || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "noop")],
        ) >= base + PODS as f64
    })
    .await;
    let wasm_wall = start.elapsed();
    let _ = load.await;
    let wasm_cpu = cpu_seconds() - cpu;
    let wasm_rss = rss_mib();
    manager.stop().await;

    // Phase 2: the same no-op as a native kube-runtime Controller.
    let ns2 = env.namespace("bench-native").await.expect("ns").name;
    let count = Arc::new(AtomicUsize::new(0));
    let ctl = tokio::spawn(common::native_noop_controller(
        client.clone(),
        count.clone(),
    ));
    let already = 2 * PODS;
    wait_until("native initial sync", Duration::from_secs(120), || {
        count.load(Ordering::Relaxed) >= already
    })
    .await;
    let rss1 = rss_mib();
    let cpu = cpu_seconds();
    let start = Instant::now();
    let load = tokio::spawn({
        let (c, ns) = (client.clone(), ns2.clone());
        async move { create_pods(&c, &ns, "p", PODS, CONCURRENCY).await }
    });
    wait_until("native reconciles", Duration::from_secs(300), || {
        count.load(Ordering::Relaxed) >= already + PODS
    })
    .await;
    let native_wall = start.elapsed();
    let _ = load.await;
    let native_cpu = cpu_seconds() - cpu;
    let native_rss = rss_mib();
    ctl.abort();

    println!();
    println!(
        "| 2,000 pods created → all reconciled | wall | throughput | CPU per event (less load generator) | RSS after |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| wasm no-op plugin (fresh instance per call) | {:.2} s | {:.0}/s | {:.0} µs | {:.0} MiB (+{:.0}) |",
        wasm_wall.as_secs_f64(),
        PODS as f64 / wasm_wall.as_secs_f64(),
        (wasm_cpu - load_cpu).max(0.0) / PODS as f64 * 1e6,
        wasm_rss,
        wasm_rss - rss0
    );
    println!(
        "| native kube-runtime Controller | {:.2} s | {:.0}/s | {:.0} µs | {:.0} MiB (+{:.0}) |",
        native_wall.as_secs_f64(),
        PODS as f64 / native_wall.as_secs_f64(),
        (native_cpu - load_cpu).max(0.0) / PODS as f64 * 1e6,
        native_rss,
        native_rss - rss1
    );
    println!(
        "| ratio native wall / wasm wall | {:.2} | | | |",
        native_wall.as_secs_f64() / wasm_wall.as_secs_f64()
    );

    // Phase 3: latency at a steady 50 pods/s.
    let ns3 = env.namespace("bench-latency").await.expect("ns").name;
    let manager = Manager::start(common::bench_config(&dir), granted(env, &dir).await)
        .await
        .expect("manager");
    wait_until("initial reconciles", Duration::from_secs(120), || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "noop")],
        ) >= (3 * PODS) as f64
    })
    .await;
    let before = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "noop")],
    );
    // A fresh histogram: the initial sync's adds are in it; subtract by using only new samples.
    let exposition_before = manager.metrics.encode();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns3);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for i in 0..500 {
        tick.tick().await;
        let api = api.clone();
        tokio::spawn(async move {
            api.create(&PostParams::default(), &pod(&format!("l-{i}")))
                .await
        });
    }
    wait_until("latency pods reconciled", Duration::from_secs(120), || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "noop")],
        ) >= before + 500.0
    })
    .await;
    let exposition = diff_histogram(
        &exposition_before,
        &manager.metrics.encode(),
        "workqueue_queue_duration_seconds",
    );
    let p50 = histogram_quantile(
        &exposition,
        "workqueue_queue_duration_seconds",
        "name=\"noop\"",
        0.50,
    );
    let p99 = histogram_quantile(
        &exposition,
        "workqueue_queue_duration_seconds",
        "name=\"noop\"",
        0.99,
    );
    let r50 = histogram_quantile(
        &manager.metrics.encode(),
        "controller_runtime_reconcile_time_seconds",
        "controller=\"noop\"",
        0.50,
    );
    println!();
    println!("| steady 50 pods/s, 500 pods | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| watch event → reconcile start (queue duration) | {:.2} ms | {:.2} ms |",
        p50 * 1e3,
        p99 * 1e3
    );
    println!(
        "| reconcile (wasm call, whole) p50 | {:.3} ms | |",
        r50 * 1e3
    );
    manager.stop().await;

    // Phase 4: the cache for 10,000 pods.
    let existing = 3 * PODS + 500;
    let ns4 = env.namespace("bench-cache").await.expect("ns").name;
    let more = 10_000usize.saturating_sub(existing);
    let t = create_pods(&client, &ns4, "c", more, CONCURRENCY).await;
    println!();
    println!(
        "created {more} more pods in {:.1} s; cluster has {} pods",
        t.as_secs_f64(),
        existing + more
    );
    let informers = Informers::new(client.clone(), Metrics::new());
    let key = |metadata_only| InformerKey {
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        plural: "pods".into(),
        namespace: None,
        label_selector: None,
        metadata_only,
        shard: None,
    };
    let measure = |label: &'static str, bytes: f64, n: usize| {
        println!(
            "| {label} | {n} | {bytes:.1} MiB | {:.0} B |",
            bytes * (1 << 20) as f64 / n as f64
        )
    };
    println!("| cache of all pods | objects | live heap | per object |");
    println!("|---|---|---|---|");
    for metadata_only in [false, true] {
        let before = live_mib();
        let informer = informers.acquire(key(metadata_only));
        informer.wait_synced().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = informer.store().len();
        measure(
            if metadata_only {
                "ours, metadata only (JSON, stripped)"
            } else {
                "ours, full objects (JSON, stripped)"
            },
            live_mib() - before,
            n,
        );
        drop(informer);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = live_mib();
    let (reader, writer) = reflector::store::<Pod>();
    let refl = tokio::spawn(
        reflector(
            writer,
            watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
        )
        .applied_objects()
        .try_for_each(|_| async { Ok(()) }),
    );
    reader.wait_until_ready().await.expect("reflector ready");
    tokio::time::sleep(Duration::from_secs(1)).await;
    measure(
        "kube-runtime reflector store (typed Pod)",
        live_mib() - before,
        reader.state().len(),
    );
    refl.abort();
    drop(reader);

    // Phase 5: pod-counter with all these pods.
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "bench-cp", "labels": {"node-role.kubernetes.io/control-plane": ""}}})).expect("node");
    let _ = nodes.create(&PostParams::default(), &node).await;
    let pc_dir = std::env::temp_dir().join(format!("wcm-bench-pc-{}", std::process::id()));
    std::fs::create_dir_all(&pc_dir).expect("dir");
    std::fs::copy(artifact("pod_counter"), pc_dir.join("pod_counter.wasm")).expect("copy");
    let total = Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    let start = Instant::now();
    let manager = Manager::start(common::bench_config(&pc_dir), granted(env, &pc_dir).await)
        .await
        .expect("manager");
    let mut converged = None;
    while start.elapsed() < Duration::from_secs(300) {
        let label = nodes
            .get("bench-cp")
            .await
            .ok()
            .and_then(|n| n.metadata.labels?.get("hopegi/pod-count").cloned());
        if label.as_deref() == Some(total.to_string().as_str()) {
            converged = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written0 = metric(
        &manager,
        "wcm_events_written_total",
        &[("plugin", "pod-counter")],
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let written1 = metric(
        &manager,
        "wcm_events_written_total",
        &[("plugin", "pod-counter")],
    );
    let dropped = metric(
        &manager,
        "wcm_events_dropped_total",
        &[("plugin", "pod-counter")],
    );
    let reconciles = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "pod-counter")],
    );
    println!();
    println!("| pod-counter, {total} pods | value |");
    println!("|---|---|");
    println!(
        "| manager start → label = {total} | {} |",
        converged
            .map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| "not within 300 s".into())
    );
    println!(
        "| event writes per second over the next 60 s | {:.1} |",
        (written1 - written0) / 60.0
    );
    println!("| event writes in all | {written1} |");
    println!("| events dropped (queue full / spam filter) | {dropped} |");
    println!("| reconciles | {reconciles} |");
    manager.stop().await;
}
