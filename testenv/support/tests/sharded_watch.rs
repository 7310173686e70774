//! What the test cluster's API server does with a `shardSelector` (KEP-5866, gate
//! `ShardedListAndWatch`, which testenv turns on unless `--sharded-list-and-watch=false`): with the
//! gate, a list and a watch carry only the objects whose 64-bit FNV-1a hash of `metadata.uid`
//! falls in the range, the same hash computed here; without it, the selector is ignored and every
//! object comes (what a client must detect to fall back to filtering itself). The facts issue #28's
//! sharded mode builds on.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent};

/// 64-bit FNV-1a, as the API server hashes a shard key (`k8s.io/apimachinery/pkg/sharding`).
fn fnv1a64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const HALF: &str = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";

/// Percent-encodes a query value (everything but unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn make(api: &Api<ConfigMap>, name: &str) -> Result<String> {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    let made = api.create(&PostParams::default(), &cm).await?;
    made.metadata.uid.context("no uid")
}

/// The names a list with `HALF` returns, and the names whose uid hashes into it.
async fn listed_and_expected(
    client: &kube::Client,
    ns: &str,
    uids: &[(String, String)],
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/configmaps?shardSelector={}",
        encode(HALF)
    ))
    .body(Vec::new())?;
    let list: k8s_openapi::List<ConfigMap> = client.request(req).await?;
    let listed = list
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("cm-"))
        .collect();
    let expected = uids
        .iter()
        .filter(|(_, uid)| fnv1a64(uid) < 0x8000_0000_0000_0000)
        .map(|(n, _)| n.clone())
        .collect();
    Ok((listed, expected))
}

#[test]
fn the_hash_is_fnv1a_64() {
    // The FNV-1a test vectors (Fowler, Noll, Vo): "" and "a".
    assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_a_list_and_a_watch_carry_only_the_requested_shard() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("shard").await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut uids = Vec::new();
    for i in 0..40 {
        let name = format!("cm-{i:02}");
        uids.push((name.clone(), make(&api, &name).await?));
    }
    let (listed, expected) = listed_and_expected(&client, &ns.name, &uids).await?;
    assert!(
        !expected.is_empty() && expected.len() < uids.len(),
        "40 uids all on one side of the half: {expected:?}"
    );
    assert_eq!(listed, expected, "the list carries exactly the shard");

    // A watch from now: of 30 new objects, only the shard's come.
    let rv = api
        .list_metadata(&Default::default())
        .await?
        .metadata
        .resource_version
        .context("no resourceVersion")?;
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=8&shardSelector={}",
        ns.name,
        encode(HALF)
    ))
    .body(Vec::new())?;
    let mut events = client.request_events::<ConfigMap>(req).await?.boxed();
    let mut new = Vec::new();
    for i in 0..30 {
        let name = format!("cm-new-{i:02}");
        new.push((name.clone(), make(&api, &name).await?));
    }
    let mut seen = BTreeSet::new();
    while let Some(e) = events.next().await {
        if let WatchEvent::Added(cm) = e? {
            seen.extend(cm.metadata.name);
        }
    }
    let expected: BTreeSet<String> = new
        .iter()
        .filter(|(_, uid)| fnv1a64(uid) < 0x8000_0000_0000_0000)
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(seen, expected, "the watch carries exactly the shard");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_gate_the_selector_is_ignored_and_every_object_comes() -> Result<()> {
    let env = testenv::TestEnv::start_own(&["--sharded-list-and-watch=false"]).await?;
    let client = env.client().await?;
    let ns = env.namespace("unsharded").await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut uids = Vec::new();
    for i in 0..20 {
        let name = format!("cm-{i:02}");
        uids.push((name.clone(), make(&api, &name).await?));
    }
    let (listed, expected) = listed_and_expected(&client, &ns.name, &uids).await?;
    let all: BTreeSet<String> = uids.iter().map(|(n, _)| n.clone()).collect();
    assert!(expected.len() < all.len(), "20 uids all in the half");
    assert_eq!(listed, all, "without the gate the shardSelector is ignored");
    Ok(())
}
