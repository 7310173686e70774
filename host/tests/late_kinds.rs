//! Plugins that cannot start yet, or lose their kind while running, never hold up the others: one
//! plugin's watch is forbidden, another's CRD appears only later and is then deleted and
//! re-created while it is watched. Throughout, `/plugins` answers within a second and a plugin
//! that can run keeps reconciling; each waiting plugin starts on its own once it can.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasm_controller_manager::loading::plugins::FileStatus;

const CRD_NAME: &str = "widgets.faults.wcm.test";

fn widget_crd() -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": "faults.wcm.test",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"value": {"type": "string"}}}
                }}}
            }]
        }
    }))?)
}

async fn install_crd(client: &kube::Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd()?).await?;
    // Established: the kind is served.
    let widgets = widget_api(client, "default");
    eventually(
        "the Widget kind is served",
        Duration::from_secs(30),
        || async { Ok(widgets.list(&Default::default()).await.ok().map(|_| ())) },
    )
    .await
}

async fn delete_crd(client: &kube::Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(CRD_NAME, &DeleteParams::default()).await?;
    eventually(
        "the Widget CRD is gone",
        Duration::from_secs(60),
        || async { Ok(crds.get_opt(CRD_NAME).await?.is_none().then_some(())) },
    )
    .await
}

fn widget_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("faults.wcm.test", "v1", "Widget"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn create_widget(client: &kube::Client, ns: &str, name: &str, value: &str) -> Result<()> {
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "faults.wcm.test/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": value}
    }))?;
    widget_api(client, ns)
        .create(&PostParams::default(), &w)
        .await
        .with_context(|| format!("create Widget {name}"))?;
    Ok(())
}

async fn widget_reconciled(client: &kube::Client, ns: &str, name: &str, value: &str) -> Result<()> {
    let widgets = widget_api(client, ns);
    eventually(
        &format!("Widget {name} reconciled to {value}"),
        Duration::from_secs(60),
        || async {
            let w = widgets.get(name).await?;
            Ok((w
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("wcm.test/reconciled"))
                == Some(&value.to_string()))
            .then_some(()))
        },
    )
    .await
}

/// A ConfigMap change reaches the plugin that can run.
async fn still_reconciling(cms: &Api<ConfigMap>, value: &str) -> Result<()> {
    cms.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": value}})),
    )
    .await?;
    eventually(
        &format!("well-behaved reconciles cm to {value}"),
        Duration::from_secs(30),
        || async {
            let a = reconciled_annotations(cms).await?;
            Ok((a.get("cm") == Some(&value.to_string())).then_some(()))
        },
    )
    .await
}

fn waiting_because(reason: &'static str) -> impl Fn(&FileStatus) -> bool {
    move |s| format!("{s:?}").contains(reason)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forbidden_watch_and_a_late_crd_hold_up_no_one() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    // A run that failed half-way on a kept cluster may have left the CRD behind.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(CRD_NAME).await?.is_some() {
        delete_crd(&client).await?;
    }
    let ns = env.namespace("late").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"value": "v0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;

    let dir = temp_dir("late")?;
    let well_behaved = install(&dir, "well-behaved", "well-behaved.wasm")?;
    install(&dir, "secret-reader", "secret-reader.wasm")?;
    let widget_annotator = install(&dir, "widget-annotator", "widget-annotator.wasm")?;
    // Only well-behaved is granted; secret-reader never is, widget-annotator once its kind exists.
    grant(std::slice::from_ref(&well_behaved)).await?;
    let manager = start_manager_ungranted(test_config(&dir)).await?;

    // `/plugins` polled every 100 ms for the whole test: its slowest answer is kept.
    let slowest_ms = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (slowest_ms, failures, done) = (slowest_ms.clone(), failures.clone(), done.clone());
        let addr = manager.metrics_addr;
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let started = Instant::now();
                let answered = match addr {
                    Some(addr) => {
                        tokio::time::timeout(Duration::from_secs(5), http_get_at(addr, "/plugins"))
                            .await
                            .is_ok_and(|r| r.is_ok_and(|(code, _)| code == 200))
                    }
                    None => false,
                };
                if !answered {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                slowest_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    still_reconciling(&cms, "v1").await?;
    wait_status(
        &manager,
        "secret-reader",
        "waits: forbidden",
        waiting_because("may not"),
    )
    .await?;
    wait_status(
        &manager,
        "widget-annotator",
        "waits: its kind is not served",
        |s| matches!(s, FileStatus::Waiting { .. }),
    )
    .await?;
    assert_eq!(
        metric(
            &manager,
            "wcm_plugin_waiting",
            &[("plugin", "widget-annotator"), ("reason", "not_served")]
        ),
        1.0,
        "{:?}",
        status_of(&manager, "widget-annotator").await
    );
    // A while later, the others are unaffected.
    tokio::time::sleep(Duration::from_secs(10)).await;
    still_reconciling(&cms, "v2").await?;

    // The CRD appears and the operator grants the plugin: it starts on its own.
    install_crd(&client).await?;
    grant(std::slice::from_ref(&widget_annotator)).await?;
    create_widget(&client, &ns.name, "w1", "one").await?;
    widget_reconciled(&client, &ns.name, "w1", "one").await?;

    // The CRD is deleted while watched (its Widgets go with it): the plugin stops and waits. The
    // CRD is re-created: the plugin starts again on its own and reaches a new Widget.
    delete_crd(&client).await?;
    wait_status(
        &manager,
        "widget-annotator",
        "waits again: its kind is gone",
        |s| matches!(s, FileStatus::Waiting { .. }),
    )
    .await?;
    still_reconciling(&cms, "v3").await?;
    install_crd(&client).await?;
    create_widget(&client, &ns.name, "w2", "two").await?;
    widget_reconciled(&client, &ns.name, "w2", "two").await?;
    still_reconciling(&cms, "v4").await?;

    // secret-reader waited throughout and never ran.
    assert!(waiting_because("may not")(
        &status_of(&manager, "secret-reader")
            .await
            .context("secret-reader has no status")?
    ));
    done.store(true, Ordering::Relaxed);
    poller.await?;
    let slowest = slowest_ms.load(Ordering::Relaxed);
    println!("/plugins: slowest answer {slowest} ms");
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "/plugins failed to answer"
    );
    assert!(slowest < 1000, "/plugins took {slowest} ms to answer");
    manager.stop().await;
    delete_crd(&client).await?;
    Ok(())
}

/// A Secret named in NAME.toml that does not exist yet: the plugin waits (not served, with the
/// Secret in the reason) and starts on its own once the Secret is created, without a file change;
/// when the Secret is rotated, the plugin runs with the new value and every key is reconciled
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_created_late_then_rotated() -> Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("late-secret").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let dir = temp_dir("late-secret")?;
    std::fs::write(
        dir.join("secret-echo.toml"),
        format!("[secrets]\ntoken = \"{}/echo/token\"\n", ns.name),
    )?;
    install(&dir, "secret-echo", "secret-echo.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;

    let status = wait_status(&manager, "secret-echo", "waits for its Secret", |s| {
        matches!(s, FileStatus::Waiting { .. })
    })
    .await?;
    assert!(format!("{status:?}").contains("echo"), "{status:?}");
    assert_eq!(
        metric(
            &manager,
            "wcm_plugin_waiting",
            &[("plugin", "secret-echo"), ("reason", "not_served")]
        ),
        1.0
    );

    let token = |value: &str| -> Result<Secret> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": "echo"}, "stringData": {"token": value}}),
        )?)
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(&PostParams::default(), &token("one")?)
        .await?;
    let echoed = |want: &'static str| {
        let cms = cms.clone();
        async move {
            eventually(
                &format!("c annotated with the token {want}"),
                Duration::from_secs(30),
                || async {
                    let c = cms.get("c").await?;
                    Ok((c
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("wcm.test/token"))
                        == Some(&want.to_string()))
                    .then_some(()))
                },
            )
            .await
        }
    };
    echoed("one").await?;
    secrets
        .patch(
            "echo",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": "two"}})),
        )
        .await?;
    echoed("two").await?;
    manager.stop().await;
    Ok(())
}
