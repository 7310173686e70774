//! The test cluster itself: real API calls, a CRD from manifests/, watches across an apiserver restart.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testenv::TestEnv;

#[tokio::test(flavor = "multi_thread")]
async fn lists_creates_and_watches() -> Result<()> {
    let env = TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("basic").await?;

    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let names: Vec<_> = namespaces
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert!(
        names.contains(&"default".to_string()),
        "namespaces: {names:?}"
    );
    assert!(names.contains(&ns.name), "namespaces: {names:?}");

    let node_name = format!("node-{}", ns.name);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": node_name, "labels": {"node-role.kubernetes.io/control-plane": ""}}
    }))?;
    let created = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    assert_eq!(created.metadata.name.as_deref(), Some(node_name.as_str()));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    assert!(pod.metadata.uid.is_some());
    // No scheduler or kubelet runs here: the pod stays Pending.
    assert_eq!(
        pods.get("p1")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Pending")
    );

    // The Network CRD from manifests/ is installed and served.
    let gvk = GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network");
    let networks: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "networks"),
    );
    let net: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": "example-network"},
        "spec": {"cidr": "192.168.0.0/16", "gateway": "192.168.0.1"}
    }))?;
    networks.create(&PostParams::default(), &net).await?;
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": "no-spec"}, "spec": {"cidr": "10.0.0.0/8"}
    }))?;
    let err = networks
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("schema requires gateway");
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 422),
        "{err:?}"
    );

    // A watch sees a change made after it started.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut stream = watcher(cms.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let writer = cms.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "watched"}, "data": {"k": "v"}}))
                .expect("static json");
        let _ = writer.create(&PostParams::default(), &cm).await;
    });
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(cm) = stream.try_next().await? {
            if cm.metadata.name.as_deref() == Some("watched") {
                return Ok::<_, anyhow::Error>(cm);
            }
        }
        anyhow::bail!("watch ended")
    })
    .await
    .context("no watch event within 20 s")??;
    assert_eq!(
        seen.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("v")
    );
    Ok(())
}
