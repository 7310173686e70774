//! A file whose `describe` meets an exhausted instance pool waits and is described again; it is
//! never refused for good (#23 item 2: a plugin dropped in while others held the pool stayed
//! refused after they finished). The exhaustion is wasmtime's own error, injected with a fail
//! point, so this test needs `--features failpoints`; its own test binary, because fail points
//! are global to the process.
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use wasm_controller_manager::loading::plugins::{FileStatus, WaitReason};

#[tokio::test(flavor = "multi_thread")]
async fn a_describe_that_meets_an_exhausted_pool_waits_and_the_file_loads_once_there_is_room()
-> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("describe-pool").await?;
    let dir = temp_dir("describe-pool")?;
    let manager = start_manager(test_config(&dir)).await?;

    let staging = temp_dir("describe-pool-staging")?;
    grant(&[install(&staging, "well-behaved", "well-behaved.wasm")?]).await?;
    // Every instantiation fails as wasmtime fails when its pool is exhausted.
    fail::cfg("instantiate-pool-exhausted", "return").map_err(anyhow::Error::msg)?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    let waiting = wait_status(&manager, "well-behaved", "waiting for the pool", |s| {
        if let FileStatus::Refused { error } = s {
            panic!("refused for good: {error}");
        }
        matches!(
            s,
            FileStatus::Waiting {
                reason: WaitReason::InstancePool,
                ..
            }
        )
    })
    .await?;
    assert!(
        format!("{waiting:?}").contains("maximum concurrent limit"),
        "{waiting:?}"
    );
    // Tried again while the pool stays exhausted: still waiting, never refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = status_of(&manager, "well-behaved").await;
    assert!(
        matches!(still, Some(FileStatus::Waiting { .. })),
        "{still:?}"
    );

    // The pool has room again: the file loads without being touched, and reconciles.
    fail::remove("instantiate-pool-exhausted");
    wait_status(&manager, "well-behaved", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "after"}, "data": {"value": "room"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    eventually(
        "well-behaved annotates after the pool had room again",
        Duration::from_secs(30),
        || async {
            let a = reconciled_annotations(&cms).await?;
            Ok((a.get("after").map(String::as_str) == Some("room")).then_some(()))
        },
    )
    .await?;
    manager.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}
