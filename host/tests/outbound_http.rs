//! Outbound HTTP from plugins (`wasi:http`): a request reaches a host that the plugin declared and
//! the operator allowed; without the operator's allowance it is refused inside the host, counted,
//! and never sent. Waiting for a response is not guest time: a response slower than the plugin's
//! whole CPU deadline still arrives.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn only_declared_and_allowed_hosts_are_reached() -> Result<()> {
    // A real HTTP server on loopback, counting what reaches it.
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/v2.0/networks",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { "{\"networks\": []}" }
        }),
    );
    // Slower than the plugin's whole CPU deadline.
    let slow = Duration::from_millis(1500);
    let app = app.route(
        "/slow",
        axum::routing::get(move || async move {
            tokio::time::sleep(slow).await;
            "{}"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("http").await?;
    let dir = temp_dir("http")?;
    // The same component twice: allowed by the operator, and not.
    std::fs::write(
        dir.join("allowed.toml"),
        "name = \"http-allowed\"\nallowed_hosts = [\"127.0.0.1\"]\n[config]\nannotation = \"wcm.test/allowed\"\n",
    )?;
    std::fs::write(
        dir.join("denied.toml"),
        "name = \"http-denied\"\n[config]\nannotation = \"wcm.test/denied\"\n",
    )?;
    // Allowed by name, but the name resolves to loopback: refused unless allowed by address.
    std::fs::write(
        dir.join("by-name.toml"),
        "name = \"http-by-name\"\nallowed_hosts = [\"localhost\"]\n[config]\nannotation = \"wcm.test/by-name\"\nurl-key = \"url_by_name\"\n",
    )?;
    std::fs::write(
        dir.join("slow.toml"),
        "name = \"http-slow\"\nallowed_hosts = [\"127.0.0.1\"]\n[config]\nannotation = \"wcm.test/slow\"\nurl-key = \"url_slow\"\n",
    )?;
    install(&dir, "http-get", "slow.wasm")?;
    install(&dir, "http-get", "allowed.wasm")?;
    install(&dir, "http-get", "denied.wasm")?;
    install(&dir, "http-get", "by-name.wasm")?;
    let config = test_config(&dir);
    assert!(config.limits.cpu_deadline < slow);
    let manager = start_manager(config).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "probe", "labels": {"wcm.test/http": "yes"}},
        "data": {
            "url": format!("http://127.0.0.1:{port}/v2.0/networks"),
            "url_by_name": format!("http://localhost:{port}/v2.0/networks"),
            "url_slow": format!("http://127.0.0.1:{port}/slow"),
        }
    }))?;
    cms.create(&PostParams::default(), &cm).await?;

    let annotations = |key: &'static str| {
        let cms = cms.clone();
        async move {
            Ok::<_, anyhow::Error>(
                cms.get("probe")
                    .await?
                    .metadata
                    .annotations
                    .and_then(|a| a.get(key).cloned()),
            )
        }
    };
    eventually(
        "the allowed plugin got 200",
        Duration::from_secs(30),
        || async {
            Ok((annotations("wcm.test/allowed").await?.as_deref() == Some("200")).then_some(()))
        },
    )
    .await?;
    let denied = eventually(
        "the denied plugin got an error",
        Duration::from_secs(30),
        || async { annotations("wcm.test/denied").await },
    )
    .await?;
    assert!(
        denied.starts_with("error:") && denied.contains("Denied"),
        "{denied}"
    );
    let by_name = eventually(
        "the plugin allowed by name got an error",
        Duration::from_secs(30),
        || async { annotations("wcm.test/by-name").await },
    )
    .await?;
    assert!(
        by_name.starts_with("error:") && by_name.contains("Prohibited"),
        "a name resolving to loopback was reached: {by_name}"
    );
    eventually(
        "the slow response arrived",
        Duration::from_secs(30),
        || async {
            Ok((annotations("wcm.test/slow").await?.as_deref() == Some("200")).then_some(()))
        },
    )
    .await?;
    let deadlines = metric(
        &manager,
        "wcm_plugin_call_failures_total",
        &[("plugin", "http-slow"), ("reason", "deadline")],
    );
    assert_eq!(
        deadlines, 0.0,
        "the wait for a response was charged as guest time"
    );
    // Every request that reached the server came from the allowed plugin: one per reconcile of it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let allowed_calls = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "http-allowed")],
    );
    let reached = hits.load(Ordering::SeqCst);
    assert!(reached >= 1);
    assert_eq!(
        reached as f64, allowed_calls,
        "a request other than the allowed plugin's reached the server"
    );
    let refused = metric(
        &manager,
        "wcm_forbidden_host_calls_total",
        &[("plugin", "http-denied"), ("verb", "http")],
    );
    assert!(refused >= 1.0, "refusals counted: {refused}");
    manager.stop().await;
    server.abort();
    Ok(())
}
