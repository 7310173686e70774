//! The config-reloader, a plugin written in Python (plugins/config-reloader-py, built with
//! componentize-py from the same WIT world), loaded by the same host against the real cluster: it
//! sets the hash of the ConfigMaps a Deployment's Pods use on the Pod template, changes it when one
//! of them changes (rolling the Pods) and records an event, and leaves it alone when an unused
//! ConfigMap changes. Run with a fresh instance per call (NAME.toml) and with the warm instance
//! per worker the plugin declares for itself; the reconcile time of each is printed.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const HASH: &str = "config-reloader.wcm.io/config-hash";

fn template_hash(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(HASH)
        .cloned()
}

async fn hash_changed_from(
    deployments: &Api<Deployment>,
    old: Option<&str>,
    what: &str,
) -> Result<String> {
    eventually(what, Duration::from_secs(60), || async {
        let h = template_hash(&deployments.get("web").await?);
        Ok(h.filter(|h| Some(h.as_str()) != old))
    })
    .await
}

async fn set_value(cms: &Api<ConfigMap>, name: &str, value: &str) -> Result<()> {
    cms.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": value}})),
    )
    .await?;
    Ok(())
}

/// `isolation`: what NAME.toml sets, if anything (the plugin declares "worker" for itself).
async fn reloads_deployments(isolation: Option<&str>) -> Result<()> {
    let label = isolation.unwrap_or("declared");
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace(&format!("py-{label}")).await?;
    let dir = temp_dir("python")?;
    install(&dir, "config_reloader", "config-reloader.wasm")?;
    if let Some(isolation) = isolation {
        std::fs::write(
            dir.join("config-reloader.toml"),
            format!("isolation = \"{isolation}\"\n"),
        )?;
    }
    grant_dir(&dir).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for (name, wakes) in [("web-config", true), ("web-files", false), ("unused", true)] {
        let mut cm = json!({"metadata": {"name": name}, "data": {"value": "1"}});
        if wakes {
            cm["metadata"]["labels"] = json!({"config-reloader.wcm.io/deployment": "web"});
        }
        cms.create(&PostParams::default(), &serde_json::from_value(cm)?)
            .await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"config-reloader.wcm.io/enabled": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "web", "image": "nginx",
                        "envFrom": [{"configMapRef": {"name": "web-config"}}],
                        "volumeMounts": [{"name": "files", "mountPath": "/etc/web"}],
                    }],
                    "volumes": [{"name": "files", "configMap": {"name": "web-files"}}],
                }
            }
        }
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;

    let mut cfg = test_config(&dir);
    // The component embeds CPython (18 MB): the command line's default limit, not the tests'.
    cfg.max_plugin_bytes = 64 << 20;
    let manager = start_manager(cfg).await?;
    let running = wait_status_within(
        &manager,
        "config-reloader",
        "running",
        Duration::from_secs(60),
        |s| {
            matches!(
                s,
                wasm_controller_manager::loading::plugins::FileStatus::Running { .. }
            )
        },
    )
    .await;
    if running.is_err() {
        println!("status: {:?}", status_of(&manager, "config-reloader").await);
    }
    running?;

    // The operator's NAME.toml wins; without it, the plugin's own declaration.
    let (_, debug) = http_get(&manager, "/debug/controllers").await?;
    let debug: serde_json::Value = serde_json::from_str(&debug)?;
    assert_eq!(
        debug["plugins"][0]["isolation"],
        isolation.unwrap_or("worker"),
        "{debug}"
    );

    let first = hash_changed_from(&deployments, None, "the hash is set").await?;
    assert_eq!(first.len(), 64, "{first}");
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first}");

    // A used ConfigMap changes: a new hash (the Pods roll), and an event on the Deployment.
    set_value(&cms, "web-config", "2").await?;
    let second =
        hash_changed_from(&deployments, Some(&first), "the hash follows web-config").await?;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    let event = eventually("a ConfigChanged event", Duration::from_secs(30), || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ConfigChanged")))
    })
    .await?;
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("web")
    );
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("web-config"),
        "{:?}",
        event.note
    );

    // An unused ConfigMap that wakes the Deployment: reconciled, and the hash stays.
    let reconciles = |m: &wasm_controller_manager::app::Manager| {
        metric(
            m,
            "controller_runtime_reconcile_total",
            &[("controller", "config-reloader")],
        )
    };
    let before = reconciles(&manager);
    set_value(&cms, "unused", "2").await?;
    eventually(
        "the unused ConfigMap's change is reconciled",
        Duration::from_secs(30),
        || async { Ok((reconciles(&manager) > before).then_some(())) },
    )
    .await?;
    // Let that reconcile (and anything it would cause) finish before looking.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = template_hash(&deployments.get("web").await?).context("hash gone")?;
    assert_eq!(now, second, "an unused ConfigMap changed the hash");

    let count = reconciles(&manager);
    let seconds = metric(
        &manager,
        "controller_runtime_reconcile_time_seconds_sum",
        &[("controller", "config-reloader")],
    );
    println!(
        "isolation {label}: {count} reconciles, {:.1} ms each on average (debug host build)",
        seconds * 1000.0 / count.max(1.0)
    );
    manager.stop().await;
    Ok(())
}

/// One after the other: the second start finds the component in the compile cache.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_plugin_reloads_deployments_in_both_isolation_modes() -> Result<()> {
    reloads_deployments(Some("call")).await?;
    reloads_deployments(None).await
}

/// children-py (Python, contract 0.3) against the real cluster: its children are applied with its
/// field manager and owner, one it stops returning is pruned, its counter reaches `/metrics`, and
/// `inspect` shows its schedule.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_plugin_returns_children_updates_its_metrics_and_declares_a_schedule() -> Result<()>
{
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("py-children").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let dir = temp_dir("py-children")?;
    let wasm = install(&dir, "children_py", "children-py.wasm")?;

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("inspect")
        .arg(&wasm)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("wcm:reconciler@0.3.0"), "{text}");
    assert!(
        text.contains("hourly \"@hourly\" (Europe/Berlin) → every primary object"),
        "{text}"
    );
    assert!(
        text.contains("wcm_plugin_children_py__children_total"),
        "{text}"
    );

    let mut cfg = test_config(&dir);
    // CPython is inside: about 18 MB.
    cfg.max_plugin_bytes = 64 << 20;
    let manager = start_manager(cfg).await?;
    let primary: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "p",
        "labels": {"wcm.test/py-children": "yes"}}, "data": {"children": "a,b"}}))?;
    let primary = cms.create(&PostParams::default(), &primary).await?;
    let uid = primary.metadata.uid.clone().unwrap_or_default();
    for name in ["p-a", "p-b"] {
        let child = eventually(
            &format!("child {name}"),
            Duration::from_secs(90),
            || async { Ok(cms.get_opt(name).await?) },
        )
        .await;
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let (_, plugins) = http_get(&manager, "/plugins").await?;
                let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
                let notes: Vec<String> = events
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                    .collect();
                anyhow::bail!("{e}: {plugins} {notes:?}");
            }
        };
        let owner = child.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owner.first().map(|o| o.uid.as_str()), Some(uid.as_str()));
        let managers: Vec<String> = child
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(
            managers.iter().any(|m| m == "wcm:children-py"),
            "{managers:?}"
        );
    }
    cms.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"children": "a"}})),
    )
    .await?;
    eventually("p-b pruned", Duration::from_secs(60), || async {
        Ok(cms.get_opt("p-b").await?.is_none().then_some(()))
    })
    .await?;
    assert!(cms.get_opt("p-a").await?.is_some());
    let counted = metric(
        &manager,
        "wcm_plugin_children_py__children_total",
        &[("lang", "python")],
    );
    assert!(counted >= 3.0, "{counted}");
    manager.stop().await;
    Ok(())
}
