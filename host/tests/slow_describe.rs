//! A slow plugin cannot stall loading: while one file's `describe` sleeps, another file dropped in
//! starts within seconds, a revoked grant is enforced within one rescan, and the sleeper is refused
//! when its describe is late twice; while a removed plugin's calls sleep, its stop holds up no
//! other file, and its name stays taken until the stop is done. Judged by what the API server saw:
//! the late plugins' writes in the audit log, and the revocation by the API server's own answer to
//! the plugin's access review.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use wasm_controller_manager::loading::plugins::{FileStatus, WaitReason};

async fn still_loading(manager: &wasm_controller_manager::app::Manager, what: &str) -> Result<()> {
    let st = status_of(manager, "slow-describe").await;
    anyhow::ensure!(
        st == Some(FileStatus::Loading),
        "{what}: the slow describe should still be running, but slow-describe.wasm is {st:?}"
    );
    Ok(())
}

/// Drops a copy of well-behaved named `name` into `dir`, acting in `ns` only (so its writes are its
/// reconciles of this test's objects), grants it, creates the ConfigMap `cm_name` in `ns`, and waits
/// (15 s) until the audit log shows the plugin's own patch of it.
async fn drop_in_and_see_it_write(
    env: &testenv::TestEnv,
    dir: &std::path::Path,
    ns: &str,
    name: &str,
    cm_name: &str,
) -> Result<()> {
    let wasm = dir.join(format!("{name}.wasm"));
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(plugin("well-behaved")?, &tmp)?;
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!("name = \"{name}\"\nnamespaces = [\"{ns}\"]\n"),
    )?;
    std::fs::rename(&tmp, &wasm)?;
    grant(std::slice::from_ref(&wasm)).await?;
    let mark = env.audit_mark()?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client().await?, ns);
    cms.create(&PostParams::default(), &cm(cm_name, &[("value", "v")]))
        .await?;
    eventually(
        &format!("{name} patches {cm_name} (audit log)"),
        Duration::from_secs(15),
        || async {
            let patched = env.audit_events_since(mark)?.iter().any(|e| {
                e.verb == "patch"
                    && e.effective_user() == plugin_user(name)
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|o| o.name == cm_name && o.namespace == ns)
                    && e.code() == Some(200)
            });
            Ok(patched.then_some(()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_describe_delays_no_other_load_nor_a_revocation() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("slow-describe").await?;
    let dir = temp_dir("slow-describe")?;

    // A running plugin whose grant is revoked later (it watches Pods and writes nothing).
    install(&dir, "noop", "victim.wasm")?;
    std::fs::write(dir.join("victim.toml"), "name = \"victim\"\n")?;
    let mut cfg = test_config(&dir);
    // Long enough that everything below happens while the describe still sleeps (it sleeps 100 s).
    cfg.describe_timeout = Duration::from_secs(20);
    let manager = start_manager(cfg).await?;
    wait_status(&manager, "victim", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;

    // The sleeper: its describe parks in WASI for 100 s.
    let slow_since = Instant::now();
    install(&dir, "slow-describe", "slow-describe.wasm")?;
    wait_status_within(
        &manager,
        "slow-describe",
        "loading",
        Duration::from_secs(15),
        |s| *s == FileStatus::Loading,
    )
    .await?;

    // A plugin dropped in beside it starts within seconds and writes (as itself) to the cluster.
    let dropped = Instant::now();
    drop_in_and_see_it_write(env, &dir, &ns.name, "late", "seen-by-late").await?;
    let started_in = dropped.elapsed();
    still_loading(&manager, "when the late plugin had started").await?;
    assert!(
        started_in < Duration::from_secs(15),
        "the late plugin took {started_in:?}"
    );

    // The victim's grant is revoked: within one rescan (2 s here) it stops and waits.
    let mut deleted = 0;
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    if crbs.get_opt("wcm-plugin:victim").await?.is_some() {
        crbs.delete("wcm-plugin:victim", &DeleteParams::default())
            .await?;
        deleted += 1;
    }
    let rbs: Api<RoleBinding> = Api::all(client.clone());
    for rb in rbs
        .list(&ListParams::default().fields("metadata.name=wcm-plugin:victim"))
        .await?
    {
        let ns = rb
            .metadata
            .namespace
            .context("a RoleBinding has a namespace")?;
        Api::<RoleBinding>::namespaced(client.clone(), &ns)
            .delete("wcm-plugin:victim", &DeleteParams::default())
            .await?;
        deleted += 1;
    }
    assert!(deleted > 0, "the victim's grant was not found");
    let revoked = Instant::now();
    wait_status_within(
        &manager,
        "victim",
        "waits for its grant after the revocation",
        Duration::from_secs(10),
        |s| {
            matches!(
                s,
                FileStatus::Waiting {
                    reason: WaitReason::Forbidden,
                    ..
                }
            )
        },
    )
    .await?;
    let enforced_in = revoked.elapsed();
    still_loading(&manager, "when the revocation was enforced").await?;

    // Late once: it waits and is tried once more (a busy host can make an honest plugin late).
    wait_status_within(
        &manager,
        "slow-describe",
        "waits after its first late describe",
        Duration::from_secs(30),
        |s| {
            matches!(
                s,
                FileStatus::Waiting {
                    reason: WaitReason::SlowDescribe,
                    ..
                }
            )
        },
    )
    .await?;
    // Late twice: refused at its second deadline, not after its 100 s sleep.
    let st = wait_status_within(
        &manager,
        "slow-describe",
        "refused at the second describe deadline",
        Duration::from_secs(40),
        |s| matches!(s, FileStatus::Refused { .. }),
    )
    .await?;
    let refused_after = slow_since.elapsed();
    assert!(
        format!("{st:?}").contains("deadline"),
        "the refusal names the deadline: {st:?}"
    );
    assert!(
        refused_after < Duration::from_secs(60),
        "refused after {refused_after:?}"
    );
    println!(
        "late plugin wrote {started_in:?} after it was dropped in; revocation enforced in {enforced_in:?}; slow describe refused after {refused_after:?}"
    );
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_that_waits_for_sleeping_calls_delays_no_other_load() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("slow-stop").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let dir = temp_dir("slow-stop")?;
    install(&dir, "sleeper", "sleeper.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    wait_status(&manager, "sleeper", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    // Its reconcile of this ConfigMap sleeps 30 s in WASI: a stop waits for that call.
    cms.create(
        &PostParams::default(),
        &cm("sleep", &[("sleep_seconds", "30")]),
    )
    .await?;
    eventually(
        "the sleeper's call runs",
        Duration::from_secs(20),
        || async {
            let running = metric(
                &manager,
                "controller_runtime_active_workers",
                &[("controller", "sleeper")],
            );
            Ok((running >= 1.0).then_some(()))
        },
    )
    .await?;

    // Removed while its call sleeps; another file with its name and a new plugin are dropped in.
    std::fs::remove_file(dir.join("sleeper.wasm"))?;
    let removed = Instant::now();
    install(&dir, "sleeper", "sleeper-again.wasm")?;
    drop_in_and_see_it_write(env, &dir, &ns.name, "late-after-stop", "seen-after-stop").await?;
    let started_in = removed.elapsed();
    // The other file under the sleeper's name waits until the old controller has stopped.
    let st = status_of(&manager, "sleeper-again").await;
    assert!(
        matches!(
            &st,
            Some(FileStatus::Waiting {
                reason: WaitReason::NameTaken,
                message,
                ..
            }) if message.contains("still stopping")
        ),
        "while the old sleeper stops, its name is taken: {st:?}"
    );
    wait_status_within(
        &manager,
        "sleeper-again",
        "runs once the old controller has stopped",
        Duration::from_secs(60),
        |s| matches!(s, FileStatus::Running { .. }),
    )
    .await?;
    let took_over_in = removed.elapsed();
    assert!(
        took_over_in >= Duration::from_secs(15),
        "the name was free after {took_over_in:?}, before the sleeping call could have ended"
    );
    println!(
        "new plugin wrote {started_in:?} after the removal; the name was free after {took_over_in:?}"
    );
    manager.stop().await;
    Ok(())
}
