//! Leader election on a Lease against the real API server: one leader at a time; a released Lease
//! is taken within a retry period; a leader cut off from the API server stops before a standby
//! starts; and, as the Deployment runs it, two host processes: SIGKILL the leader and the standby
//! reconciles within the lease duration; SIGTERM it and the standby takes over within 2 s. Each
//! process's metrics show that only one of them ever reconciles at a time.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use wasm_controller_manager::cluster::leader::{LeaderSettings, Leadership};
use wasm_controller_manager::metrics::Metrics;

fn settings(ns: &str, identity: &str) -> LeaderSettings {
    LeaderSettings {
        lease_name: "wcm-test".into(),
        namespace: ns.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_millis(500),
    }
}

async fn wait_leading(l: &Leadership, within: Duration) -> Result<Duration> {
    let started = Instant::now();
    eventually("leading", within, || async {
        Ok(l.is_leading().then_some(()))
    })
    .await?;
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_a_quick_hand_off_and_a_cut_off_leader_stops_first() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let ns = env.namespace("lease").await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: needs the local cluster (a proxy to its apiserver)");
        return Ok(());
    };
    let apiserver: SocketAddr = local.server.trim_start_matches("https://").parse()?;
    let proxy = testenv::CuttableProxy::start(apiserver).await?;
    let mut through_proxy = host_config().await?;
    through_proxy.cluster_url = format!("https://{}", proxy.addr()).parse()?;
    let direct = env.client().await?;
    let metrics = Metrics::new();

    // a (behind the proxy) leads; b stays a standby while a renews.
    let a = Leadership::join(
        kube::Client::try_from(through_proxy)?,
        settings(&ns.name, "a"),
        metrics.clone(),
    )
    .await?;
    wait_leading(&a, Duration::from_secs(10)).await?;
    let b = Leadership::join(direct.clone(), settings(&ns.name, "b"), metrics.clone()).await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(a.is_leading() && !b.is_leading(), "two leaders, or none");

    // The Lease is deleted under the leader: the standby does not grab the new one; the leader
    // makes it again and keeps leading.
    let leases: Api<Lease> = Api::namespaced(direct.clone(), &ns.name);
    leases.delete("wcm-test", &DeleteParams::default()).await?;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(8) {
        assert!(
            !b.is_leading(),
            "the standby led after the Lease was deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        a.is_leading(),
        "the leader stopped after its Lease was deleted"
    );
    let holder = leases
        .get("wcm-test")
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("a"));

    // a is cut off: it stops leading before b starts.
    let cut = Instant::now();
    proxy.cut();
    let mut a_stopped = None;
    let mut b_started = None;
    while b_started.is_none() && cut.elapsed() < Duration::from_secs(20) {
        if a_stopped.is_none() && !a.is_leading() {
            a_stopped = Some(cut.elapsed());
        }
        if b.is_leading() {
            b_started = Some(cut.elapsed());
            assert!(!a.is_leading(), "both lead at once");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a_stopped, b_started) = (
        a_stopped.context("the cut-off leader never stopped")?,
        b_started.context("the standby never took over")?,
    );
    println!(
        "cut off: the leader stopped after {a_stopped:?}, the standby led after {b_started:?}"
    );
    assert!(a_stopped < b_started);
    assert!(a_stopped <= Duration::from_secs(5), "{a_stopped:?}");

    // b releases (a graceful shutdown): a, reconnected, takes over within a retry period or two.
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!a.is_leading());
    let released = Instant::now();
    b.release().await;
    wait_leading(&a, Duration::from_secs(10)).await?;
    let handed = released.elapsed();
    println!("released: the standby led {handed:?} after the release began");
    assert!(handed <= Duration::from_secs(2), "{handed:?}");
    a.release().await;
    Ok(())
}

/// A free loopback port (bound, then let go).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Host {
    child: Child,
    addr: SocketAddr,
    /// `--health-addr`, as the Deployment runs it.
    health: SocketAddr,
}

impl Host {
    fn start(dir: &Path, kubeconfig: &Path, lease_ns: &str, log: &Path) -> Result<Host> {
        Self::start_with(dir, kubeconfig, lease_ns, log, "host", &[])
    }

    /// `pod_name` goes into its identity (as POD_NAME in a Deployment).
    fn start_with(
        dir: &Path,
        kubeconfig: &Path,
        lease_ns: &str,
        log: &Path,
        pod_name: &str,
        extra: &[&str],
    ) -> Result<Host> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let health: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .env("POD_NAME", pod_name)
            .arg("run")
            .args(["--health-addr", &health.to_string()])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--plugins-dir")
            .arg(dir)
            .args(["--metrics-addr", &addr.to_string()])
            .args([
                "--leader-elect",
                "--leader-elect-resource-namespace",
                lease_ns,
            ])
            .args(["--leader-elect-lease-duration", "6s"])
            .args(["--leader-elect-renew-deadline", "4s"])
            .args(["--leader-elect-retry-period", "500ms"])
            .args(["--rescan-seconds", "2", "--retry-base-ms", "200"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Host {
            child,
            addr,
            health,
        })
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let (_, body) = http_get_at(self.addr, "/metrics").await?;
        Ok(testenv::sum_metric(&body, name, labels))
    }

    async fn leading(&self) -> Result<bool> {
        Ok(self
            .metric(
                "leader_election_master_status",
                &[("name", "wasm-controller-manager")],
            )
            .await?
            == 1.0)
    }

    async fn reconciles(&self) -> Result<f64> {
        self.metric(
            "controller_runtime_reconcile_total",
            &[("controller", "well-behaved")],
        )
        .await
    }

    fn terminate(&self) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill(2) on a child process this test started.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        anyhow::ensure!(rc == 0, "kill SIGTERM failed");
        Ok(())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn annotated(cms: &Api<ConfigMap>, value: &str) -> Result<Duration> {
    let started = Instant::now();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": value}})),
    )
    .await?;
    eventually(
        &format!("c reconciled to {value}"),
        Duration::from_secs(30),
        || async {
            let a = reconciled_annotations(cms).await?;
            Ok((a.get("c").map(String::as_str) == Some(value)).then_some(()))
        },
    )
    .await?;
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_host_processes_hand_over_on_sigkill_and_on_sigterm() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("replicas").await?;
    // The Leases in a namespace of their own: the host protects its Lease namespace from plugins.
    let lease_ns = env.namespace("replicas-leases").await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let dir = temp_dir("replicas")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    // Fenced to this test's namespace: the other tests' hosts run a `well-behaved` too and watch
    // every namespace; without the fence one of them may write this test's annotation.
    std::fs::write(
        dir.join("well-behaved.toml"),
        format!("namespaces = [\"{}\"]\n", ns.name),
    )?;
    grant_dir(&dir).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"value": "v0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let logs = temp_dir("replicas-logs")?;

    let mut first = Host::start(&dir, &kubeconfig, &lease_ns.name, &logs.join("first.log"))?;
    eventually(
        "the first process leads",
        Duration::from_secs(30),
        || async { Ok(first.leading().await.ok().filter(|l| *l).map(|_| ())) },
    )
    .await?;
    let second = Host::start(&dir, &kubeconfig, &lease_ns.name, &logs.join("second.log"))?;
    eventually(
        "the second process is ready, a standby",
        Duration::from_secs(30),
        || async {
            let ready = http_get_at(second.addr, "/readyz")
                .await
                .ok()
                .map(|(code, _)| code);
            Ok((ready == Some(200) && !second.leading().await?).then_some(()))
        },
    )
    .await?;
    annotated(&cms, "v1").await?;
    // The annotation is written inside the reconcile; the count comes once the call has
    // returned: wait for it rather than race it.
    eventually(
        "first counted its reconcile",
        Duration::from_secs(5),
        || async { Ok((first.reconciles().await? >= 1.0).then_some(())) },
    )
    .await?;
    assert_eq!(second.reconciles().await?, 0.0, "a standby reconciled");

    // SIGKILL the leader: the standby reconciles once the lease (6 s) has passed since the last
    // renewal it saw, at its next look (every 0.5 s), plus the reconcile itself.
    let killed = Instant::now();
    first.child.kill()?;
    first.child.wait()?;
    annotated(&cms, "v2").await?;
    let took = killed.elapsed();
    println!("SIGKILL: the standby reconciled {took:?} after the kill");
    assert!(took <= Duration::from_secs(10), "{took:?}");
    // The annotation is written inside the reconcile; the count comes once the call has
    // returned: wait for it rather than race it.
    eventually(
        "second counted its reconcile",
        Duration::from_secs(5),
        || async { Ok((second.reconciles().await? >= 1.0).then_some(())) },
    )
    .await?;

    // A new standby; SIGTERM the leader: it releases the Lease and the standby leads within 2 s
    // (it looks every 0.5 s).
    let third = Host::start(&dir, &kubeconfig, &lease_ns.name, &logs.join("third.log"))?;
    eventually(
        "the third process is a ready standby",
        Duration::from_secs(30),
        || async {
            let ready = http_get_at(third.addr, "/readyz")
                .await
                .ok()
                .map(|(code, _)| code);
            Ok((ready == Some(200)).then_some(()))
        },
    )
    .await?;
    assert_eq!(third.reconciles().await?, 0.0, "a standby reconciled");
    let termed = Instant::now();
    second.terminate()?;
    eventually(
        "the third process leads",
        Duration::from_secs(10),
        || async { Ok(third.leading().await.ok().filter(|l| *l).map(|_| ())) },
    )
    .await?;
    let handed = termed.elapsed();
    let mut second = second;
    let status = second.child.wait()?;
    println!("SIGTERM: the standby led {handed:?} after the signal; the leader exited {status}");
    assert!(
        status.success(),
        "the leader did not exit 0 on SIGTERM: {status}"
    );
    assert!(handed <= Duration::from_secs(2), "hand-off took {handed:?}");
    annotated(&cms, "v3").await?;
    // The annotation is written inside the reconcile; the count comes once the call has
    // returned: wait for it rather than race it.
    eventually(
        "third counted its reconcile",
        Duration::from_secs(5),
        || async { Ok((third.reconciles().await? >= 1.0).then_some(())) },
    )
    .await?;
    Ok(())
}

/// The holder of each plugin's Lease, as the API server has them.
/// Plugin `name` in `dir`: a copy of `well-behaved` renamed by its NAME.toml, fenced to `ns` (the
/// other tests' hosts watch every namespace too).
fn add_plugin(dir: &Path, name: &str, ns: &str) -> Result<()> {
    install(dir, "well-behaved", &format!("{name}.wasm"))?;
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!("name = \"{name}\"\nnamespaces = [\"{ns}\"]\n"),
    )?;
    Ok(())
}

async fn plugin_lease_holders(leases: &Api<Lease>, plugins: &[&str]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in plugins {
        let lease = leases
            .get_opt(&format!("wasm-controller-manager-plugin-{p}"))
            .await?;
        let holder = lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        out.push(holder);
    }
    Ok(out)
}

/// Each plugin's reconcile count in each process.
async fn counts(hosts: &[&Host], plugins: &[&str]) -> Result<Vec<Vec<f64>>> {
    let mut out = Vec::new();
    for h in hosts {
        let mut row = Vec::new();
        for p in plugins {
            row.push(
                h.metric("controller_runtime_reconcile_total", &[("controller", p)])
                    .await?,
            );
        }
        out.push(row);
    }
    Ok(out)
}

/// Per-plugin mode: two processes and four plugins; each leads two (the Leases' holders, as the
/// API server has them); a change is reconciled, for each plugin, by exactly one process; SIGKILL
/// one and the other leads all four within the lease duration and a few retry periods.
#[tokio::test(flavor = "multi_thread")]
async fn per_plugin_leases_share_the_plugins_and_take_over_a_lost_replica() -> Result<()> {
    const PLUGINS: [&str; 4] = ["share-a", "share-b", "share-c", "share-d"];
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("per-plugin").await?;
    let lease_ns = env.namespace("per-plugin-leases").await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let dir = temp_dir("per-plugin")?;
    for p in PLUGINS {
        add_plugin(&dir, p, &ns.name)?;
    }
    grant_dir(&dir).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"value": "v0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns.name);
    let logs = temp_dir("per-plugin-logs")?;
    let per_plugin = ["--leader-elect-mode", "per-plugin"];
    let start = |name: &str| {
        Host::start_with(
            &dir,
            &kubeconfig,
            &lease_ns.name,
            &logs.join(format!("{name}.log")),
            name,
            &per_plugin,
        )
    };
    let first = start("first")?;
    let second = start("second")?;
    let balanced = eventually(
        "each process leads two plugins",
        Duration::from_secs(60),
        || async {
            let holders = plugin_lease_holders(&leases, &PLUGINS).await?;
            let of = |who: &str| holders.iter().filter(|h| h.starts_with(who)).count();
            Ok((of("first_") == 2 && of("second_") == 2).then_some(holders))
        },
    )
    .await?;
    println!("balanced: {balanced:?}");
    // The probes' own address answers them, and only them. Ready once its first scan has loaded
    // every file: a plugin's Lease can be taken while another file still loads.
    eventually(
        "the first process is ready",
        Duration::from_secs(30),
        || async { Ok((http_get_at(first.health, "/readyz").await?.0 == 200).then_some(())) },
    )
    .await?;
    assert_eq!(http_get_at(first.health, "/healthz").await?.0, 200);
    assert_eq!(http_get_at(first.health, "/metrics").await?.0, 404);
    // /plugins shows each Lease's holder as this replica last read it (every retry period): it
    // leads two and names the other replica for the other two.
    let listing = eventually(
        "/plugins of the first process shows the split",
        Duration::from_secs(5),
        || async {
            let (_, listing) = http_get_at(first.addr, "/plugins").await?;
            let leading = listing.matches("\tleading").count();
            let other = listing.matches("leader=second_").count();
            Ok((leading == 2 && other == 2).then_some(listing))
        },
    )
    .await?;
    println!("/plugins of the first process:\n{listing}");

    // A change: for each plugin, exactly one process reconciles it, the Lease's holder.
    let before = counts(&[&first, &second], &PLUGINS).await?;
    annotated(&cms, "v1").await?;
    eventually(
        "every plugin reconciled v1",
        Duration::from_secs(30),
        || async {
            let now = counts(&[&first, &second], &PLUGINS).await?;
            let all = (0..PLUGINS.len()).all(|p| (0..2).any(|h| now[h][p] > before[h][p]));
            Ok(all.then_some(()))
        },
    )
    .await?;
    // A late duplicate from the other process would show a moment later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = counts(&[&first, &second], &PLUGINS).await?;
    for (p, plugin) in PLUGINS.iter().enumerate() {
        let moved: Vec<usize> = (0..2).filter(|h| after[*h][p] > before[*h][p]).collect();
        let holder = &balanced[p];
        let expected = usize::from(holder.starts_with("second_"));
        assert_eq!(
            moved,
            vec![expected],
            "{plugin}: reconciled by processes {moved:?}, its Lease is held by {holder}"
        );
    }

    // SIGKILL the first: the second leads all four once the first's leases have expired (6 s),
    // and reconciles a change for each.
    let mut first = first;
    let killed = Instant::now();
    first.child.kill()?;
    first.child.wait()?;
    eventually(
        "the second process leads all four plugins",
        Duration::from_secs(30),
        || async {
            let holders = plugin_lease_holders(&leases, &PLUGINS).await?;
            Ok(holders
                .iter()
                .all(|h| h.starts_with("second_"))
                .then_some(()))
        },
    )
    .await?;
    let took = killed.elapsed();
    println!("SIGKILL: the survivor led all four plugins {took:?} after the kill");
    assert!(took <= Duration::from_secs(10), "{took:?}");
    let before = counts(&[&second], &PLUGINS).await?;
    annotated(&cms, "v2").await?;
    eventually(
        "the survivor reconciles every plugin",
        Duration::from_secs(30),
        || async {
            let now = counts(&[&second], &PLUGINS).await?;
            Ok((0..PLUGINS.len())
                .all(|p| now[0][p] > before[0][p])
                .then_some(()))
        },
    )
    .await?;

    // A replica joins: the survivor gives up the two Leases past its new share (once their
    // in-flight work is done) and the newcomer takes them.
    let joined = Instant::now();
    let third = start("third")?;
    eventually(
        "the newcomer takes its share",
        Duration::from_secs(60),
        || async {
            let holders = plugin_lease_holders(&leases, &PLUGINS).await?;
            let of = |who: &str| holders.iter().filter(|h| h.starts_with(who)).count();
            Ok((of("second_") == 2 && of("third_") == 2).then_some(()))
        },
    )
    .await?;
    println!(
        "join: shares balanced {:?} after the newcomer started",
        joined.elapsed()
    );

    // SIGTERM: the leaving replica releases its Leases and its membership, and the other leads
    // all four within 2 s (it looks every 0.5 s). Measured once the newcomer runs every plugin
    // (ready after its first scan loaded every file): it can take a plugin's Lease only then.
    eventually("the newcomer is ready", Duration::from_secs(60), || async {
        Ok((http_get_at(third.health, "/readyz").await?.0 == 200).then_some(()))
    })
    .await?;
    // Its four files hold the same bytes, loaded at once: compiled once, the others wait for it.
    let compiles = std::fs::read_to_string(logs.join("third.log"))?
        .matches("component compiled in a child process")
        .count();
    assert_eq!(
        compiles, 1,
        "four identical files compiled {compiles} times"
    );
    let termed = Instant::now();
    second.terminate()?;
    eventually(
        "the remaining replica leads all four plugins",
        Duration::from_secs(10),
        || async {
            let holders = plugin_lease_holders(&leases, &PLUGINS).await?;
            Ok(holders
                .iter()
                .all(|h| h.starts_with("third_"))
                .then_some(()))
        },
    )
    .await?;
    let handed = termed.elapsed();
    let mut second = second;
    let status = second.child.wait()?;
    println!("SIGTERM: all four plugins handed over in {handed:?}; the leaver exited {status}");
    assert!(status.success(), "exit status {status}");
    // Two looks (0.5 s apart) and the leaver's own stop; a margin for a busy 2-core machine.
    assert!(handed <= Duration::from_secs(3), "{handed:?}");
    let before = counts(&[&third], &PLUGINS).await?;
    annotated(&cms, "v3").await?;
    eventually(
        "the remaining replica reconciles every plugin",
        Duration::from_secs(30),
        || async {
            let now = counts(&[&third], &PLUGINS).await?;
            Ok((0..PLUGINS.len())
                .all(|p| now[0][p] > before[0][p])
                .then_some(()))
        },
    )
    .await?;

    // A plugin removed from the directory: its Lease is released, and its status series leaves
    // /metrics with its election, while the others' stay.
    std::fs::remove_file(dir.join("share-d.wasm"))?;
    std::fs::remove_file(dir.join("share-d.toml"))?;
    let series = |body: &str, plugin: &str| {
        body.lines().any(|l| {
            l.starts_with("leader_election_master_status{")
                && l.contains(&format!("\"wasm-controller-manager-plugin-{plugin}\""))
        })
    };
    eventually(
        "share-d's Lease released and its series gone",
        Duration::from_secs(30),
        || async {
            let holders = plugin_lease_holders(&leases, &["share-d"]).await?;
            let (_, body) = http_get_at(third.addr, "/metrics").await?;
            Ok((holders[0].is_empty() && !series(&body, "share-d")).then_some(()))
        },
    )
    .await?;
    let (_, body) = http_get_at(third.addr, "/metrics").await?;
    for p in ["share-a", "share-b", "share-c"] {
        assert!(series(&body, p), "{p}'s series went too:\n{body}");
    }

    // Added back: a new election (a new generation in the holder) takes the Lease, and the series
    // is back at 1.
    add_plugin(&dir, "share-d", &ns.name)?;
    eventually(
        "share-d led again, its series back",
        Duration::from_secs(30),
        || async {
            let holders = plugin_lease_holders(&leases, &["share-d"]).await?;
            let leading = third
                .metric(
                    "leader_election_master_status",
                    &[("name", "wasm-controller-manager-plugin-share-d")],
                )
                .await?;
            Ok((holders[0].starts_with("third_") && leading == 1.0).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A reconcile in flight when its replica loses the Lease: its write is refused by the host
/// (503 NotLeader) and never reaches the API server; once the replica leads again the key is
/// reconciled, so nothing is lost. The reconcile is held in flight by a loopback HTTP server the
/// plugin calls before it writes.
#[tokio::test(flavor = "multi_thread")]
async fn a_write_in_flight_when_the_lease_is_lost_is_refused_and_retried_by_the_leader()
-> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = Arc::new(AtomicUsize::new(0));
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/hold",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut open = open_rx.clone();
            async move {
                let _ = open.wait_for(|o| *o).await;
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let _server = tokio::spawn(async move { axum::serve(listener, app).await });

    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("lost-lease").await?;
    let dir = temp_dir("lost-lease")?;
    std::fs::write(
        dir.join("held.toml"),
        "name = \"http-held\"\nallowed_hosts = [\"127.0.0.1\"]\n[config]\nannotation = \"wcm.test/held\"\n",
    )?;
    install(&dir, "http-get", "held.wasm")?;
    grant_dir(&dir).await?;
    let mut cfg = test_config(&dir);
    cfg.leader_election = Some(settings(&ns.name, "in-process"));
    let manager = start_manager(cfg).await?;
    eventually("the manager leads", Duration::from_secs(15), || async {
        Ok(manager.is_leading().then_some(()))
    })
    .await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "probe", "labels": {"wcm.test/http": "yes"}},
        "data": {"url": format!("http://127.0.0.1:{port}/hold")}
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    eventually(
        "the reconcile is in flight (the server holds its call)",
        Duration::from_secs(30),
        || async { Ok((hits.load(Ordering::SeqCst) >= 1).then_some(())) },
    )
    .await?;

    // Another holder takes the Lease: the replica stops leading within a retry period, while
    // the reconcile is still in flight.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let mut lease = leases.get("wcm-test").await?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("another-replica".into());
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    leases
        .replace("wcm-test", &PostParams::default(), &lease)
        .await?;
    eventually(
        "the manager stops leading",
        Duration::from_secs(5),
        || async { Ok((!manager.is_leading()).then_some(())) },
    )
    .await?;
    let mark = env.has_audit_log().then(|| env.audit_mark()).transpose()?;
    open_tx.send_replace(true);
    // The plugin writes as soon as its call returns: give the write every chance to go out.
    let refused = eventually(
        "the in-flight write is refused",
        Duration::from_secs(10),
        || async {
            let (_, body) = http_get(&manager, "/debug/controllers").await?;
            Ok(body.contains("NotLeader").then_some(body))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let annotations = cms
        .get("probe")
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !annotations.contains_key("wcm.test/held"),
        "a write went out after the Lease was lost: {annotations:?}\n{refused}"
    );
    if let Some(mark) = mark {
        let patches: Vec<_> = env
            .audit_events_since(mark)?
            .into_iter()
            .filter(|e| {
                e.verb == "patch"
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|o| o.name == "probe" && o.namespace == ns.name)
            })
            .collect();
        assert!(
            patches.is_empty(),
            "the API server saw a patch of the probe after the Lease was lost: {patches:?}"
        );
    }

    // The Lease is given up by the other holder: the replica leads again, and the key, kept in
    // its queue, is reconciled.
    let mut lease = leases.get("wcm-test").await?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    leases
        .replace("wcm-test", &PostParams::default(), &lease)
        .await?;
    eventually(
        "the key is reconciled once the replica leads again",
        Duration::from_secs(30),
        || async {
            let a = cms
                .get("probe")
                .await?
                .metadata
                .annotations
                .unwrap_or_default();
            Ok((a.get("wcm.test/held").map(String::as_str) == Some("200")).then_some(()))
        },
    )
    .await?;
    manager.stop().await;
    Ok(())
}
