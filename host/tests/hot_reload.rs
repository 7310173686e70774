//! The plugins directory while the manager runs: bad files are refused with a clear error, a new
//! file starts a plugin, a replaced file (atomic rename, ConfigMap-style symlink swap) switches
//! versions while reconciles are in flight and keeps working, a bad update leaves the previous
//! version running, a removed file stops its plugin and releases its informer.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use wasm_controller_manager::loading::plugins::{FileStatus, WaitReason};

fn sha(s: &FileStatus) -> Option<&str> {
    match s {
        FileStatus::Running { sha256, .. } => Some(sha256),
        _ => None,
    }
}

/// The same component with an extra custom section: another file (another hash), same behaviour.
fn variant(wasm: &Path, tag: u8) -> Result<Vec<u8>> {
    let mut bytes = std::fs::read(wasm)?;
    let name = b"wcm-test";
    bytes.extend_from_slice(&[0, (1 + name.len() + 1) as u8, name.len() as u8]);
    bytes.extend_from_slice(name);
    bytes.push(tag);
    Ok(bytes)
}

/// Writes `bytes` to `dir/file` atomically (write elsewhere, then rename over).
fn replace_atomically(dir: &Path, file: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{file}.new"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(file))?;
    Ok(())
}

async fn all_reconciled(cms: &Api<ConfigMap>, names: &[String]) -> Result<Option<()>> {
    let done = reconciled_annotations(cms).await?;
    Ok(names
        .iter()
        .all(|n| done.get(n).is_some_and(|v| v == n))
        .then_some(()))
}

async fn create_cms(cms: &Api<ConfigMap>, prefix: &str, n: usize) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let cm: ConfigMap = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "data": {"value": name}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
        names.push(name);
    }
    Ok(names)
}

#[tokio::test(flavor = "multi_thread")]
async fn add_replace_and_remove_plugins_while_running() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("reload").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let dir = temp_dir("reload")?;
    let manager = start_manager(test_config(&dir)).await?;

    // Bad files are refused, each with a message naming the cause; nothing starts.
    std::fs::write(dir.join("junk.wasm"), b"this is not wasm")?;
    std::fs::write(dir.join("core.wasm"), b"\0asm\x01\0\0\0")?;
    std::fs::write(dir.join("big.wasm"), vec![0u8; 17 << 20])?;
    // (A file caught half-written is refused too, then looked at again once complete.)
    for (stem, needle) in [
        ("junk", "not a WebAssembly file"),
        ("core", "core WebAssembly module, not a component"),
        ("big", "byte limit"),
    ] {
        wait_status(
            &manager,
            stem,
            needle,
            |s| matches!(s, FileStatus::Refused { error } if error.contains(needle)),
        )
        .await?;
    }
    // A component of another world (a command, no reconciler export).
    install(&dir, "not-a-plugin", "other-world.wasm")?;
    wait_status(&manager, "other-world", "refused as another world", |s| {
        matches!(s, FileStatus::Refused { error } if error.contains("not a plugin of world wcm:reconciler/plugin"))
    })
    .await?;
    // A plugin whose describe traps.
    install(&dir, "describe-panics", "describe-panics.wasm")?;
    wait_status(&manager, "describe-panics", "refused: describe failed", |s| {
        matches!(s, FileStatus::Refused { error } if error.contains("describe failed") && error.contains("deliberate panic in describe"))
    })
    .await?;
    // A plugin whose settings are wrong.
    install(&dir, "well-behaved", "badsettings.wasm")?;
    std::fs::write(dir.join("badsettings.toml"), "workers = \"many\"\n")?;
    let st = wait_status(&manager, "badsettings", "refused", |s| {
        matches!(s, FileStatus::Refused { .. })
    })
    .await?;
    assert!(format!("{st:?}").contains("badsettings.toml"), "{st:?}");
    std::fs::remove_file(dir.join("badsettings.wasm"))?;

    // A new file starts a plugin without a restart.
    let original = plugin("well-behaved")?;
    grant(std::slice::from_ref(&original)).await?;
    install(&dir, "well-behaved", "wb.wasm")?;
    let first = wait_status(&manager, "wb", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    let names = create_cms(&cms, "a", 40).await?;

    // Replaced (atomic rename) while its queue is busy: the new version takes over, nothing fails.
    let reconciled = || {
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "well-behaved"), ("result", "success")],
        )
    };
    eventually(
        "the first version reconciled the 40 objects",
        Duration::from_secs(60),
        || all_reconciled(&cms, &names),
    )
    .await?;
    let before_swap = reconciled();
    replace_atomically(&dir, "wb.wasm", &variant(&original, 1)?)?;
    let second = wait_status(&manager, "wb", "the new version running", |s| {
        sha(s).is_some() && sha(s) != sha(&first)
    })
    .await?;
    eventually(
        "every object reconciled across the switch",
        Duration::from_secs(60),
        || all_reconciled(&cms, &names),
    )
    .await?;
    let errors = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "well-behaved"), ("result", "error")],
    );
    assert_eq!(errors, 0.0, "reconciles failed around the switch");
    // The new version reconciles every key again (a key that failed with the old code gets its
    // chance with the new one), not only keys that change.
    eventually(
        "every key reconciled again by the new version",
        Duration::from_secs(60),
        || async { Ok((reconciled() >= before_swap + 40.0).then_some(())) },
    )
    .await?;

    // A bad update is refused; the previous version keeps running and reconciling.
    replace_atomically(&dir, "wb.wasm", b"garbage")?;
    let st = wait_status(&manager, "wb", "update refused", |s| {
        matches!(
            s,
            FileStatus::Running {
                update_refused: Some(_),
                ..
            }
        )
    })
    .await?;
    assert_eq!(
        sha(&st),
        sha(&second),
        "the previous version must keep running"
    );
    let more = create_cms(&cms, "b", 5).await?;
    eventually(
        "the previous version still reconciles",
        Duration::from_secs(60),
        || all_reconciled(&cms, &more),
    )
    .await?;

    // A duplicate plugin name waits for the file that holds the name.
    install(&dir, "well-behaved", "dup.wasm")?;
    let st = wait_status(&manager, "dup", "waiting for its name", |s| {
        matches!(
            s,
            FileStatus::Waiting {
                reason: WaitReason::NameTaken,
                ..
            }
        )
    })
    .await?;
    assert!(format!("{st:?}").contains("used by wb.wasm"), "{st:?}");
    std::fs::remove_file(dir.join("dup.wasm"))?;

    // A ConfigMap-style mount: NAME.wasm -> ..data/NAME.wasm, ..data -> ..v1; the update swaps ..data.
    let v1 = dir.join("..v1");
    let v2 = dir.join("..v2");
    std::fs::create_dir_all(&v1)?;
    std::fs::create_dir_all(&v2)?;
    std::fs::write(v1.join("mounted.wasm"), variant(&original, 10)?)?;
    std::fs::write(v2.join("mounted.wasm"), variant(&original, 11)?)?;
    std::fs::write(dir.join("mounted.toml"), "name = \"mounted\"\n")?;
    std::os::unix::fs::symlink("..v1", dir.join("..data"))?;
    std::os::unix::fs::symlink("..data/mounted.wasm", dir.join("mounted.wasm"))?;
    grant_dir(&dir).await?;
    let m1 = wait_status(&manager, "mounted", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp"))?;
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).context("swap ..data")?;
    wait_status(&manager, "mounted", "the swapped version running", |s| {
        sha(s).is_some() && sha(s) != sha(&m1)
    })
    .await?;

    // Restore wb, then remove it: it stops; the shared ConfigMap informer stays for `mounted`.
    replace_atomically(&dir, "wb.wasm", &std::fs::read(&original)?)?;
    wait_status(&manager, "wb", "restored", |s| {
        matches!(
            s,
            FileStatus::Running {
                update_refused: None,
                ..
            }
        )
    })
    .await?;
    assert_eq!(
        manager.informers.running(),
        1,
        "two plugins on ConfigMaps share one informer"
    );
    std::fs::remove_file(dir.join("wb.wasm"))?;
    eventually("wb stopped", Duration::from_secs(30), || async {
        Ok(status_of(&manager, "wb").await.is_none().then_some(()))
    })
    .await?;
    assert_eq!(manager.informers.running(), 1);
    std::fs::remove_file(dir.join("mounted.wasm"))?;
    eventually(
        "the last plugin's informer released",
        Duration::from_secs(30),
        || async { Ok((manager.informers.running() == 0).then_some(())) },
    )
    .await?;
    // Its metric series went with it (it had reconciled, so it had some). They are forgotten
    // once its retirement ends, which may be just after the informer is released.
    let left = || -> Vec<String> {
        manager
            .metrics
            .encode()
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("=\"mounted\""))
            .map(str::to_string)
            .collect()
    };
    let gone = eventually(
        "the removed plugin's series forgotten",
        Duration::from_secs(10),
        || async { Ok(left().is_empty().then_some(())) },
    )
    .await;
    assert!(gone.is_ok(), "series of the removed plugin: {:?}", left());
    manager.stop().await;
    Ok(())
}
