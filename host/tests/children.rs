//! Contract 0.3 against the real cluster: the children a reconcile returns are applied with the
//! plugin's field manager and the primary as controller owner, pruned exactly when they leave the
//! set (never an object the plugin did not apply, even with the same labels), a child of an
//! undeclared kind fails alone with an event; and the plugin's own metrics reach `/metrics`, a
//! label flood stops at the series budget, and the series go with the plugin. Judged by what the
//! API server stored and what its audit log saw.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use wasm_controller_manager::loading::plugins::FileStatus;
use wasm_controller_manager::sandbox::tape::RecordWhat;

const PLUGIN: &str = "children-probe";

async fn set_children(cms: &Api<ConfigMap>, children: &str) -> Result<()> {
    cms.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"children": children}})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn children_are_applied_owned_and_pruned_exactly_and_metrics_stay_within_budget() -> Result<()>
{
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("children").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);

    let dir = temp_dir("children")?;
    install(&dir, PLUGIN, "children-probe.wasm")?;
    std::fs::write(dir.join("children-probe.toml"), "max_metric_series = 20\n")?;
    let records = temp_dir("children-records")?;
    let mut cfg = test_config(&dir);
    cfg.record = Some((records.clone(), RecordWhat::All));
    let manager = start_manager(cfg).await?;
    let running = eventually(
        "children-probe running",
        Duration::from_secs(60),
        || async {
            let status = status_of(&manager, "children-probe").await;
            match &status {
                Some(FileStatus::Running { .. }) => Ok(Some(())),
                Some(FileStatus::Refused { .. }) => anyhow::bail!("refused: {status:?}"),
                _ => Ok(None),
            }
        },
    )
    .await;
    if let Err(e) = running {
        let (_, plugins) = http_get(&manager, "/plugins").await?;
        anyhow::bail!("{e}: {plugins}");
    }

    let owner: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owner",
        "labels": {"wcm.test/children": "yes"}},
        "data": {"children": "ConfigMap/a,ConfigMap/b,Service/web"}}))?;
    let owner = cms.create(&PostParams::default(), &owner).await?;
    let owner_uid = owner.metadata.uid.clone().unwrap_or_default();

    // Applied: each child with the plugin's field manager, the primary as controller owner and
    // the ApplySet label; the primary with the ApplySet's ID and kinds.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    for name in ["a", "b"] {
        let made = eventually(
            &format!("child ConfigMap {name}"),
            Duration::from_secs(60),
            || async { Ok(cms.get_opt(name).await?) },
        )
        .await;
        if let Err(e) = made {
            // What the plugin's reconciles said, for the failure message.
            let notes: Vec<String> = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                .collect();
            let (_, text) = http_get(&manager, "/metrics").await?;
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("children-probe") || l.contains("children_probe"))
                .collect();
            anyhow::bail!("{e}: events {notes:?}; metrics {lines:#?}");
        }
    }
    // A child is created before it is applied (so an object made meanwhile fails the create
    // rather than being taken over): a read in between sees no Apply entry yet.
    let applied = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        managers(meta).contains(&(format!("wcm:{PLUGIN}"), "Apply".into()))
    };
    let web = eventually(
        "child Service web, applied",
        Duration::from_secs(60),
        || async {
            Ok(services
                .get_opt("web")
                .await?
                .filter(|s| applied(&s.metadata)))
        },
    )
    .await?;
    let a = eventually(
        "child ConfigMap a, applied",
        Duration::from_secs(30),
        || async { Ok(cms.get_opt("a").await?.filter(|c| applied(&c.metadata))) },
    )
    .await?;
    for meta in [&a.metadata, &web.metadata] {
        let owners = meta.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0].uid, owner_uid);
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
    }
    let id =
        a.metadata.labels.clone().unwrap_or_default()["applyset.kubernetes.io/part-of"].clone();
    let parent = eventually(
        "the primary records its ApplySet",
        Duration::from_secs(30),
        || async {
            let p = cms.get("owner").await?;
            let kinds = p
                .metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .get("applyset.kubernetes.io/contains-group-kinds")
                .cloned();
            Ok((kinds.as_deref() == Some("ConfigMap,Service")).then_some(p))
        },
    )
    .await?;
    assert_eq!(
        parent.metadata.labels.clone().unwrap_or_default()["applyset.kubernetes.io/id"],
        id
    );
    assert!(
        // A merge patch (never creates the primary): an Update by the record's field manager.
        managers(&parent.metadata).contains(&(format!("wcm:{PLUGIN}:applyset"), "Update".into())),
        "{:?}",
        managers(&parent.metadata)
    );

    // An object the plugin did not apply, with the member label and the same owner.
    let intruder: ConfigMap = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "by-hand", "labels": {"applyset.kubernetes.io/part-of": id},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid, "controller": true}]}}),
    )?;
    cms.patch(
        "by-hand",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(&intruder),
    )
    .await?;

    // b leaves the set: exactly it is deleted, by the plugin's identity.
    let mark = env.audit_mark()?;
    set_children(&cms, "ConfigMap/a,Service/web").await?;
    eventually("b pruned", Duration::from_secs(60), || async {
        Ok(cms.get_opt("b").await?.is_none().then_some(()))
    })
    .await?;
    // A reconcile after the prune (the primary's own update) deletes nothing more.
    cms.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"touch": "1"}})),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(cms.get_opt("a").await?.is_some());
    assert!(
        cms.get_opt("by-hand").await?.is_some(),
        "an object the plugin did not apply was pruned"
    );
    assert!(services.get_opt("web").await?.is_some());
    let deletes = deletes_since(env, mark, &ns.name)?;
    assert_eq!(
        deletes,
        vec![format!("configmaps/b by {}", plugin_user(PLUGIN))],
        "exactly b, by the plugin"
    );

    // The reconcile that pruned replays offline from its recording, the same calls answered the
    // same way (the apply of the children, the list, the delete).
    let pruning = std::fs::read_dir(records.join(PLUGIN))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            std::fs::read_to_string(p)
                .is_ok_and(|t| t.contains("client.delete") && t.contains("\"b\""))
        })
        .ok_or_else(|| anyhow::anyhow!("no recording of the pruning reconcile"))?;
    let replayed = replay_offline(&pruning, &common::plugin(PLUGIN)?)?;
    assert!(replayed.contains("client.delete"), "{replayed}");

    // A kind the plugin does not declare: that child fails alone, with a Warning event on the
    // primary; the others stay.
    set_children(&cms, "ConfigMap/a,Service/web,Secret/creds").await?;
    let warned = eventually("a ChildFailed event", Duration::from_secs(60), || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ChildFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("owner")
        }))
    })
    .await?;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    let note = warned.note.unwrap_or_default();
    assert!(note.contains("Secret \"creds\": 403 NotDeclared"), "{note}");
    assert!(secrets.get_opt("creds").await?.is_none());
    assert!(cms.get_opt("a").await?.is_some());
    assert!(services.get_opt("web").await?.is_some());

    // Metrics: the counter and the histogram, then a flood stopped at the budget (20 series).
    let ok = eventually(
        "reconciles{result=ok} on /metrics",
        Duration::from_secs(30),
        || async {
            let v = metric(
                &manager,
                "wcm_plugin_children_probe__reconciles_total",
                &[("result", "ok")],
            );
            Ok((v >= 3.0).then_some(v))
        },
    )
    .await?;
    assert!(ok >= 3.0);
    let (code, text) = http_get(&manager, "/metrics").await?;
    assert_eq!(code, 200);
    assert!(
        text.contains("wcm_plugin_children_probe__children_bucket{le=\"4.0\"}"),
        "{text}"
    );
    cms.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"flood": "500", "children": "ConfigMap/a"}})),
    )
    .await?;
    let refused = eventually(
        "series-budget refusals",
        Duration::from_secs(60),
        || async {
            let v = metric(
                &manager,
                "wcm_plugin_metric_updates_refused_total",
                &[("plugin", PLUGIN), ("reason", "series-budget")],
            );
            // 500 new label values against a budget of 20 series (one is the histogram's,
            // one `ok`): at least 480 refused once the reconcile's updates are all in.
            Ok((v >= 480.0).then_some(v))
        },
    )
    .await?;
    assert!(refused <= 500.0, "{refused}");
    let (_, text) = http_get(&manager, "/metrics").await?;
    let series = text
        .lines()
        .filter(|l| l.starts_with("wcm_plugin_children_probe__reconciles_total{"))
        .count();
    // The budget counts every series line of the plugin: the histogram's 7 (4 buckets, +Inf,
    // sum, count), `ok` and 12 flood values make 20.
    assert_eq!(series, 13, "{text}");

    // The plugin removed: its series go.
    std::fs::remove_file(dir.join("children-probe.wasm"))?;
    eventually(
        "the plugin's series gone",
        Duration::from_secs(30),
        || async {
            let (_, text) = http_get(&manager, "/metrics").await?;
            Ok((!text.contains("wcm_plugin_children_probe")).then_some(()))
        },
    )
    .await?;
    manager.stop().await;
    Ok(())
}

/// The patch that drops a create's `Update` entry, against the real API server: it applies over
/// another manager's write made after the apply (it tests the entry, not the resourceVersion);
/// when the entry moved (an `Apply` entry of another manager is sorted before every `Update`
/// one) the server refuses it with 422 and changes nothing, and the same patch computed on the
/// object read again applies. The host's retry (`FORGET_TRIES`) rests on these three answers.
#[tokio::test(flavor = "multi_thread")]
async fn the_create_entry_is_dropped_over_other_writes_and_refused_when_it_moved() -> Result<()> {
    use wcm_rules::applyset::forget_create;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("forget-create").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let me = "wcm:forget-probe";
    let updates_of = |cm: &ConfigMap, manager: &str| {
        managers(&cm.metadata)
            .iter()
            .filter(|(m, op)| m == manager && op == "Update")
            .count()
    };
    let body = |name: &str, value: &str| -> Result<ConfigMap> {
        Ok(serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"k": value}}),
        )?)
    };
    let post = PostParams {
        field_manager: Some(me.into()),
        ..PostParams::default()
    };
    let apply = |manager: &str| PatchParams::apply(manager);

    // Created, applied, then another manager writes a label (an Update sorted after ours): the
    // patch computed on the apply's answer still applies.
    cms.create(&post, &body("one", "a")?).await?;
    let applied = cms
        .patch("one", &apply(me), &Patch::Apply(body("one", "a")?))
        .await?;
    assert_eq!(
        updates_of(&applied, me),
        1,
        "{:?}",
        managers(&applied.metadata)
    );
    cms.patch(
        "one",
        &PatchParams {
            field_manager: Some("zz-later-writer".into()),
            ..PatchParams::default()
        },
        &Patch::Merge(json!({"metadata": {"labels": {"later": "yes"}}})),
    )
    .await?;
    let patch = forget_create(&serde_json::to_string(&applied)?, me).context("an entry")?;
    let done = cms
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch)?),
        )
        .await?;
    assert_eq!(updates_of(&done, me), 0, "{:?}", managers(&done.metadata));
    assert!(
        managers(&done.metadata).contains(&(me.to_string(), "Apply".into())),
        "{:?}",
        managers(&done.metadata)
    );

    // Created, applied, then another manager applies a field of its own: its Apply entry comes
    // before every Update one, so ours moved. Refused with 422, nothing changed; read again, the
    // patch applies.
    cms.create(&post, &body("two", "a")?).await?;
    let applied = cms
        .patch("two", &apply(me), &Patch::Apply(body("two", "a")?))
        .await?;
    let other: ConfigMap = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "two"}, "data": {"other": "x"}}))?;
    cms.patch("two", &apply("aa-other-applier"), &Patch::Apply(other))
        .await?;
    let stale = forget_create(&serde_json::to_string(&applied)?, me).context("an entry")?;
    let refused = cms
        .patch(
            "two",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(stale)?),
        )
        .await
        .expect_err("the entry moved");
    match &refused {
        kube::Error::Api(s) => assert_eq!(s.code, 422, "{refused}"),
        other => anyhow::bail!("not an API refusal: {other}"),
    }
    let again = cms.get("two").await?;
    assert_eq!(updates_of(&again, me), 1, "{:?}", managers(&again.metadata));
    let fresh = forget_create(&serde_json::to_string(&again)?, me).context("an entry")?;
    let done = cms
        .patch(
            "two",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(fresh)?),
        )
        .await?;
    assert_eq!(updates_of(&done, me), 0, "{:?}", managers(&done.metadata));
    assert!(
        managers(&done.metadata).contains(&("aa-other-applier".to_string(), "Apply".into())),
        "{:?}",
        managers(&done.metadata)
    );
    Ok(())
}
