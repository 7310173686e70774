//! Recordings hold no secret, whatever its shape (issue #23, item 6). Two plugins are recorded
//! (`--record all`) against the real kube-apiserver, with secret settings holding `"`, `\` and a
//! 4-character value:
//!
//! - `secret-leaker`, hostile: logs each value base64- and hex-encoded, reversed, in halves and one
//!   character per line, writes it raw and encoded into a ConfigMap's annotations and fails with
//!   an error holding it;
//! - the shipped network plugin, honest, authenticating to the real Keystone with a password
//!   holding `"` and `\` (JSON-escaped in its token request) and a 4-character username, then
//!   creating a network in the real Neutron; its recording must still replay offline.
//!
//! The recording files' bytes, and every string in them once parsed, are searched for each value
//! in every form the host promises to catch (docs/security.md, "Recordings").

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use testenv::OpenStack;
use testenv::openstack_api::http;
use wasm_controller_manager::sandbox::tape::RecordWhat;

/// Holds `"` and `\`: JSON-escaped wherever a plugin puts it into a JSON body.
const QUOTED: &str = "pa\"ss\\word42";
const BACKSLASHED: &str = "C:\\Users\\w4k";
/// Four characters: the shortest value a recording is searched for.
const FOUR: &str = "Zq~7";

/// Every form of `v` the host promises to keep out of a recording, named.
fn forms(v: &str) -> Vec<(String, String)> {
    let b = v.as_bytes();
    let json1 = serde_json::to_string(v).expect("json");
    let json1 = json1[1..json1.len() - 1].to_string();
    let json2 = serde_json::to_string(&json1).expect("json");
    let json2 = json2[1..json2.len() - 1].to_string();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let form: String = form_urlencoded::byte_serialize(b).collect();
    let pct: String = b
        .iter()
        .map(|&x| {
            if x.is_ascii_alphanumeric() || b"-._~".contains(&x) {
                char::from(x).to_string()
            } else {
                format!("%{x:02X}")
            }
        })
        .collect();
    let mut out = vec![
        ("raw".to_string(), v.to_string()),
        ("json-escaped".into(), json1),
        ("json-escaped twice".into(), json2),
        ("base64".into(), STANDARD.encode(b)),
        ("base64 unpadded".into(), STANDARD_NO_PAD.encode(b)),
        ("base64url".into(), URL_SAFE.encode(b)),
        ("base64url unpadded".into(), URL_SAFE_NO_PAD.encode(b)),
        ("hex".into(), hex.clone()),
        ("HEX".into(), hex.to_ascii_uppercase()),
        ("form-urlencoded".into(), form),
        ("percent-encoded".into(), pct),
    ];
    out.dedup_by(|a, b| a.1 == b.1);
    out
}

/// Every string in a JSON value, object keys included.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => {
            for (k, x) in o {
                out.push(k.clone());
                strings(x, out);
            }
        }
        _ => {}
    }
}

/// Fails naming the file, the value and the form when any form of any value is in a recording.
fn assert_holds_none(file: &Path, values: &[(&str, &str)]) -> Result<()> {
    let bytes = std::fs::read(file)?;
    let text = String::from_utf8_lossy(&bytes);
    let rec: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not JSON", file.display()))?;
    let mut all = Vec::new();
    strings(&rec, &mut all);
    for (name, value) in values {
        for (how, form) in forms(value) {
            if text.contains(&form) {
                bail!(
                    "{}: {name} {how} ({form}) in the file bytes",
                    file.display()
                );
            }
            if let Some(s) = all.iter().find(|s| s.contains(&form)) {
                bail!(
                    "{}: {name} {how} ({form}) in the string {s:?}",
                    file.display()
                );
            }
        }
    }
    Ok(())
}

fn recordings(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn read(file: &Path) -> Result<Value> {
    Ok(serde_json::from_slice(&std::fs::read(file)?)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_plugin_gets_no_form_of_its_secrets_into_a_recording() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("leak").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "leak"},
                "stringData": {"quote": QUOTED, "backslash": BACKSLASHED, "four": FOUR}}))?,
        )
        .await?;
    let dir = temp_dir("leak")?;
    std::fs::write(
        dir.join("secret-leaker.toml"),
        format!(
            "[secrets]\nquote = \"{0}/leak/quote\"\nbackslash = \"{0}/leak/backslash\"\nfour = \"{0}/leak/four\"\n",
            ns.name
        ),
    )?;
    install(&dir, "secret-leaker", "secret-leaker.wasm")?;
    let records = temp_dir("leak-records")?;
    let mut cfg = test_config(&dir);
    cfg.record = Some((records.clone(), RecordWhat::All));
    let manager = start_manager(cfg).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "leak-target", "labels": {"wcm.test/leak": "yes"}}}),
        )?,
    )
    .await?;
    // The plugin held the real values: it wrote them into the cluster.
    let annotated = eventually(
        "leak-target annotated with the raw values",
        Duration::from_secs(60),
        || async {
            let cm = cms.get("leak-target").await?;
            Ok(cm
                .metadata
                .annotations
                .filter(|a| a.contains_key("wcm.test/leaked")))
        },
    )
    .await?;
    assert_eq!(annotated["wcm.test/leak-quote-raw"], QUOTED);
    assert_eq!(annotated["wcm.test/leak-backslash-raw"], BACKSLASHED);
    assert_eq!(annotated["wcm.test/leak-four-raw"], FOUR);
    assert_eq!(annotated["wcm.test/leak-four-b64"], STANDARD.encode(FOUR));
    // A recording of the reconcile that wrote them, and one of a reconcile that saw them in the
    // object it was handed.
    let plugin_records = records.join("secret-leaker");
    let (patching, seeing) = eventually(
        "recordings of the leaking patch and of the annotated object",
        Duration::from_secs(60),
        || async {
            let mut patching = None;
            let mut seeing = None;
            for f in recordings(&plugin_records) {
                let rec = read(&f)?;
                if rec["request"]["name"] != "leak-target" {
                    continue;
                }
                let calls = rec["calls"].as_array().cloned().unwrap_or_default();
                if calls.iter().any(|c| c["call"] == "client.patch") {
                    patching = Some(rec);
                } else if rec["request"]["object"]
                    .as_str()
                    .is_some_and(|o| o.contains("wcm.test/leaked"))
                {
                    seeing = Some(rec);
                }
            }
            Ok(patching.zip(seeing))
        },
    )
    .await?;
    manager.stop().await;

    // What the plugin did is there, with placeholders where the values were.
    let patch = patching["calls"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["call"] == "client.patch"))
        .context("the patch")?;
    let body = patch["args"]["body"].as_str().context("patch body")?;
    for name in ["quote", "backslash", "four"] {
        assert!(
            body.contains(&format!("redacted-secret-{name}")),
            "{name}: {body}"
        );
    }
    assert!(
        seeing["request"]["object"]
            .as_str()
            .is_some_and(|o| o.contains("redacted-secret-four")),
        "{seeing}"
    );
    // The plugin's free text is withheld: every log line is its level alone, the error its
    // terminal flag.
    for rec in [&patching, &seeing] {
        assert_eq!(rec["free_text_withheld"], true, "{rec}");
        let logs: Vec<&Value> = rec["calls"]
            .as_array()
            .context("calls")?
            .iter()
            .filter(|c| c["call"] == "log.log")
            .collect();
        assert!(logs.len() >= 3 * 4, "{rec}");
        for l in logs {
            assert_eq!(l["args"]["text"], "withheld", "{l}");
            assert!(l["args"].get("message").is_none(), "{l}");
        }
        assert_eq!(
            rec["result"],
            json!({"error": {"message": "withheld", "terminal": true}})
        );
    }

    let values = [
        ("quote", QUOTED),
        ("backslash", BACKSLASHED),
        ("four", FOUR),
        ("quote reversed", "24drow\\ss\"ap"),
        ("backslash reversed", "k4w\\sresU\\:C"),
    ];
    let files = recordings(&plugin_records);
    assert!(!files.is_empty());
    for f in &files {
        assert_holds_none(f, &values)?;
    }
    // The test can fail: the cluster's own copy holds the forms the files must not.
    let cm = serde_json::to_string(&cms.get("leak-target").await?)?;
    assert!(cm.contains(&STANDARD.encode(QUOTED)) && cm.contains("5A717E37"));
    Ok(())
}

fn networks_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A Keystone user `name` with `password`, member of the test project.
fn keystone_user(os: &OpenStack, name: &str, password: &str) -> Result<()> {
    let i = os.info();
    let admin = os.admin_token()?;
    let k = &i.keystone_url;
    let domains = http(
        &format!("{k}/domains?name={}", i.user_domain_name),
        "GET",
        Some(&admin),
        None,
    )?;
    let domain = domains.body["domains"][0]["id"]
        .as_str()
        .context("the users' domain")?;
    let made = http(
        &format!("{k}/users"),
        "POST",
        Some(&admin),
        Some(
            &json!({"user": {"name": name, "password": password, "domain_id": domain,
            "enabled": true}}),
        ),
    )?;
    if made.status != 201 {
        bail!("Keystone user create: {} {}", made.status, made.body);
    }
    let user = made.body["user"]["id"].as_str().context("user id")?;
    let roles = http(&format!("{k}/roles?name=member"), "GET", Some(&admin), None)?;
    let role = roles.body["roles"][0]["id"]
        .as_str()
        .context("role member")?;
    let granted = http(
        &format!("{k}/projects/{}/users/{user}/roles/{role}", i.project_id),
        "PUT",
        Some(&admin),
        None,
    )?;
    if granted.status != 204 {
        bail!("Keystone role grant: {} {}", granted.status, granted.body);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_honest_plugin_s_password_and_token_stay_out_and_it_still_replays() -> Result<()> {
    const USER: &str = "r4dx";
    let os = OpenStack::start().await?;
    keystone_user(&os, USER, QUOTED)?;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net-redact").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "openstack"},
                "stringData": {"username": USER, "password": QUOTED}}))?,
        )
        .await?;
    let i = os.info().clone();
    let authority = |url: &str| -> String {
        let rest = url.trim_start_matches("http://");
        rest.split('/').next().unwrap_or(rest).to_string()
    };
    let dir = temp_dir("net-redact")?;
    // A fresh instance per call: each recording holds the token request.
    std::fs::write(
        dir.join("network.toml"),
        format!(
            "isolation = \"call\"\nallowed_hosts = [\"{}\", \"{}\"]\n[config]\nkeystone-url = \"{}\"\nneutron-url = \"{}\"\nproject-name = \"{}\"\n[secrets]\nusername = \"{5}/openstack/username\"\npassword = \"{5}/openstack/password\"\n",
            authority(&i.keystone_url),
            authority(&i.neutron_url),
            i.keystone_url,
            i.neutron_url,
            i.project_name,
            ns.name,
        ),
    )?;
    install(&dir, "network", "network.wasm")?;
    let records = temp_dir("net-redact-records")?;
    let mut cfg = test_config(&dir);
    cfg.limits.cpu_deadline = Duration::from_secs(1);
    cfg.record = Some((records.clone(), RecordWhat::All));
    let manager = start_manager(cfg).await?;
    let api = networks_api(&client, &ns.name);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
            "metadata": {"name": "plum"},
            "spec": {"cidr": "10.61.0.0/24", "gateway": "10.61.0.1"},
        }))?,
    )
    .await?;
    let creating = eventually(
        "a recording of the reconcile that created plum in Neutron",
        Duration::from_secs(90),
        || async { recording_creating_network(&records.join("network"), &ns.name, "plum") },
    )
    .await?;
    manager.stop().await;

    let rec = read(&creating)?;
    let http_calls = rec["http"].as_array().context("http")?;
    let token_request = http_calls
        .iter()
        .find(|x| {
            x["args"]["uri"]
                .as_str()
                .is_some_and(|u| u.ends_with("/auth/tokens"))
        })
        .context("no Keystone token request in the recording")?;
    let sent = token_request["args"]["body"].as_str().context("body")?;
    assert!(sent.contains("redacted-secret-password"), "{sent}");
    assert!(sent.contains("redacted-secret-username"), "{sent}");
    let subject = token_request["answer"]["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|p| p[0] == "x-subject-token"))
        .context("no X-Subject-Token in the recorded answer")?;
    assert_eq!(subject[1], "redacted");
    // Keystone's tokens here are Fernet tokens: base64url of a version byte 0x80, "gAAAAA…".
    for f in recordings(&records.join("network")) {
        assert_holds_none(&f, &[("password", QUOTED), ("username", USER)])?;
        let text = std::fs::read_to_string(&f)?;
        assert!(
            !text.contains("gAAAAA"),
            "{}: a Keystone token",
            f.display()
        );
    }

    // Offline, the same calls and result.
    let text = replay_offline(&creating, &dir.join("network.wasm"))?;
    assert!(text.contains("same calls and result as recorded"), "{text}");
    Ok(())
}
