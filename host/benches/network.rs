//! The network plugin against the real Neutron and Keystone: N Networks created at once → time until
//! all are Ready; Neutron and Keystone requests per Network (from their own request logs); then a
//! quiet period spanning a resync → Neutron writes (must be 0) and reads per Network.
//!
//! `cargo bench -p wasm-controller-manager --bench network` (after `scripts/build-plugins`).
//! `WCM_BENCH_NETWORKS` sets N (default 200).

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use testenv::{OpenStack, RequestRecord};
use wasm_controller_manager::app::Manager;

const RESYNC_SECONDS: u64 = 20;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

fn count(records: &[RequestRecord], f: impl Fn(&RequestRecord) -> bool) -> usize {
    records.iter().filter(|r| f(r)).count()
}

async fn run() {
    let n: usize = std::env::var("WCM_BENCH_NETWORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let os = OpenStack::start().await.expect("Neutron and Keystone");
    os.unlimited_quota().expect("quota");
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    let client = env.client().await.expect("client");
    let ns = env.namespace("bench-net").await.expect("ns").name;

    let dir = std::env::temp_dir().join(format!("wcm-bench-network-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    os.configure_network_plugin(
        &client,
        &ns,
        &dir,
        &format!("resync_seconds = {RESYNC_SECONDS}\n"),
    )
    .await
    .expect("network plugin settings");
    std::fs::copy(artifact("network"), dir.join("network.wasm")).expect("copy network");
    let manager = Manager::start(bench_config(&dir), granted(env, &dir).await)
        .await
        .expect("manager");
    println!(
        "machine: {} cores; {n} Networks; plugin workers 4 (isolation worker); resync {RESYNC_SECONDS} s",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let neutron0 = os.neutron_requests().expect("log").len();
    let keystone0 = os.keystone_requests().expect("log").len();
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    for i in 0..n {
        let (a, b) = (i / 250, i % 250);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
            "metadata": {"name": format!("net-{i}")},
            "spec": {"cidr": format!("10.{a}.{b}.0/24"), "gateway": format!("10.{a}.{b}.1")},
        }))
        .expect("network");
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create");
    }
    let created = start.elapsed();
    let ready = |list: &[DynamicObject]| {
        list.iter()
            .filter(|o| {
                o.data["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .count()
    };
    loop {
        let list = api.list(&ListParams::default()).await.expect("list").items;
        if ready(&list) == n {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1800),
            "not all Ready after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_ready = start.elapsed();
    let cpu = cpu_seconds() - cpu0;
    let neutron = os.neutron_requests().expect("log")[neutron0..].to_vec();
    let keystone = os.keystone_requests().expect("log")[keystone0..].to_vec();
    let per = |k: usize| k as f64 / n as f64;
    println!(
        "burst: {n} created in {:.1} s, all Ready after {:.1} s ({:.1} Networks/s); host CPU {:.2} s ({:.1} ms per Network), RSS {:.0} MiB",
        created.as_secs_f64(),
        all_ready.as_secs_f64(),
        n as f64 / all_ready.as_secs_f64(),
        cpu,
        cpu * 1000.0 / n as f64,
        rss_mib()
    );
    let tokens = count(&keystone, |r| {
        r.method == "POST" && r.path.ends_with("/auth/tokens")
    });
    println!(
        "burst requests: Neutron {} ({:.2} per Network: GET {}, POST {}, PUT {}, DELETE {}), Keystone {} (token issues {tokens}: {:.3} per Network; the rest are Neutron's token checks)",
        neutron.len(),
        per(neutron.len()),
        count(&neutron, |r| r.method == "GET"),
        count(&neutron, |r| r.method == "POST"),
        count(&neutron, |r| r.method == "PUT"),
        count(&neutron, |r| r.method == "DELETE"),
        keystone.len(),
        per(tokens),
    );
    let errors = count(&neutron, |r| r.status >= 400);
    println!("burst Neutron errors: {errors}");
    let reconciles = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "network")],
    );
    let filtered = metric(
        &manager,
        "wcm_changes_filtered_total",
        &[("controller", "network")],
    );
    println!(
        "reconciles: {reconciles:.0}; updates filtered (own status writes and the like): {filtered:.0}"
    );

    // Quiet: nothing changes for longer than a resync period.
    let quiet_from = os.neutron_requests().expect("log").len();
    let keystone_from = os.keystone_requests().expect("log").len();
    let window = Duration::from_secs(RESYNC_SECONDS + 10);
    tokio::time::sleep(window).await;
    let quiet = os.neutron_requests().expect("log")[quiet_from..].to_vec();
    let writes = count(&quiet, |r| r.method != "GET");
    let tokens = count(
        &os.keystone_requests().expect("log")[keystone_from..],
        |r| r.method == "POST" && r.path.ends_with("/auth/tokens"),
    );
    println!(
        "steady state over {} s (one resync): Neutron writes {writes}, reads {} ({:.2} per Network), new tokens {tokens}",
        window.as_secs(),
        quiet.len() - writes,
        per(quiet.len() - writes)
    );
    manager.stop().await;
}
