//! Per-test namespaces.

use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

/// A namespace that belongs to one test.
pub struct TestNamespace {
    /// Its name: the prefix, the process id and a counter.
    pub name: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestNamespace {
    pub(crate) async fn create(client: &kube::Client, prefix: &str) -> Result<TestNamespace> {
        let name = format!(
            "{}-{}-{}",
            prefix.to_lowercase().replace('_', "-"),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("wcm-test".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<ServiceAccount>::namespaced(client.clone(), &name)
            .create(&PostParams::default(), &sa)
            .await
        {
            Ok(_) => {}
            // A real cluster's controller-manager may have made it already.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("create ServiceAccount default in {name}"));
            }
        }
        Ok(TestNamespace { name })
    }

    /// Deletes the namespace. On the local cluster it stays Terminating (no namespace controller
    /// runs there); on a real cluster it is removed with everything in it.
    pub async fn delete(self, client: &kube::Client) -> Result<()> {
        Api::<Namespace>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}
