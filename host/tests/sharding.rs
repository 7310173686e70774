//! The host's shard arithmetic (`engine::shard`, issue #28) against the real API server with its
//! `ShardedListAndWatch` gate on (testenv turns it on): for a split of the hash space into three,
//! the API server's answer to each range's `shardSelector` is exactly the objects the host's own
//! test (`shard::holds`) puts there, by UID and by namespace; the three answers are disjoint and
//! together are every object. So the server-side mode and the host-side fallback agree. A sharded
//! stream caches only its ranges and follows their changes; the gate is told on from off; the
//! host's read before a deletion reconcile finds a primary made again under a new UID.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use wasm_controller_manager::engine::shard::{self, ShardBy};

async fn listed(client: &kube::Client, path: &str, selector: &str) -> Result<BTreeSet<String>> {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", selector)
        .append_pair("labelSelector", "wcm.test/sharding")
        .finish();
    let req = http::Request::get(format!("{path}?{query}")).body(Vec::new())?;
    let list: k8s_openapi::List<ConfigMap> = client.request(req).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|c| Some(format!("{}/{}", c.metadata.namespace?, c.metadata.name?)))
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn each_range_of_a_split_is_served_exactly_as_the_host_computes_it() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    // Six namespaces of ten ConfigMaps each.
    let mut objects = Vec::new();
    for n in 0..6 {
        let ns = env.namespace("shards").await?;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        for i in 0..10 {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("cm-{n}-{i}"), "labels": {"wcm.test/sharding": "yes"}}
            }))?;
            let made = api.create(&PostParams::default(), &cm).await?;
            let uid = made.metadata.uid.context("uid")?;
            objects.push((ns.name.clone(), format!("{}/cm-{n}-{i}", ns.name), uid));
        }
    }
    let all: BTreeSet<String> = objects.iter().map(|(_, k, _)| k.clone()).collect();
    for by in [ShardBy::Uid, ShardBy::Namespace] {
        let mut union = BTreeSet::new();
        for range in shard::split(3) {
            let selector = shard::selector(by, &[range]);
            let got = listed(&client, "/api/v1/configmaps", &selector).await?;
            let want: BTreeSet<String> = objects
                .iter()
                .filter(|(ns, _, uid)| shard::holds(by, &[range], uid, Some(ns)))
                .map(|(_, k, _)| k.clone())
                .collect();
            assert_eq!(got, want, "{by:?} {selector}");
            assert!(union.is_disjoint(&got), "{by:?}: ranges overlap");
            union.extend(got);
        }
        assert_eq!(union, all, "{by:?}: the split covers every object");
    }
    Ok(())
}

/// A sharded plugin's stream of the ConfigMaps of `ns` (by UID, four ranges).
fn sharded_configmaps(
    ns: &str,
    label_selector: Option<&str>,
) -> wasm_controller_manager::engine::informer::InformerKey {
    wasm_controller_manager::engine::informer::InformerKey {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespace: Some(ns.to_string()),
        label_selector: label_selector.map(str::to_string),
        metadata_only: false,
        shard: Some(wasm_controller_manager::engine::informer::ShardedStream {
            by: ShardBy::Uid,
            count: 4,
            plugin: "p".into(),
        }),
    }
}

/// The names of the ConfigMaps an informer's cache holds now.
fn cached(informer: &wasm_controller_manager::engine::informer::Informer) -> BTreeSet<String> {
    informer
        .store()
        .all()
        .iter()
        .map(|o| o.key.name.clone())
        .collect()
}

/// Waits until `informer`'s cache holds exactly `expected`.
async fn cache_becomes(
    informer: &wasm_controller_manager::engine::informer::Informer,
    expected: &BTreeSet<String>,
    what: &str,
) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = cached(informer);
        if &now == expected {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{what}: cached {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A sharded plugin's own stream (`InformerKey::shard`) lists and then watches only the ranges it
/// is given: its cache holds exactly the objects the host's own test puts there, and an object
/// made afterwards arrives only if it is in them. When its ranges change, the stream starts again
/// with the new ones: the objects of a range given up leave the cache without a deletion told to
/// its subscribers, those of a range taken arrive, and `covered` names the new ranges once they
/// are listed. `shard_watch::served` tells the gate on from the gate off (a cluster of this
/// test's own), where the API server ignores the selector and the stream holds every object.
#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_stream_caches_only_its_ranges_follows_their_changes_and_the_gate_is_detected()
-> Result<()> {
    use wasm_controller_manager::engine::informer::{Change, InformerObserver, Informers};
    struct Quiet;
    impl InformerObserver for Quiet {}
    let shared = testenv::TestEnv::shared().await?;
    let own = testenv::TestEnv::start_own(&["--sharded-list-and-watch=false"]).await?;
    for (env, gate) in [(shared, true), (&own, false)] {
        let client = env.client().await?;
        let ns = env.namespace("sharded-informer").await?;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        let key = sharded_configmaps(&ns.name, None);
        // Told apart before any object exists: the answer does not depend on what is listed.
        assert_eq!(
            wasm_controller_manager::engine::shard_watch::served(&client, &key, ShardBy::Uid)
                .await?,
            gate,
            "the gate detected"
        );
        let mut uids = Vec::new();
        for i in 0..40 {
            let cm: ConfigMap = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("cm-{i}")}}),
            )?;
            let made = api.create(&PostParams::default(), &cm).await?;
            uids.push((format!("cm-{i}"), made.metadata.uid.context("uid")?));
        }
        let quarters = shard::split(4);
        let ranges = quarters[1..3].to_vec();
        let (held, held_rx) = tokio::sync::watch::channel(ranges.clone());
        let informers = Informers::new(client.clone(), std::sync::Arc::new(Quiet));
        let informer = informers.acquire_sharded(key, held_rx);
        tokio::time::timeout(std::time::Duration::from_secs(30), informer.wait_synced()).await?;
        let in_ranges = |ranges: &[shard::Range], objs: &[(String, String)]| -> BTreeSet<String> {
            objs.iter()
                .filter(|(_, uid)| !gate || shard::holds(ShardBy::Uid, ranges, uid, None))
                .map(|(n, _)| n.clone())
                .collect()
        };
        let want = in_ranges(&ranges, &uids);
        assert_eq!(cached(&informer), want, "gate {gate}: the list");
        assert!(
            !gate || (5..35).contains(&want.len()),
            "about a half of 40 objects: {}",
            want.len()
        );
        assert_eq!(*informer.covered().borrow(), ranges, "covered once listed");
        // Objects made now come by the watch, only those in the ranges (with the gate).
        for i in 40..60 {
            let cm: ConfigMap = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("cm-{i}")}}),
            )?;
            let made = api.create(&PostParams::default(), &cm).await?;
            uids.push((format!("cm-{i}"), made.metadata.uid.context("uid")?));
        }
        cache_becomes(
            &informer,
            &in_ranges(&ranges, &uids),
            &format!("gate {gate}: the watch"),
        )
        .await?;
        if !gate {
            continue;
        }
        // Range 1 given up, range 0 taken: the stream follows, and no deletion is told.
        let mut changes = informer.subscribe();
        let now = vec![quarters[0], quarters[2]];
        held.send_replace(now.clone());
        cache_becomes(
            &informer,
            &in_ranges(&now, &uids),
            "after the ranges changed",
        )
        .await?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while *informer.covered().borrow() != now {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "covered did not follow"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let mut applied = BTreeSet::new();
        while let Ok(Some(change)) =
            tokio::time::timeout(std::time::Duration::from_millis(500), changes.recv()).await
        {
            match change {
                Change::Applied { new, .. } => {
                    applied.insert(new.key.name.clone());
                }
                Change::Deleted { old } => {
                    anyhow::bail!("{} was told deleted: its range was given up", old.key.name)
                }
            }
        }
        // The cached objects are replayed to a new subscriber, then the taken range's arrive.
        assert_eq!(
            applied,
            in_ranges(&quarters[0..3], &uids),
            "the replayed objects and the taken range's"
        );
        // No range: nothing cached.
        held.send_replace(Vec::new());
        cache_becomes(&informer, &BTreeSet::new(), "no range held").await?;
    }
    Ok(())
}

/// The host's read before it reconciles a deletion server-side (`shard_watch::live_uid`), against
/// the real API server: a primary deleted and made again under its name answers with its new UID
/// (whatever range that falls in), a deleted one with none; an object outside the stream's label
/// selector or namespace, and a name no object can have (from an owner reference, say), are never
/// asked about.
#[tokio::test(flavor = "multi_thread")]
async fn the_read_before_a_deletion_finds_a_primary_made_again_under_a_new_uid() -> Result<()> {
    use kube::api::DeleteParams;
    use wasm_controller_manager::engine::cache::Key;
    use wasm_controller_manager::engine::shard_watch::{live_uid, may_name};
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("sharded-live").await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let stream = sharded_configmaps(&ns.name, Some("wcm.test/primary=yes"));
    let make = |name: &str, primary: bool| -> Result<ConfigMap> {
        let labels = if primary {
            serde_json::json!({"wcm.test/primary": "yes"})
        } else {
            serde_json::json!({})
        };
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": labels}}),
        )?)
    };
    let key = Key::new(Some(&ns.name), "again");
    let first = api
        .create(&PostParams::default(), &make("again", true)?)
        .await?;
    let first_uid = first.metadata.uid.context("uid")?;
    assert_eq!(
        live_uid(&client, &stream, &key).await?,
        Some(first_uid.clone())
    );
    api.delete("again", &DeleteParams::default()).await?;
    assert_eq!(live_uid(&client, &stream, &key).await?, None, "deleted");
    let second = api
        .create(&PostParams::default(), &make("again", true)?)
        .await?;
    let second_uid = second.metadata.uid.context("uid")?;
    assert_ne!(first_uid, second_uid);
    assert_eq!(
        live_uid(&client, &stream, &key).await?,
        Some(second_uid),
        "made again: the new UID"
    );
    // Outside the stream's label selector: none of its primaries.
    api.create(&PostParams::default(), &make("other", false)?)
        .await?;
    let other = Key::new(Some(&ns.name), "other");
    assert!(may_name(&stream, &other));
    assert_eq!(live_uid(&client, &stream, &other).await?, None);
    // Another namespace than the stream's, and names no object can have: never asked about. A
    // client of an address where nothing listens fails any request it makes, so None from it
    // means none was made.
    let nowhere = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
    assert!(
        live_uid(&nowhere, &stream, &key).await.is_err(),
        "a read through the client that reaches nothing fails"
    );
    let elsewhere = Key::new(Some("default"), "again");
    assert!(!may_name(&stream, &elsewhere));
    assert_eq!(live_uid(&nowhere, &stream, &elsewhere).await?, None);
    for bad in ["a,metadata.name!=x", "a b", "x\nwarn", ""] {
        let k = Key::new(Some(&ns.name), bad);
        assert!(!may_name(&stream, &k), "{bad:?}");
        assert_eq!(live_uid(&nowhere, &stream, &k).await?, None, "{bad:?}");
    }
    Ok(())
}
