//! Budgets per unit of time, not per call (issue #23 item 7). A hostile plugin (`http-flood`)
//! fires 100 requests per reconcile at a loopback server it is allowed to reach and asks to be
//! called again after 1 ms: the server's own count shows it was reached no faster than the
//! plugin's HTTP rate plus its burst, and no key came back sooner than the requeue floor. A
//! plugin whose calls all spin to their deadline at once runs into no more CPU debt than about a
//! tick per call, not workers × deadline.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use wasm_controller_manager::cluster::services::{BudgetSettings, Services};
use wasm_controller_manager::contract::{ObjectKey, Request};
use wasm_controller_manager::sandbox::{Limits, Runtime, RuntimeSettings};

/// A real HTTP server on loopback: when each request arrived, and its query.
async fn server() -> Result<(u16, Arc<Mutex<Vec<(Instant, String)>>>)> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/flood",
        axum::routing::get(move |uri: axum::http::Uri| {
            let log = log.clone();
            async move {
                let query = uri.query().unwrap_or_default().to_string();
                log.lock()
                    .expect("server log")
                    .push((Instant::now(), query));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((port, seen))
}

fn flood_cm(name: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"wcm.test/http-flood": "yes"}},
    }))?)
}

/// The requests the server saw within `window` of the first one, waiting for the window to pass.
async fn seen_within(
    seen: &Arc<Mutex<Vec<(Instant, String)>>>,
    window: Duration,
) -> Result<Vec<String>> {
    let first = eventually("the first request", Duration::from_secs(60), || async {
        Ok(seen.lock().expect("server log").first().map(|(t, _)| *t))
    })
    .await?;
    tokio::time::sleep_until((first + window).into()).await;
    Ok(seen
        .lock()
        .expect("server log")
        .iter()
        .filter(|(t, _)| *t <= first + window)
        .map(|(_, q)| q.clone())
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_flood_reaches_the_server_no_faster_than_the_plugins_rate_and_burst() -> Result<()>
{
    let (port, seen) = server().await?;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("http-rate").await?;
    let dir = temp_dir("http-rate")?;
    let (qps, burst) = (10.0, 10.0);
    std::fs::write(
        dir.join("rate.toml"),
        format!(
            "name = \"http-rate\"\nallowed_hosts = [\"127.0.0.1:{port}\"]\nhttp_qps = {qps}\nhttp_burst = {burst}\n\
             [config]\nurl = \"http://127.0.0.1:{port}/flood\"\nnamespace = \"{}\"\n",
            ns.name
        ),
    )?;
    install(&dir, "http-flood", "rate.wasm")?;
    let mut config = test_config(&dir);
    // Short calls: requests whose turn would come after the call's end are refused, not queued.
    config.limits.wall_timeout = Duration::from_secs(4);
    let manager = start_manager(config).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &flood_cm(name)?).await?;
    }
    // Three keys on four workers, 100 requests each per reconcile, every 1 ms: unbounded, the
    // server would see thousands of requests a second.
    let window = Duration::from_secs(8);
    let requests = seen_within(&seen, window).await?;
    let most = (qps * window.as_secs_f64() + burst) as usize;
    eprintln!(
        "the server saw {} requests in {window:?} (at most {most} allowed)",
        requests.len()
    );
    assert!(
        requests.len() <= most + 1,
        "the server saw {} requests in {window:?}, over {qps}/s and a burst of {burst}",
        requests.len()
    );
    assert!(
        requests.len() >= most / 2,
        "the flood did not get its rate: {}",
        requests.len()
    );
    // The plugin was told why, in words.
    let told = eventually(
        "the plugin saw a rate-limit error",
        Duration::from_secs(30),
        || async {
            Ok(cms
                .get("a")
                .await?
                .metadata
                .annotations
                .and_then(|a| a.get("wcm.test/http-flood").cloned()))
        },
    )
    .await?;
    assert!(
        told.contains("rate limited") && told.contains("10 outbound HTTP requests per second"),
        "{told}"
    );
    let refused = metric(
        &manager,
        "wcm_forbidden_host_calls_total",
        &[("plugin", "http-rate"), ("resource", "outbound-http")],
    );
    assert!(refused > 0.0, "refusals are counted");
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn requeue_after_1ms_brings_a_key_back_no_sooner_than_the_floor() -> Result<()> {
    let (port, seen) = server().await?;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("requeue-floor").await?;
    let dir = temp_dir("requeue-floor")?;
    // One request per reconcile: the server counts reconciles. The floor is the flag's default.
    std::fs::write(
        dir.join("floor.toml"),
        format!(
            "name = \"requeue-floor\"\nallowed_hosts = [\"127.0.0.1:{port}\"]\n\
             [config]\nurl = \"http://127.0.0.1:{port}/flood\"\nrequests = \"1\"\nnamespace = \"{}\"\n",
            ns.name
        ),
    )?;
    install(&dir, "http-flood", "floor.wasm")?;
    let config = test_config(&dir);
    let floor = config.budgets.min_requeue_after;
    assert_eq!(floor, Duration::from_secs(1));
    let manager = start_manager(config).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let keys = 3;
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &flood_cm(name)?).await?;
    }
    let window = Duration::from_secs(6);
    let reconciles = seen_within(&seen, window).await?;
    // Each key: one reconcile at once, then one per floor at most.
    let most = keys * (window.as_secs() as usize / floor.as_secs() as usize + 1);
    eprintln!(
        "the server saw {} reconciles in {window:?} (at most {most} allowed)",
        reconciles.len()
    );
    assert!(
        reconciles.len() <= most,
        "{} reconciles of {keys} keys in {window:?}: faster than one per {floor:?}",
        reconciles.len()
    );
    assert!(
        reconciles.len() >= keys * 3,
        "the keys did come back: {}",
        reconciles.len()
    );
    let distinct: std::collections::BTreeSet<&str> = reconciles
        .iter()
        .filter_map(|q| q.split('&').next())
        .collect();
    assert_eq!(
        distinct.len(),
        reconciles.len(),
        "one request per reconcile"
    );
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_spinning_to_their_deadline_at_once_owe_about_a_tick_each_not_their_deadline()
-> Result<()> {
    let wasm = std::fs::read(plugin("infinite-loop")?)?;
    let runtime = Runtime::new(RuntimeSettings {
        max_instances: 16,
        ..RuntimeSettings::default()
    })?;
    let compiled = runtime.compile(&wasm)?;
    let share = 0.5;
    let services = Arc::new(Services::with_budgets(
        "infinite-loop",
        &BudgetSettings {
            cpu_share: share,
            ..BudgetSettings::default()
        },
    ));
    let limits = Limits {
        cpu_deadline: Duration::from_millis(500),
        ..Limits::default()
    };
    let calls = 8;
    let request = || Request {
        key: ObjectKey {
            namespace: Some("default".into()),
            name: "spin".into(),
        },
        object: None,
        attempt: 0,
        scheduled: None,
    };
    // The largest debt while the calls run, sampled every millisecond.
    let most = Arc::new(Mutex::new(Duration::ZERO));
    let sampler = {
        let (services, most) = (services.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                let debt = services.budgets().cpu_debt();
                {
                    let mut m = most.lock().expect("most");
                    *m = (*m).max(debt);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let started = Instant::now();
    let runs: Vec<_> = (0..calls)
        .map(|_| {
            let (runtime, compiled, services, limits, req) = (
                &runtime,
                &compiled,
                services.clone(),
                limits.clone(),
                request(),
            );
            async move { runtime.reconcile(compiled, services, &limits, &req).await }
        })
        .collect();
    let results = futures::future::join_all(runs).await;
    let took = started.elapsed();
    sampler.abort();
    for r in &results {
        assert!(
            matches!(r, Err(e) if e.to_string().contains("deadline")),
            "{r:?}"
        );
    }
    let most = *most.lock().expect("most");
    let after = services.budgets().cpu_debt();
    // 8 × 500 ms of guest CPU against a burst of 1 s: charged only at the end, the debt would
    // reach about 3 s (6 s of rest at half a core). Charged at each 5 ms tick, a call that finds
    // the plugin in debt rests there: the debt stays near one tick per call.
    eprintln!(
        "{calls} calls of {:?} took {took:?}; largest debt {most:?}, at the end {after:?}",
        limits.cpu_deadline
    );
    assert!(
        most < Duration::from_millis(500) && after < Duration::from_millis(500),
        "the debt reached {most:?} ({after:?} at the end)"
    );
    // And the share held: 4 s of guest CPU at half a core, less the 1 s burst, takes 6 s.
    assert!(took >= Duration::from_secs(5), "{took:?}");
    Ok(())
}

/// A DNS server on a loopback address of its own that never answers: the source ports of the
/// queries it received (one socket per lookup of the host's resolver) and how many queries.
async fn silent_dns() -> Result<(std::net::IpAddr, Arc<Mutex<Vec<u16>>>)> {
    let mut last = None;
    for n in 0..20u8 {
        let ip = std::net::IpAddr::from([127, 0, 53, 10 + n]);
        match tokio::net::UdpSocket::bind((ip, 53)).await {
            Ok(socket) => {
                let seen = Arc::new(Mutex::new(Vec::new()));
                let log = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1500];
                    while let Ok((_, from)) = socket.recv_from(&mut buf).await {
                        log.lock().expect("dns log").push(from.port());
                    }
                });
                return Ok((ip, seen));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!(
        "no loopback address for the DNS server: {last:?}"
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_of_a_name_that_never_resolves_stay_within_the_plugins_bound() -> Result<()> {
    // The host runs as its own process in a mount namespace where /etc/resolv.conf names the
    // silent server: nothing else on the machine sees that file, and no query leaves loopback.
    let probe = std::process::Command::new("unshare")
        .args(["-m", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: `unshare -m` is not permitted here (needs root or user namespaces)");
        return Ok(());
    }
    let (dns, queries) = silent_dns().await?;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("dns-bound").await?;
    let dir = temp_dir("dns-bound")?;
    let resolv = dir.join("resolv.conf.test");
    // A lookup waits 30 s for the answer that never comes: far longer than the test.
    std::fs::write(
        &resolv,
        format!("nameserver {dns}\noptions timeout:30 attempts:1\n"),
    )?;
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::write(
        plugins.join("dns.toml"),
        format!(
            "name = \"dns-flood\"\nallowed_hosts = [\"never-answers.test\"]\n\
             [config]\nurl = \"http://never-answers.test/flood\"\ntimeout-ms = \"50\"\nnamespace = \"{}\"\n",
            ns.name
        ),
    )?;
    install(&plugins, "http-flood", "dns.wasm")?;
    grant_dir(&plugins).await?;
    let kubeconfig = env
        .kubeconfig_path()
        .ok_or_else(|| anyhow::anyhow!("the test cluster has no kubeconfig file"))?;
    let log = dir.join("host.log");
    let mut host = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
        .arg(&resolv)
        .arg(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--plugins-dir")
        .arg(&plugins)
        .args(["--metrics-addr", "127.0.0.1:0", "--rescan-seconds", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &flood_cm(name)?).await?;
    }
    // Three keys, each request giving up after 50 ms and the next one asking again: at the
    // plugin's 20 requests per second, unbounded lookups would pile up by the hundred.
    let first = eventually("the first DNS query", Duration::from_secs(60), || async {
        Ok((!queries.lock().expect("dns log").is_empty()).then_some(()))
    })
    .await;
    if first.is_err() {
        let _ = host.kill();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: String = text.lines().rev().take(30).collect::<Vec<_>>().join("\n");
        anyhow::bail!("no DNS query arrived; the host's log ends with:\n{tail}");
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ports: Vec<u16> = queries.lock().expect("dns log").clone();
    let _ = host.kill();
    let _ = host.wait();
    let lookups: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    eprintln!(
        "the DNS server saw {} queries from {} sockets (lookups) in about 8 s",
        ports.len(),
        lookups.len()
    );
    // One socket per lookup (A and AAAA go over it); a resolver reopening it for the second
    // query would make two.
    assert!(
        lookups.len() <= 2 * 4,
        "{} lookups reached the resolver at once: over the plugin's bound of 4",
        lookups.len()
    );
    Ok(())
}
