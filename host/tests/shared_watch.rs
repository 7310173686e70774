//! Shared informers: however many plugins watch Pods, the API server sees one Pod watch; when the
//! last plugin goes, the watch goes too. Counted with the apiserver's own
//! `apiserver_longrunning_requests{verb="WATCH",resource="pods"}`.
//! Its own test binary, so no other test's watches are counted.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use wasm_controller_manager::loading::plugins::FileStatus;

async fn pod_watches(env: &testenv::TestEnv) -> Result<f64> {
    env.apiserver_metric(
        "apiserver_longrunning_requests",
        &[("verb", "WATCH"), ("resource", "pods")],
    )
    .await
}

async fn running(m: &wasm_controller_manager::app::Manager) -> usize {
    m.plugins
        .status()
        .await
        .values()
        .filter(|s| matches!(s, FileStatus::Running { .. }))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn plugins_on_the_same_kind_share_one_watch() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let baseline = pod_watches(env).await?;
    let dir = temp_dir("shared-watch")?;
    let manager = start_manager(test_config(&dir)).await?;
    assert_eq!(pod_watches(env).await?, baseline, "no plugin, no watch");

    let mut installed = 0;
    for target in [1, 3, 5, 20] {
        while installed < target {
            let name = format!("noop-{installed}");
            std::fs::write(
                dir.join(format!("{name}.toml")),
                format!("name = \"{name}\"\n"),
            )?;
            install(&dir, "noop", &format!("{name}.wasm"))?;
            installed += 1;
        }
        grant_dir(&dir).await?;
        eventually(
            &format!("{target} plugins running"),
            Duration::from_secs(60),
            || async { Ok((running(&manager).await == target).then_some(())) },
        )
        .await?;
        assert_eq!(
            manager.informers.running(),
            1,
            "{target} plugins: one informer"
        );
        let watches = eventually(
            "the watch count to settle",
            Duration::from_secs(20),
            || async {
                let n = pod_watches(env).await? - baseline;
                Ok((n >= 1.0).then_some(n))
            },
        )
        .await?;
        assert_eq!(
            watches, 1.0,
            "{target} plugins on Pods opened {watches} watches"
        );
    }

    for i in 0..installed {
        std::fs::remove_file(dir.join(format!("noop-{i}.wasm")))?;
    }
    eventually("all plugins stopped", Duration::from_secs(30), || async {
        Ok((running(&manager).await == 0).then_some(()))
    })
    .await?;
    eventually(
        "the informer and its watch are released",
        Duration::from_secs(30),
        || async {
            Ok(
                (manager.informers.running() == 0 && pod_watches(env).await? == baseline)
                    .then_some(()),
            )
        },
    )
    .await?;
    manager.stop().await;
    Ok(())
}
