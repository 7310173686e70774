//! Fault test: the apiserver is killed and started again while a watch is open.
//! It lives in its own test binary (so its own cluster): stopping the apiserver would break the
//! tests running beside it.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testenv::TestEnv;

#[tokio::test(flavor = "multi_thread")]
async fn watch_resumes_after_apiserver_restart() -> Result<()> {
    let env = TestEnv::shared().await?;
    if !env.can_restart_apiserver() {
        eprintln!("skipped: the apiserver of an existing cluster cannot be restarted by the tests");
        return Ok(());
    }
    let client = env.client().await?;
    let ns = env.namespace("restart").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm = |name: &str| -> Result<ConfigMap> {
        Ok(serde_json::from_value(json!({"metadata": {"name": name}}))?)
    };

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let watch_api = cms.clone();
    let watch = tokio::spawn(async move {
        // The default backoff of kube-runtime's watcher reconnects with jitter; any error is retried.
        let mut stream = watcher(watch_api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(item) = stream.next().await {
            if let Ok(cm) = item
                && tx.send(cm.metadata.name.unwrap_or_default()).is_err()
            {
                break;
            }
        }
    });

    cms.create(&PostParams::default(), &cm("before")?).await?;
    wait_for(&mut rx, "before").await?;

    env.stop_apiserver().await?;
    assert!(
        cms.get("before").await.is_err(),
        "the apiserver still answers after stop"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.start_apiserver().await?;

    cms.create(&PostParams::default(), &cm("after")?).await?;
    wait_for(&mut rx, "after").await?;
    watch.abort();
    Ok(())
}

async fn wait_for(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(seen) = rx.recv().await {
            if seen == name {
                return Ok(());
            }
        }
        anyhow::bail!("watch task ended")
    })
    .await
    .with_context(|| format!("the watch did not deliver {name:?} within 60 s"))?
}
