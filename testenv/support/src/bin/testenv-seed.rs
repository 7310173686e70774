//! Prepares a local cluster for `scripts/run-local`: installs the CRDs from `manifests/crds/`, and
//! creates a demo control-plane node, a worker node and a few pods, so the shipped plugins have
//! something to do. Given the ready line of `testenv/openstack/openstack.py serve`, it also creates
//! the Secret with the network plugin's OpenStack credentials and a sample Network. Safe to run again
//! (existing objects are kept).
//!
//! Usage: testenv-seed KUBECONFIG [OPENSTACK_READY_JSON]

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
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
    if let Some(ready) = std::env::args().nth(2) {
        let text = std::fs::read_to_string(&ready).with_context(|| format!("read {ready}"))?;
        let info: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or_default())
            .with_context(|| format!("{ready} is not the OpenStack ready line"))?;
        create(
            &Api::<Secret>::namespaced(client.clone(), "demo"),
            json!({"metadata": {"name": "openstack"}, "stringData": {
                "id": info["application_credential_id"],
                "secret": info["application_credential_secret"],
            }}),
        )
        .await?;
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
        let networks: Api<DynamicObject> = Api::namespaced_with(client.clone(), "demo", &ar);
        let sample: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
            "metadata": {"name": "example-network"},
            "spec": {"cidr": "192.168.0.0/24", "gateway": "192.168.0.1"},
        }))?;
        match networks.create(&PostParams::default(), &sample).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        println!("seeded: Secret demo/openstack and Network demo/example-network");
    }
    Ok(())
}
