//! A trace per reconcile, judged by what a real OpenTelemetry Collector (built from Go modules,
//! `testenv/otelcol/`, on loopback) received over OTLP/HTTP: the host process runs with
//! `--otlp-endpoint`; a reconcile of children-probe arrives as a `reconcile children-probe` span
//! with its plugin, version, key, attempt and result, and the API calls it made (the children's
//! server-side applies, the prune's list) as its child spans; the W3C trace context a plugin asked
//! for (`http-get`) reaches the outside server, naming that reconcile's trace and its HTTP span.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use common::objects::HostProcess;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_reconcile_arrives_in_the_collector_with_its_host_call_spans_and_trace_context()
-> Result<()> {
    let collector = testenv::Collector::start()?;
    // The outside server: keeps the traceparent of each request.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let seen = seen.clone();
                async move {
                    let tp = headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    seen.lock().map(|mut s| s.push(tp)).ok();
                    "ok"
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let _server = tokio::spawn(async move { axum::serve(listener, app).await });

    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("traces").await?;
    let dir = temp_dir("traces")?;
    install(&dir, "children-probe", "children-probe.wasm")?;
    install(&dir, "http-get", "http-get.wasm")?;
    std::fs::write(
        dir.join("http-get.toml"),
        "allowed_hosts = [\"127.0.0.1\"]\n",
    )?;
    grant_dir(&dir).await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let logs = temp_dir("traces-logs")?;
    let mut host = HostProcess::start(
        &kubeconfig,
        &dir,
        "traced",
        &logs.join("host.log"),
        &[
            "--otlp-endpoint".to_string(),
            collector.otlp_http_endpoint(),
            "--otlp-service-name".to_string(),
            "wcm-test".to_string(),
        ],
    )?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let owner: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owner",
        "labels": {"wcm.test/children": "yes"}}, "data": {"children": "ConfigMap/a"}}))?;
    cms.create(&PostParams::default(), &owner).await?;
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe",
        "labels": {"wcm.test/http": "yes"}}, "data": {"url": format!("http://127.0.0.1:{port}/")}}))?;
    cms.create(&PostParams::default(), &probe).await?;
    eventually("child a", Duration::from_secs(90), || async {
        Ok(cms.get_opt("a").await?)
    })
    .await
    .with_context(|| std::fs::read_to_string(logs.join("host.log")).unwrap_or_default())?;
    let traceparent = eventually(
        "the server saw a traceparent",
        Duration::from_secs(60),
        || async {
            let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
            Ok(seen.into_iter().find(|t| !t.is_empty()))
        },
    )
    .await?;

    let key = format!("{}/owner", ns.name);
    let spans = collector
        .wait_for_spans(
            |spans| {
                spans.iter().any(|s| {
                    s.name == "reconcile children-probe"
                        && s.attributes.get("wcm.key") == Some(&key)
                        && spans.iter().any(|c| c.parent_span_id == s.span_id)
                })
            },
            Duration::from_secs(60),
        )
        .await?;
    host.child.kill().ok();
    let reconcile = spans
        .iter()
        .find(|s| {
            s.name == "reconcile children-probe"
                && s.attributes.get("wcm.key") == Some(&key)
                && spans.iter().any(|c| c.parent_span_id == s.span_id)
        })
        .context("the reconcile span")?;
    assert_eq!(reconcile.service_name.as_deref(), Some("wcm-test"));
    assert_eq!(
        reconcile.attributes.get("wcm.plugin").map(String::as_str),
        Some("children-probe")
    );
    for attribute in ["wcm.plugin.version", "wcm.attempt", "wcm.result"] {
        assert!(
            reconcile.attributes.contains_key(attribute),
            "{attribute} missing: {:?}",
            reconcile.attributes
        );
    }
    let children: Vec<&testenv::SpanRecord> = spans
        .iter()
        .filter(|c| c.parent_span_id == reconcile.span_id && c.trace_id == reconcile.trace_id)
        .collect();
    let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    // The child's server-side apply and the prune's list, as the plugin's own calls.
    assert!(names.contains(&"patch ConfigMap"), "{names:?}");
    assert!(names.contains(&"list ConfigMap"), "{names:?}");
    let apply = children
        .iter()
        .find(|c| c.name == "patch ConfigMap")
        .context("apply span")?;
    assert_eq!(
        apply
            .attributes
            .get("k8s.namespace.name")
            .map(String::as_str),
        Some(ns.name.as_str())
    );

    // The trace context the outside server received: this host's trace and its HTTP span.
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    let (trace_id, span_id) = (parts[1], parts[2]);
    let spans = collector
        .wait_for_spans(
            |spans| spans.iter().any(|s| s.span_id == span_id),
            Duration::from_secs(30),
        )
        .await?;
    let http = spans
        .iter()
        .find(|s| s.span_id == span_id)
        .context("the HTTP span")?;
    assert_eq!(http.trace_id, trace_id);
    assert_eq!(http.name, "HTTP GET");
    let parent = spans
        .iter()
        .find(|s| s.span_id == http.parent_span_id)
        .context("the HTTP span's parent")?;
    assert_eq!(parent.name, "reconcile http-get");
    Ok(())
}
