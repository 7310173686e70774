//! No write as a plugin leaves a replica after another replica took the plugin's Lease, proven by
//! the API server's audit log. Two host processes share two plugins (`--leader-elect-mode
//! per-plugin`); a validating admission webhook holds the plugins' writes about `slow-*`
//! ConfigMaps (their patches, and the Events they record about them) for 10 s each, so writes are
//! in flight at the API server when a Lease moves:
//!
//! 1. **Given up**: the first process leads both plugins; a second joins, and the first gives up
//!    the Lease past its share while that plugin's writes are held;
//! 2. **Lost**: the webhook holds the second process's Lease renewals, so it cannot renew, while
//!    its writes are held; the first takes the Lease once it has expired.
//!
//! Each request carries its replica's identity in its User-Agent; the moment a replica acquired a
//! Lease is when the API server received its first write of that Lease. No write as the plugin
//! that the API server accepted from the old holder may have completed after that moment.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// How long the webhook holds each write about a `slow-*` object: longer than the lease duration.
const HOLD: Duration = Duration::from_secs(10);
/// The two plugins (copies of event-recorder); by name, the second is the one given up.
const KEPT: &str = "lease-writer-a";
const MOVED: &str = "lease-writer-b";
const PLUGIN_USERS: &str = "system:serviceaccount:wcm-system:wcm-plugin-lease-writer-";

fn lease_of(plugin: &str) -> String {
    format!("wasm-controller-manager-plugin-{plugin}")
}

/// What the webhook does and saw.
#[derive(Default)]
struct Webhook {
    /// Writes about `slow-*` objects held now, by plugin.
    holding: std::collections::HashMap<String, u32>,
    /// Lease renewals whose holder starts with this are held (then refused): that replica cannot
    /// renew.
    frozen: Option<String>,
}

struct Host(Child);

impl Host {
    fn start(dir: &Path, kubeconfig: &Path, lease_ns: &str, log: &Path, pod: &str) -> Result<Host> {
        let child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .env("POD_NAME", pod)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--plugins-dir")
            .arg(dir)
            .args([
                "--leader-elect",
                "--leader-elect-resource-namespace",
                lease_ns,
            ])
            .args(["--leader-elect-mode", "per-plugin"])
            .args(["--leader-elect-lease-duration", "6s"])
            .args(["--leader-elect-renew-deadline", "4s"])
            .args(["--leader-elect-retry-period", "500ms"])
            .args(["--rescan-seconds", "2", "--retry-base-ms", "200"])
            .args(["--api-timeout-seconds", "30"])
            .args(["--metrics-addr", "off"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Host(child))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The holder of `plugin`'s Lease.
async fn holder(leases: &Api<Lease>, plugin: &str) -> Result<String> {
    Ok(leases
        .get_opt(&lease_of(plugin))
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default())
}

/// The replica of a plugin Lease's holder (`IDENTITY-GENERATION`): what its User-Agent names.
fn replica(holder: &str) -> &str {
    holder.rsplit_once('-').map_or(holder, |(r, _)| r)
}

/// Waits until `plugin`'s Lease is held by the replica started as `pod`; its holder.
async fn held_by(leases: &Api<Lease>, plugin: &str, pod: &str) -> Result<String> {
    eventually(
        &format!("{plugin} led by {pod}"),
        Duration::from_secs(60),
        || async {
            let h = holder(leases, plugin).await?;
            Ok(h.starts_with(&format!("{pod}_")).then_some(h))
        },
    )
    .await
}

/// Waits for the webhook to hold at least `n` writes as `plugin` at once.
async fn writes_held(hook: &Mutex<Webhook>, plugin: &str, n: u32) -> Result<()> {
    eventually(
        &format!("{n} writes as {plugin} held at the API server"),
        Duration::from_secs(60),
        || async {
            let hook = hook.lock().unwrap_or_else(|p| p.into_inner());
            let held = hook.holding.get(plugin).copied().unwrap_or(0);
            Ok((held >= n).then_some(()))
        },
    )
    .await
}

/// Checks the audit log since `mark`: when replica `new` first wrote `plugin`'s Lease (acquired
/// it), and that no write as the plugin from replica `old` that the API server accepted completed
/// after that moment. Returns how many writes as the plugin `old` sent since `mark`.
fn no_write_after_the_hand_off(
    env: &testenv::TestEnv,
    mark: testenv::AuditMark,
    lease_ns: &str,
    plugin: &str,
    old: &str,
    new: &str,
) -> Result<usize> {
    let events = env.audit_events_since(mark)?;
    let by = |e: &testenv::AuditEvent, who: &str| e.user_agent.contains(&format!("({who})"));
    let ok = |e: &testenv::AuditEvent| e.code().is_some_and(|c| (200..300).contains(&c));
    let lease = lease_of(plugin);
    let acquired = events
        .iter()
        .filter(|e| {
            by(e, new)
                && matches!(e.verb.as_str(), "update" | "create")
                && e.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "leases" && o.namespace == lease_ns && o.name == lease
                })
                && ok(e)
        })
        .map(|e| e.request_received_timestamp.clone())
        .min()
        .context("no write of the Lease by its new holder in the audit log")?;
    let plugin_user = format!("system:serviceaccount:wcm-system:wcm-plugin-{plugin}");
    let writes: Vec<_> = events
        .iter()
        .filter(|e| {
            by(e, old)
                && e.effective_user() == plugin_user
                && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
                // An access review the host makes as the plugin (at every rescan) writes nothing.
                && e.object_ref.as_ref().is_some_and(|o| o.api_group != "authorization.k8s.io")
        })
        .collect();
    let landed_after: Vec<String> = writes
        .iter()
        .filter(|e| ok(e) && e.stage_timestamp >= acquired)
        .map(|e| {
            format!(
                "{} {} {:?} received {} completed {}",
                e.verb,
                e.request_uri,
                e.code(),
                e.request_received_timestamp,
                e.stage_timestamp
            )
        })
        .collect();
    let accepted_before = writes
        .iter()
        .filter(|e| ok(e) && e.stage_timestamp < acquired)
        .count();
    println!(
        "{plugin}: {new} acquired the Lease at {acquired}; {old} sent {} writes as the plugin: {accepted_before} accepted before, {} accepted after",
        writes.len(),
        landed_after.len()
    );
    assert!(
        landed_after.is_empty(),
        "writes as {plugin} from the old holder {old} landed after {new} acquired its Lease at {acquired}:\n{}",
        landed_after.join("\n")
    );
    Ok(writes.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn no_write_as_a_plugin_leaves_the_old_holder_after_its_lease_moves() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: the webhook uses the local cluster's serving certificate");
        return Ok(());
    };
    anyhow::ensure!(env.has_audit_log(), "this test reads the audit log");
    let client = env.client().await?;
    let ns = env.namespace("lease-writes").await?;
    let lease_ns = env.namespace("lease-writes-leases").await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let hook = Arc::new(Mutex::new(Webhook::default()));
    let pki = Path::new(&local.dir).join("pki");
    let port = {
        let hook = hook.clone();
        common::webhook::serve(&pki, move |review| {
            let hook = hook.clone();
            async move { decide(&review, &hook).await }
        })
        .await?
    };
    let webhook_name = format!("lease-writes-{}", ns.name);
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let ca = std::fs::read(pki.join("ca.crt"))?;
    webhooks
        .create(
            &PostParams::default(),
            &webhook_config(&webhook_name, &ns.name, &lease_ns.name, port, ca),
        )
        .await?;

    // event-recorder patches each ConfigMap and records an Event about it: two writes per
    // reconcile, the Event from the host's event writer.
    let dir = temp_dir("lease-writes")?;
    for p in [KEPT, MOVED] {
        install(&dir, "event-recorder", &format!("{p}.wasm"))?;
        std::fs::write(dir.join(format!("{p}.toml")), format!("name = \"{p}\"\n"))?;
    }
    grant_dir(&dir).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns.name);
    let logs = temp_dir("lease-writes-logs")?;
    let start = |pod: &str| {
        let log = logs.join(format!("{pod}.log"));
        Host::start(&dir, &kubeconfig, &lease_ns.name, &log, pod)
    };
    let _first = start("first")?;
    held_by(&leases, KEPT, "first").await?;
    let first_b = held_by(&leases, MOVED, "first").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    // 1. Given up: a second replica joins while both plugins' writes are held at the API
    // server; the first gives up the Lease past its share.
    let mark = env.audit_mark()?;
    for i in 0..4 {
        let name = format!("slow-{i}");
        cms.create(&PostParams::default(), &cm(&name, &[("value", "v1")]))
            .await?;
    }
    writes_held(&hook, MOVED, 2).await?;
    let _second = start("second")?;
    let second_b = held_by(&leases, MOVED, "second").await?;
    // Whatever the old holder still had on its way lands (or not) within the hold.
    tokio::time::sleep(HOLD + Duration::from_secs(3)).await;
    let sent = no_write_after_the_hand_off(
        env,
        mark,
        &lease_ns.name,
        MOVED,
        replica(&first_b),
        replica(&second_b),
    )?;
    assert!(
        sent > 0,
        "the first replica sent no write as {MOVED}: the test proves nothing"
    );

    // 2. Lost: the second replica can no longer renew (its renewals are held), while its writes
    // as the plugin are held; the first takes the Lease once it has expired.
    let mark = env.audit_mark()?;
    for i in 0..4 {
        cms.patch(
            &format!("slow-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "v2"}})),
        )
        .await?;
    }
    writes_held(&hook, MOVED, 2).await?;
    hook.lock().unwrap_or_else(|p| p.into_inner()).frozen = Some(replica(&second_b).to_string());
    let first_again = held_by(&leases, MOVED, "first").await?;
    tokio::time::sleep(HOLD + Duration::from_secs(3)).await;
    let sent = no_write_after_the_hand_off(
        env,
        mark,
        &lease_ns.name,
        MOVED,
        replica(&second_b),
        replica(&first_again),
    )?;
    assert!(
        sent > 0,
        "the second replica sent no write as {MOVED}: the test proves nothing"
    );

    webhooks
        .delete(&webhook_name, &DeleteParams::default())
        .await?;
    Ok(())
}

fn webhook_config(
    name: &str,
    namespace: &str,
    lease_namespace: &str,
    port: u16,
    ca: Vec<u8>,
) -> ValidatingWebhookConfiguration {
    let hook = |name: &str, ns: &str, group: &str, operations: &[&str], resources: &[&str]| {
        ValidatingWebhook {
            name: name.into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(30),
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}/validate")),
                ca_bundle: Some(ByteString(ca.clone())),
                ..Default::default()
            },
            namespace_selector: Some(LabelSelector {
                match_labels: Some(
                    [("kubernetes.io/metadata.name".to_string(), ns.to_string())].into(),
                ),
                ..Default::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![group.into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(operations.iter().map(|o| o.to_string()).collect()),
                resources: Some(resources.iter().map(|r| r.to_string()).collect()),
                ..Default::default()
            }]),
            ..Default::default()
        }
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        webhooks: Some(vec![
            hook(
                "configmaps.slow.wcm.test",
                namespace,
                "",
                &["UPDATE"],
                &["configmaps"],
            ),
            hook(
                "events.slow.wcm.test",
                namespace,
                "events.k8s.io",
                &["CREATE", "UPDATE"],
                &["events"],
            ),
            hook(
                "leases.frozen.wcm.test",
                lease_namespace,
                "coordination.k8s.io",
                &["UPDATE"],
                &["leases"],
            ),
        ]),
    }
}

async fn decide(review: &Value, hook: &Mutex<Webhook>) -> Value {
    let request = &review["request"];
    let allow = json!({"uid": request["uid"], "allowed": true});
    let answer = |response: Value| json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    let object = &request["object"];
    match request["resource"]["resource"].as_str().unwrap_or_default() {
        "leases" => {
            let holder = object["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default();
            let frozen = hook
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .frozen
                .clone();
            if frozen.is_some_and(|f| holder.starts_with(&f)) {
                tokio::time::sleep(Duration::from_secs(25)).await;
                return answer(json!({"uid": request["uid"], "allowed": false,
                    "status": {"code": 503, "message": "this replica is cut off (test webhook)"}}));
            }
        }
        resource => {
            let name = match resource {
                "events" => object["regarding"]["name"].as_str(),
                _ => object["metadata"]["name"].as_str(),
            };
            let user = request["userInfo"]["username"].as_str().unwrap_or_default();
            let plugin = user.strip_prefix("system:serviceaccount:wcm-system:wcm-plugin-");
            if let Some(plugin) = plugin
                && user.starts_with(PLUGIN_USERS)
                && name.is_some_and(|n| n.starts_with("slow-"))
            {
                let count = |d: i32| {
                    let mut h = hook.lock().unwrap_or_else(|p| p.into_inner());
                    let n = h.holding.entry(plugin.to_string()).or_default();
                    *n = n.saturating_add_signed(d);
                };
                count(1);
                tokio::time::sleep(HOLD).await;
                count(-1);
            }
        }
    }
    answer(allow)
}
