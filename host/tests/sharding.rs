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

/// The informer of a sharded plugin (`InformerKey::shard`) lists and then watches only its
/// ranges: its cache holds exactly the objects the host's own test puts there, and an object made
/// afterwards arrives only if it is in them. Without the gate (a cluster of this test's own) the
/// API server ignores the selector and the cache holds every object: the host-side filter divides
/// the work then.
#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_informer_caches_only_its_ranges_and_everything_without_the_gate() -> Result<()> {
    use wasm_controller_manager::engine::informer::{InformerKey, InformerObserver, Informers};
    struct Quiet;
    impl InformerObserver for Quiet {}
    let shared = testenv::TestEnv::shared().await?;
    let own = testenv::TestEnv::start_own(&["--sharded-list-and-watch=false"]).await?;
    for (env, gate) in [(shared, true), (&own, false)] {
        let client = env.client().await?;
        let ns = env.namespace("sharded-informer").await?;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        let mut uids = Vec::new();
        for i in 0..40 {
            let cm: ConfigMap = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("cm-{i}")}}),
            )?;
            let made = api.create(&PostParams::default(), &cm).await?;
            uids.push((format!("cm-{i}"), made.metadata.uid.context("uid")?));
        }
        let ranges = shard::split(4)[1..3].to_vec();
        let key = InformerKey {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespace: Some(ns.name.clone()),
            label_selector: None,
            metadata_only: false,
            shard: Some((ShardBy::Uid, ranges.clone())),
        };
        let informers = Informers::new(client.clone(), std::sync::Arc::new(Quiet));
        let informer = informers.acquire(key);
        tokio::time::timeout(std::time::Duration::from_secs(30), informer.wait_synced()).await?;
        let mine = |uid: &str| shard::holds(ShardBy::Uid, &ranges, uid, None);
        let cached: BTreeSet<String> = informer
            .store()
            .all()
            .iter()
            .map(|o| o.key.name.clone())
            .collect();
        let want: BTreeSet<String> = uids
            .iter()
            .filter(|(_, uid)| !gate || mine(uid))
            .map(|(n, _)| n.clone())
            .collect();
        assert_eq!(cached, want, "gate {gate}: the list");
        assert!(want.len() < 40 || !gate, "a half of 40 objects");
        // Objects made now come by the watch, only those in the ranges (with the gate).
        let mut later = Vec::new();
        for i in 40..60 {
            let cm: ConfigMap = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("cm-{i}")}}),
            )?;
            let made = api.create(&PostParams::default(), &cm).await?;
            later.push((format!("cm-{i}"), made.metadata.uid.context("uid")?));
        }
        let expected: BTreeSet<String> = uids
            .iter()
            .chain(&later)
            .filter(|(_, uid)| !gate || mine(uid))
            .map(|(n, _)| n.clone())
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let cached: BTreeSet<String> = informer
                .store()
                .all()
                .iter()
                .map(|o| o.key.name.clone())
                .collect();
            if cached == expected {
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "gate {gate}: the watch; cached {cached:?}, expected {expected:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
