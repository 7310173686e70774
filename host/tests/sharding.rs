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
