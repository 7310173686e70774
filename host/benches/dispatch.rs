//! Sandbox costs, measured in one process so the ratios are fair:
//! - per-reconcile dispatch of an 8.7 KB Pod to a typed guest (fresh instance per call, the default),
//!   against native serde_json parsing of the same Pod into k8s-openapi's Pod (with and without
//!   dropping it: the guest's call drops its Pod, the plain parse does not);
//! - instantiation from the InstancePre (no call), and the drop of that instance (the reset of its
//!   pooled memory);
//! - marginal resident memory per loaded idle plugin;
//! - start-up time with 10 precompiled plugins.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench dispatch`
//! (prints a table; docs/benchmarks.md keeps the numbers).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use wasm_controller_manager::cluster::services::Services;
use wasm_controller_manager::contract::{ObjectKey, Request};
use wasm_controller_manager::sandbox::{Limits, MemoryReset, Runtime, RuntimeSettings};

const POD: &str = include_str!("fixtures/pod.json");

fn artifact(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = std::env::var_os("WCM_PLUGIN_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("wasm32-wasip2/plugin"));
    let file = format!("{}.wasm", name.replace('-', "_"));
    for c in [dir.join("examples").join(&file), dir.join(&file)] {
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "no {name}.wasm under {}: run scripts/build-plugins first",
        dir.display()
    );
}

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cache = std::env::temp_dir().join(format!("wcm-bench-cache-{}", std::process::id()));
    let runtime = Arc::new(
        Runtime::new(RuntimeSettings {
            compile_cache: Some(cache.clone()),
            max_instances: 64,
            max_memory: 64 << 20,
            keep_resident: std::env::var("BENCH_KEEP_RESIDENT_KIB")
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .map_or(RuntimeSettings::default().keep_resident, |k| k << 10),
            memory_reset: match std::env::var("BENCH_MEMORY_RESET").as_deref() {
                Ok("memset") => MemoryReset::Memset,
                _ => MemoryReset::Auto,
            },
            ..RuntimeSettings::default()
        })
        .expect("engine"),
    );
    println!("memory reset: {}", runtime.memory_reset());
    let typed = std::fs::read(artifact("typed-pod-noop")).expect("read typed-pod-noop");
    let compiled = runtime.compile(&typed).expect("compile");
    let services = Arc::new(Services::for_describe("bench", BTreeMap::new()));
    let limits = Limits::default();
    let req = Request {
        key: ObjectKey {
            namespace: Some("production".into()),
            name: "web".into(),
        },
        object: Some(POD.to_string()),
        attempt: 0,
        scheduled: None,
    };

    // Native baseline: what a Rust controller pays to turn the cached JSON into a typed Pod; and
    // the same with the Pod dropped inside the timing, as the guest's call does.
    let native = native_parse(iterations, false);
    let native_drop = native_parse(iterations, true);
    // Wasm: the whole dispatch — fresh instance, the Pod JSON copied in, typed parse, result back.
    let mut wasm = Vec::with_capacity(iterations);
    rt.block_on(async {
        for _ in 0..200 {
            let _ = runtime
                .reconcile(&compiled, services.clone(), &limits, &req)
                .await;
        }
        for _ in 0..iterations {
            let t = Instant::now();
            let r = runtime
                .reconcile(&compiled, services.clone(), &limits, &req)
                .await;
            wasm.push(t.elapsed());
            assert!(matches!(r, Ok(Ok(_))), "reconcile failed: {r:?}");
        }
    });
    // The same with a warm instance per worker (isolation = "worker"), for comparison.
    let mut warm_times = Vec::with_capacity(iterations);
    rt.block_on(async {
        let mut slot = None;
        for _ in 0..iterations {
            let t = Instant::now();
            let r = runtime
                .reconcile_warm(&compiled, services.clone(), &limits, &req, &mut slot)
                .await;
            warm_times.push(t.elapsed());
            assert!(matches!(r, Ok(Ok(_))), "reconcile failed: {r:?}");
        }
    });
    // Instantiation alone, and the drop of the instance.
    let mut inst = Vec::with_capacity(iterations);
    let mut dropped = Vec::with_capacity(iterations);
    rt.block_on(async {
        for _ in 0..iterations {
            let (made, gone) = runtime
                .instantiate_only(&compiled, services.clone(), &limits)
                .await
                .expect("instantiate");
            inst.push(made);
            dropped.push(gone);
        }
    });
    let (n50, n99) = percentiles(native);
    let (d50, d99) = percentiles(native_drop);
    let (x50, x99) = percentiles(dropped);
    let (w50, w99) = percentiles(wasm);
    let (i50, i99) = percentiles(inst);
    let (h50, h99) = percentiles(warm_times);

    // Marginal memory of loaded, idle plugins (compiled + linked, from the precompiled cache).
    let pod_counter = std::fs::read(artifact("pod_counter")).unwrap_or_else(|_| typed.clone());
    let variants: Vec<Vec<u8>> = (0..10u8)
        .map(|i| with_custom_section(&pod_counter, i))
        .collect();
    for v in &variants {
        runtime.compile(v).expect("warm the cache");
    }
    let before = rss_kib();
    let start = Instant::now();
    let loaded: Vec<_> = variants
        .iter()
        .map(|v| runtime.compile(v).expect("load"))
        .collect();
    let startup = start.elapsed();
    let after = rss_kib();
    assert!(loaded.iter().all(|c| c.from_cache));
    let per_plugin_kib = (after.saturating_sub(before)) as f64 / loaded.len() as f64;

    println!("pod JSON: {} bytes; {iterations} iterations", POD.len());
    println!("| measurement | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| native serde_json → k8s-openapi Pod | {} | {} |",
        us(n50),
        us(n99)
    );
    println!(
        "| native serde_json → k8s-openapi Pod, then dropped | {} | {} |",
        us(d50),
        us(d99)
    );
    println!(
        "| wasm dispatch, typed guest, fresh instance | {} | {} |",
        us(w50),
        us(w99)
    );
    println!(
        "| ratio wasm / native (p50) | {:.2}× | |",
        w50.as_secs_f64() / n50.as_secs_f64()
    );
    println!(
        "| ratio wasm / native with the drop (p50) | {:.2}× | |",
        w50.as_secs_f64() / d50.as_secs_f64()
    );
    println!(
        "| wasm dispatch, typed guest, warm instance per worker (opt-in) | {} | {} |",
        us(h50),
        us(h99)
    );
    println!(
        "| ratio warm / native (p50) | {:.2}× | |",
        h50.as_secs_f64() / n50.as_secs_f64()
    );
    println!(
        "| instantiate from InstancePre | {} | {} |",
        us(i50),
        us(i99)
    );
    println!(
        "| drop of that instance, no call made (pooled memory reset) | {} | {} |",
        us(x50),
        us(x99)
    );
    println!(
        "| 10 precompiled plugins loaded (start-up) | {:.1} ms | |",
        startup.as_secs_f64() * 1000.0
    );
    println!("| marginal RSS per loaded idle plugin | {per_plugin_kib:.0} KiB | |");
    let _ = std::fs::remove_dir_all(cache);
}

/// Native `serde_json` parses of the Pod fixture into k8s-openapi's `Pod`, each timed; with
/// `dropped`, the Pod's drop is inside the timing.
fn native_parse(iterations: usize, dropped: bool) -> Vec<Duration> {
    (0..iterations)
        .map(|_| {
            let t = Instant::now();
            let pod: Pod = serde_json::from_str(std::hint::black_box(POD)).expect("pod");
            let pod = std::hint::black_box(pod);
            if dropped {
                drop(pod);
                t.elapsed()
            } else {
                let took = t.elapsed();
                drop(pod);
                took
            }
        })
        .collect()
}

/// The same component with a different custom section, so it hashes (and caches) as another file.
fn with_custom_section(wasm: &[u8], tag: u8) -> Vec<u8> {
    let name = b"wcm-bench";
    let payload = [tag];
    let mut out = wasm.to_vec();
    out.push(0); // custom section id
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}
