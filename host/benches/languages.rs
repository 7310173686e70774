//! What a plugin's language costs per call, measured in one process: the Python config-reloader
//! (componentize-py, CPython inside the component) beside the Rust `noop` test plugin, in both
//! isolation modes; and each component's size, compile time and resident memory once loaded.
//!
//! - "empty call": a key whose object is gone (`object: None`): both plugins return at once, so
//!   this is the fixed price of a call (instantiation, the language's runtime, the result back);
//! - "Deployment reconcile": the Python plugin's real work on a Deployment (parse it, find the
//!   ConfigMaps its Pods use, read each from the cache, hash them, compare with the annotation).
//!   The services here have no cache, so the three ConfigMaps read as missing; the fixture carries
//!   the hash of exactly that, so no write is attempted.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench languages`
//! (prints a table; docs/benchmarks.md keeps the numbers).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasm_controller_manager::cluster::services::Services;
use wasm_controller_manager::contract::{ObjectKey, Request};
use wasm_controller_manager::sandbox::{Compiled, Limits, Runtime, RuntimeSettings};

use common::{artifact, rss_mib};

const DEPLOYMENT: &str = include_str!("fixtures/deployment.json");

fn p50_p99(mut v: Vec<Duration>) -> String {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    format!(
        "{:.1} µs | {:.1} µs",
        us(v[v.len() / 2]),
        us(v[v.len() * 99 / 100])
    )
}

struct Bench {
    runtime: Arc<Runtime>,
    services: Arc<Services>,
    limits: Limits,
    rt: tokio::runtime::Runtime,
}

impl Bench {
    fn fresh(&self, compiled: &Compiled, req: &Request, n: usize) -> Vec<Duration> {
        self.rt.block_on(async {
            let mut out = Vec::with_capacity(n);
            for i in 0..n + n / 10 {
                let t = Instant::now();
                let r = self
                    .runtime
                    .reconcile(compiled, self.services.clone(), &self.limits, req)
                    .await;
                assert!(matches!(r, Ok(Ok(_))), "reconcile failed: {r:?}");
                if i >= n / 10 {
                    out.push(t.elapsed());
                }
            }
            out
        })
    }

    fn warm(&self, compiled: &Compiled, req: &Request, n: usize) -> Vec<Duration> {
        self.rt.block_on(async {
            let mut slot = None;
            let mut out = Vec::with_capacity(n);
            for i in 0..n + n / 10 {
                let t = Instant::now();
                let r = self
                    .runtime
                    .reconcile_warm(
                        compiled,
                        self.services.clone(),
                        &self.limits,
                        req,
                        &mut slot,
                    )
                    .await;
                assert!(matches!(r, Ok(Ok(_))), "reconcile failed: {r:?}");
                if i >= n / 10 {
                    out.push(t.elapsed());
                }
            }
            out
        })
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let cache = std::env::temp_dir().join(format!("wcm-bench-lang-{}", std::process::id()));
    let bench = Bench {
        runtime: Arc::new(
            Runtime::new(RuntimeSettings {
                compile_cache: Some(cache.clone()),
                max_instances: 16,
                max_memory: 256 << 20,
                ..RuntimeSettings::default()
            })
            .expect("engine"),
        ),
        services: Arc::new(Services::for_describe("bench", BTreeMap::new())),
        limits: Limits::default(),
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
    };
    let gone = Request {
        key: ObjectKey {
            namespace: Some("production".into()),
            name: "web".into(),
        },
        object: None,
        attempt: 0,
        scheduled: None,
    };
    let deployment = Request {
        object: Some(DEPLOYMENT.to_string()),
        ..gone.clone()
    };

    println!("{n} calls each (after {} warm-up calls)", n / 10);
    let plugins = [
        ("Rust `noop`", "noop"),
        ("Python `config-reloader`", "config_reloader"),
    ];
    // Cold compiles first (into the cache), then loads from the cache, after the compiles'
    // memory is freed: the RSS a loaded, idle plugin adds.
    let mut cold = Vec::new();
    for (_, name) in plugins {
        let bytes = std::fs::read(artifact(name)).expect("read the component");
        let started = Instant::now();
        drop(bench.runtime.compile(&bytes).expect("compile"));
        cold.push((bytes, started.elapsed()));
    }
    println!(
        "| plugin | size | compile (cold, 2 cores) | load from the cache | RSS added once loaded |"
    );
    println!("|---|---|---|---|---|");
    let mut loaded = Vec::new();
    for ((label, _), (bytes, cold)) in plugins.iter().zip(&cold) {
        let before = rss_mib();
        let started = Instant::now();
        let compiled = bench.runtime.compile(bytes).expect("load");
        let took = started.elapsed();
        assert!(compiled.from_cache, "{label} was not in the compile cache");
        let after = rss_mib();
        println!(
            "| {label} | {:.2} MB | {:.1} s | {:.1} ms | {:.0} KiB |",
            bytes.len() as f64 / 1e6,
            cold.as_secs_f64(),
            took.as_secs_f64() * 1000.0,
            (after - before).max(0.0) * 1024.0
        );
        loaded.push((*label, compiled));
    }
    println!();
    println!("| call | isolation | p50 | p99 |");
    println!("|---|---|---|---|");
    for (label, compiled) in &loaded {
        println!(
            "| {label}, empty call | fresh instance | {} |",
            p50_p99(bench.fresh(compiled, &gone, n))
        );
        println!(
            "| {label}, empty call | warm instance | {} |",
            p50_p99(bench.warm(compiled, &gone, n))
        );
    }
    let (label, python) = &loaded[1];
    println!(
        "| {label}, Deployment reconcile | fresh instance | {} |",
        p50_p99(bench.fresh(python, &deployment, n))
    );
    println!(
        "| {label}, Deployment reconcile | warm instance | {} |",
        p50_p99(bench.warm(python, &deployment, n))
    );
    let _ = std::fs::remove_dir_all(cache);
}
