//! The shipped sample-controller (kubernetes/sample-controller's Foo → Deployment, written with
//! children and the SDK's helpers) against the real cluster: a Foo gets its Deployment applied by
//! the plugin's field manager and owned by the Foo; the Foo's status follows the Deployment's;
//! a new `deploymentName` replaces the Deployment (the old one deleted by the plugin's identity,
//! as the audit log shows); a Deployment the Foo does not control is left as it was, with a
//! Warning event on the Foo. The CRD is the shipped `manifests/crds/foos.samplecontroller.k8s.io.json`
//! (the test cluster installs every CRD there).

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch};
use kube::api::{PatchParams, PostParams};
use serde_json::json;
use wasm_controller_manager::loading::plugins::FileStatus;

const PLUGIN: &str = "sample-controller";

fn a_foo(name: &str, deployment_name: &str, replicas: i32) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": {"name": name},
        "spec": {"deploymentName": deployment_name, "replicas": replicas}
    }))?)
}

async fn events_about(events: &Api<Event>, name: &str) -> Result<Vec<(String, String)>> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.type_.unwrap_or_default()))
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foo_gets_its_deployment_and_status_a_rename_replaces_it_and_a_foreign_one_stays()
-> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("foos").await?;
    let foos: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "samplecontroller.k8s.io",
            "v1alpha1",
            "Foo",
        )),
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);

    let started = std::time::Instant::now();
    let dir = temp_dir("sample-controller")?;
    install(&dir, "sample_controller", "sample-controller.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    eventually(
        "sample-controller running",
        Duration::from_secs(60),
        || async {
            match status_of(&manager, PLUGIN).await {
                Some(FileStatus::Running { .. }) => Ok(Some(())),
                s @ Some(FileStatus::Refused { .. }) => anyhow::bail!("refused: {s:?}"),
                _ => Ok(None),
            }
        },
    )
    .await?;

    println!("{:?}: A Foo", started.elapsed());
    // A Foo: its Deployment, applied by the plugin and owned by the Foo; a status; an event.
    let made = foos
        .create(&PostParams::default(), &a_foo("example-foo", "web-a", 2)?)
        .await?;
    let uid = made.metadata.uid.clone().unwrap_or_default();
    let web_a = eventually("Deployment web-a", Duration::from_secs(60), || async {
        Ok(deployments.get_opt("web-a").await?)
    })
    .await?;
    assert_eq!(web_a.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let owners = web_a.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller
        ),
        ("Foo", uid.as_str(), Some(true))
    );
    // The host creates the Deployment first (so an object made meanwhile fails the create rather
    // than being taken over), then applies it and drops the create's `Update` entry: a read in
    // between sees only that entry. Once settled, the plugin's fields are its applied ones only.
    eventually(
        "the plugin's Apply entry and no Update entry of its manager",
        Duration::from_secs(30),
        || async {
            let d = deployments.get("web-a").await?;
            let managers = managers(&d.metadata);
            let applied = managers.contains(&(format!("wcm:{PLUGIN}"), "Apply".into()));
            let updated = managers.contains(&(format!("wcm:{PLUGIN}"), "Update".into()));
            Ok((applied && !updated).then_some(()))
        },
    )
    .await?;
    eventually(
        "the Foo's status and a Synced event",
        Duration::from_secs(30),
        || async {
            let f = foos.get("example-foo").await?;
            let status = f.data["status"]["availableReplicas"].as_i64();
            let synced = events_about(&events, "example-foo")
                .await?
                .contains(&("Synced".into(), "Normal".into()));
            Ok((status == Some(0) && synced).then_some(()))
        },
    )
    .await?;

    println!(
        "{:?}: The Deployment's controller reports two available",
        started.elapsed()
    );
    // The Deployment's controller reports two available replicas: the Foo says so.
    deployments
        .patch_status(
            "web-a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"availableReplicas": 2, "readyReplicas": 2, "replicas": 2}}),
            ),
        )
        .await?;
    eventually(
        "the Foo reports 2 available",
        Duration::from_secs(30),
        || async {
            let f = foos.get("example-foo").await?;
            Ok((f.data["status"]["availableReplicas"].as_i64() == Some(2)).then_some(()))
        },
    )
    .await?;

    println!("{:?}: A new name", started.elapsed());
    // A new name: web-b is applied, web-a deleted, by the plugin's own identity.
    let mark = env.audit_mark()?;
    foos.patch(
        "example-foo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"deploymentName": "web-b"}})),
    )
    .await?;
    eventually(
        "web-b applied and web-a pruned",
        Duration::from_secs(60),
        || async {
            let b = deployments.get_opt("web-b").await?.is_some();
            let a = deployments.get_opt("web-a").await?.is_none();
            Ok((a && b).then_some(()))
        },
    )
    .await?;
    // The writer's audit line follows its change in etcd by a moment: read until it is there.
    let deletes = eventually(
        "the delete in the audit log",
        Duration::from_secs(10),
        || async {
            let d = deletes_since(env, mark, &ns.name)?;
            Ok((!d.is_empty()).then_some(d))
        },
    )
    .await?;
    assert_eq!(
        deletes,
        vec![format!("deployments/web-a by {}", plugin_user(PLUGIN))]
    );

    println!("{:?}: A Deployment someone else made", started.elapsed());
    // The CRD bounds the replicas as upstream's does: a Foo asking for 100 Pods is refused.
    let refused = foos
        .create(&PostParams::default(), &a_foo("greedy-pods", "many", 100)?)
        .await
        .expect_err("replicas above 10");
    assert!(refused.to_string().contains("spec.replicas"), "{refused}");

    // A Deployment someone else made: the Foo naming it does not take it over.
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "taken"},
        "spec": {"replicas": 7, "selector": {"matchLabels": {"app": "other"}},
            "template": {"metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    deployments.create(&PostParams::default(), &foreign).await?;
    foos.create(&PostParams::default(), &a_foo("greedy", "taken", 1)?)
        .await?;
    eventually(
        "a ChildFailed event on greedy",
        Duration::from_secs(60),
        || async {
            let failed = events_about(&events, "greedy")
                .await?
                .contains(&("ChildFailed".into(), "Warning".into()));
            Ok(failed.then_some(()))
        },
    )
    .await?;
    let taken = deployments.get("taken").await?;
    assert_eq!(taken.spec.as_ref().and_then(|s| s.replicas), Some(7));
    assert!(taken.metadata.owner_references.is_none());
    manager.stop().await;
    Ok(())
}
