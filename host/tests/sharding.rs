//! The host's shard arithmetic (`engine::shard`, issue #28) against the real API server with its
//! `ShardedListAndWatch` gate on (testenv turns it on): for a split of the hash space into three,
//! the API server's answer to each range's `shardSelector` is exactly the objects the host's own
//! test (`shard::holds`) puts there, by UID and by namespace; the three answers are disjoint and
//! together are every object. So the server-side mode and the host-side fallback agree.

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
    use wasm_controller_manager::engine::informer::{
        Change, InformerKey, InformerObserver, Informers, ShardedStream,
    };
    struct Quiet;
    impl InformerObserver for Quiet {}
    let shared = testenv::TestEnv::shared().await?;
    let own = testenv::TestEnv::start_own(&["--sharded-list-and-watch=false"]).await?;
    for (env, gate) in [(shared, true), (&own, false)] {
        let client = env.client().await?;
        let ns = env.namespace("sharded-informer").await?;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        let key = InformerKey {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespace: Some(ns.name.clone()),
            label_selector: None,
            metadata_only: false,
            shard: Some(ShardedStream {
                by: ShardBy::Uid,
                count: 4,
                plugin: "p".into(),
            }),
        };
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
