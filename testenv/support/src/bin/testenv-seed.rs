//! Prepares a local cluster for `scripts/run-local`: installs the CRDs from `manifests/crds/`, and
//! creates a demo control-plane node, a worker node and a few pods, so the shipped plugins have
//! something to do. Safe to run again (existing objects are kept).
//!
//! Usage: testenv-seed KUBECONFIG

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::de::DeserializeOwned;
use serde_json::json;

async fn create<K>(api: &Api<K>, body: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(body)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: testenv-seed KUBECONFIG")?;
    let kc = Kubeconfig::read_from(&path).with_context(|| format!("read {path}"))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;
    testenv::crds::install_all(&client, &testenv::manifests_dir().join("crds")).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, json!({"metadata": {"name": "control-plane-1", "labels": {"node-role.kubernetes.io/control-plane": ""}}})).await?;
    create(&nodes, json!({"metadata": {"name": "worker-1"}})).await?;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": "demo"}}),
    )
    .await?;
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), "demo"),
        json!({"metadata": {"name": "default"}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    for i in 0..5 {
        create(&pods, json!({"metadata": {"name": format!("demo-{i}")}, "spec": {"containers": [{"name": "c", "image": "registry.invalid/demo:1"}]}})).await?;
    }
    println!("seeded: CRDs, nodes control-plane-1 and worker-1, 5 pods in namespace demo");
    Ok(())
}
