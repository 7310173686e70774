//! The event writer facing a slow and a failing API server, made real with a validating admission
//! webhook on Events: the API server holds the Events about `slow-*` objects for 8 s and refuses
//! those about `fail-*` with a 500. Reconciles never wait for events; the Events about the other
//! objects are written while the slow ones are still held; the refused ones are retried (the
//! webhook counts every attempt the API server made); the held ones are written in the end.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::{Value, json};

const HOLD: Duration = Duration::from_secs(8);

/// What the webhook saw: attempts per regarded object, and holds in progress.
#[derive(Default)]
struct Seen {
    attempts: HashMap<String, u32>,
    holding: u32,
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_failing_event_writes_hold_up_no_reconcile_and_no_other_event() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: the webhook uses the local cluster's serving certificate");
        return Ok(());
    };
    let client = env.client().await?;
    let ns = env.namespace("slowevents").await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let pki = std::path::Path::new(&local.dir).join("pki");
    let port = {
        let seen = seen.clone();
        common::webhook::serve(&pki, move |review| {
            let seen = seen.clone();
            async move { decide(&review, &seen).await }
        })
        .await?
    };
    let webhook_name = format!("events-{}", ns.name);
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    webhooks
        .create(
            &PostParams::default(),
            &webhook_config(
                &webhook_name,
                &ns.name,
                port,
                std::fs::read(pki.join("ca.crt"))?,
            ),
        )
        .await?;
    // The webhook is live once an Event about a `fail-` object is refused.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    eventually("the webhook is called", Duration::from_secs(30), || async {
        let probe: Event = serde_json::from_value(json!({
            "metadata": {"generateName": "probe-"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "test", "reportingInstance": "test", "action": "Probe",
            "reason": "Probe", "type": "Normal",
            "regarding": {"kind": "ConfigMap", "apiVersion": "v1", "namespace": ns.name, "name": "fail-probe"}
        }))?;
        Ok(events.create(&PostParams::default(), &probe).await.is_err().then_some(()))
    })
    .await?;

    let dir = temp_dir("slowevents")?;
    install(&dir, "event-recorder", "event-recorder.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let names: Vec<String> = (0..3)
        .map(|i| format!("slow-{i}"))
        .chain((0..2).map(|i| format!("fail-{i}")))
        .chain((0..10).map(|i| format!("ok-{i}")))
        .collect();
    // The slow and failing objects first, so their events are ahead in the writer's queue.
    for name in &names {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name}, "data": {"value": name}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }

    eventually(
        "every ConfigMap reconciled",
        Duration::from_secs(30),
        || async {
            let a = reconciled_annotations(&cms).await?;
            Ok(names.iter().all(|n| a.get(n) == Some(n)).then_some(()))
        },
    )
    .await?;
    eventually(
        "the events about ok-* written",
        Duration::from_secs(30),
        || async {
            let written = regarded(&events).await?;
            Ok((0..10)
                .all(|i| written.contains(&format!("ok-{i}")))
                .then_some(()))
        },
    )
    .await?;
    let (holding, slow_attempts) = {
        let s = seen.lock().unwrap_or_else(|p| p.into_inner());
        let slow: u32 = (0..3)
            .map(|i| s.attempts.get(&format!("slow-{i}")).copied().unwrap_or(0))
            .sum();
        (s.holding, slow)
    };
    assert!(
        slow_attempts >= 3 && holding >= 1,
        "the ok-* events should be written while slow ones are held: {slow_attempts} slow attempts, {holding} held now"
    );

    // The refused ones are retried: the API server asked the webhook again.
    eventually(
        "the refused events retried",
        Duration::from_secs(30),
        || async {
            let s = seen.lock().unwrap_or_else(|p| p.into_inner());
            Ok((0..2)
                .all(|i| s.attempts.get(&format!("fail-{i}")).copied().unwrap_or(0) >= 3)
                .then_some(()))
        },
    )
    .await?;
    // The held ones are written in the end; no refused one is.
    eventually(
        "the held events written",
        Duration::from_secs(60),
        || async {
            let written = regarded(&events).await?;
            assert!(
                !written.iter().any(|n| n.starts_with("fail-")),
                "{written:?}"
            );
            Ok((0..3)
                .all(|i| written.contains(&format!("slow-{i}")))
                .then_some(()))
        },
    )
    .await?;
    // Counted once the API server's answer is in, which may be just after the event is listed.
    let counted = eventually("13 events counted", Duration::from_secs(10), || async {
        let written = metric(
            &manager,
            "wcm_events_written_total",
            &[("plugin", "event-recorder")],
        );
        Ok((written >= 13.0).then_some(()))
    })
    .await;
    assert!(counted.is_ok(), "{}", manager.metrics.encode());
    manager.stop().await;
    webhooks
        .delete(&webhook_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The names of the objects the Events of the namespace are about.
async fn regarded(events: &Api<Event>) -> Result<Vec<String>> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.regarding?.name)
        .collect())
}

fn webhook_config(
    name: &str,
    namespace: &str,
    port: u16,
    ca: Vec<u8>,
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "events.faults.wcm.test".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(10),
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}/validate")),
                ca_bundle: Some(ByteString(ca)),
                ..Default::default()
            },
            namespace_selector: Some(LabelSelector {
                match_labels: Some(
                    [(
                        "kubernetes.io/metadata.name".to_string(),
                        namespace.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["events.k8s.io".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["events".into()]),
                ..Default::default()
            }]),
            ..Default::default()
        }]),
    }
}

async fn decide(review: &Value, seen: &Mutex<Seen>) -> Value {
    let request = &review["request"];
    let name = request["object"]["regarding"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    *seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .attempts
        .entry(name.clone())
        .or_default() += 1;
    let mut response = json!({"uid": request["uid"], "allowed": true});
    if name.starts_with("slow-") {
        seen.lock().unwrap_or_else(|p| p.into_inner()).holding += 1;
        tokio::time::sleep(HOLD).await;
        seen.lock().unwrap_or_else(|p| p.into_inner()).holding -= 1;
    } else if name.starts_with("fail-") {
        response = json!({"uid": request["uid"], "allowed": false,
            "status": {"code": 500, "message": "the event store is failing (test webhook)"}});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}
