//! Compiling a plugin costs hundreds of MiB (Cranelift), and an allocator keeps such a peak for
//! the life of the process. The host compiles in a short-lived child process of its own binary
//! (`sandbox/compiler.rs`), one at a time, with a limit on the child's peak RSS.
//!
//! What proves it is what the kernel saw (`/proc/PID/status` VmHWM: the peak resident set of this
//! process, which plays the host) and, for the limit, the plugin's state as the operator reads
//! it, with the real API server.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use wasm_controller_manager::cluster::services::Services;
use wasm_controller_manager::loading::plugins::FileStatus;
use wasm_controller_manager::sandbox::compiler::{self, ChildCompile};
use wasm_controller_manager::sandbox::{Limits, Runtime, RuntimeSettings};

/// The limit every runtime of this test binary compiles under (the process default, as
/// `--max-compile-memory-mb` sets it in the binary): above what `noop` needs, below what
/// `typed-pod-noop` needs (docs/benchmarks.md).
const LIMIT_MIB: u64 = 100;

/// One test at a time: the first reads this process's peak memory, which another test running
/// beside it would raise.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn host_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wasm-controller-manager"))
}

/// Every runtime of this test binary compiles in a child of the host binary, as the binary does.
fn compile_in_children() {
    compiler::compile_in_child_process(ChildCompile::new(host_binary(), LIMIT_MIB << 20));
}

/// Peak resident memory of this process so far, bytes.
fn peak_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib << 10)
}

fn runtime(child: Option<ChildCompile>, cache: Option<PathBuf>) -> Result<Runtime> {
    Runtime::new(RuntimeSettings {
        max_instances: 4,
        compile_cache: cache,
        child_compile: child,
        ..RuntimeSettings::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_in_a_child_process_does_not_raise_the_hosts_peak_memory() -> Result<()> {
    let _serial = SERIAL.lock().await;
    compile_in_children();
    let wasm = std::fs::read(plugin("typed-pod-noop")?)?;
    let child = ChildCompile::new(host_binary(), 4 << 30);
    // No cache given: the hand-over goes through a private temporary directory.
    let rt = runtime(Some(child), None)?;
    let hand_overs_before = hand_over_dirs()?;
    let before = peak_rss()?;
    let compiled = rt.compile(&wasm)?;
    let grew = peak_rss()?.saturating_sub(before);
    eprintln!(
        "compile child's peak {:?} MiB; this process's peak grew by {} MiB",
        compiled.compile_peak.map(|p| p >> 20),
        grew >> 20
    );
    assert!(
        grew < 48 << 20,
        "this process's peak grew by {} MiB over the compile",
        grew >> 20
    );
    // The compile is the heavy part: in this process it would have raised the peak by as much.
    let child_peak = compiled.compile_peak.context("compiled in a child")?;
    assert!(child_peak > 150 << 20, "child peak {child_peak}");
    // What was mapped from the child's artifact is the plugin.
    let d = rt
        .describe(
            &compiled,
            Arc::new(Services::for_describe("t", Default::default())),
            &Limits::default(),
        )
        .await?;
    assert_eq!(d.name, "typed-pod-noop");
    // The private hand-over directory is gone.
    let left: Vec<_> = hand_over_dirs()?
        .difference(&hand_overs_before)
        .cloned()
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// The private hand-over directories in the temporary directory now (`wcm-compile-` and a random
/// name).
fn hand_over_dirs() -> Result<std::collections::HashSet<std::ffi::OsString>> {
    Ok(std::fs::read_dir(std::env::temp_dir())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("wcm-compile-"))
        .collect())
}

#[test]
fn a_compile_past_its_memory_limit_is_stopped_with_the_reason() -> Result<()> {
    let _serial = SERIAL.blocking_lock();
    compile_in_children();
    let cache = temp_dir("compile-limit-cache")?;
    let child = ChildCompile::new(host_binary(), 64 << 20);
    let rt = runtime(Some(child), Some(cache.clone()))?;
    let started = std::time::Instant::now();
    let err = match rt.compile(&std::fs::read(plugin("typed-pod-noop")?)?) {
        Ok(_) => anyhow::bail!("typed-pod-noop compiled within 64 MiB"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("needed more than 64 MiB (--max-compile-memory-mb 64)"),
        "{err}"
    );
    // Stopped as it passed the limit, not at the end of the compile.
    assert!(started.elapsed() < Duration::from_secs(60));
    // Nothing of it in the cache: no artifact, no temporary file.
    let left: Vec<_> = std::fs::read_dir(&cache)?.collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_whose_compile_passes_the_limit_is_refused_with_the_reason_and_others_run()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    compile_in_children();
    let dir = temp_dir("compile-limit")?;
    let small = install(&dir, "noop", "small.wasm")?;
    std::fs::write(dir.join("small.toml"), "name = \"small\"\n")?;
    install(&dir, "typed-pod-noop", "typed.wasm")?;
    std::fs::write(dir.join("typed.toml"), "name = \"typed\"\n")?;
    // Only `small` is granted: generating `typed`'s RBAC would compile it too.
    grant(&[small]).await?;
    let mut cfg = test_config(&dir);
    // A cache of its own, so nothing compiled by another test is found.
    cfg.compile_cache = Some(temp_dir("compile-limit-cache")?);
    let m = wasm_controller_manager::app::Manager::start(cfg, host_config().await?).await?;
    let refused = wait_status(&m, "typed", "refused", |s| {
        matches!(s, FileStatus::Refused { .. })
    })
    .await?;
    let FileStatus::Refused { error } = &refused else {
        anyhow::bail!("not refused: {refused:?}");
    };
    assert!(
        error.contains(&format!(
            "needed more than {LIMIT_MIB} MiB (--max-compile-memory-mb {LIMIT_MIB})"
        )),
        "{error}"
    );
    wait_status(&m, "small", "running", |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await?;
    // The operator reads the reason where every state is.
    let (_, body) = http_get(&m, "/plugins").await?;
    assert!(body.contains("--max-compile-memory-mb"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn an_artifact_a_compile_child_wrote_is_mapped_by_the_next_host_from_the_cache() -> Result<()> {
    let _serial = SERIAL.blocking_lock();
    compile_in_children();
    let cache = temp_dir("compile-reuse-cache")?;
    let wasm = std::fs::read(plugin("noop")?)?;
    let child = || ChildCompile::new(host_binary(), LIMIT_MIB << 20);
    let first = runtime(Some(child()), Some(cache.clone()))?.compile(&wasm)?;
    assert!(!first.from_cache && first.compile_peak.is_some());
    // A restarted Pod with the same volume: the artifact passes the cache's checks (this user's,
    // mode 600, in a 700 directory) and is mapped; no child runs.
    let again = runtime(Some(child()), Some(cache.clone()))?.compile(&wasm)?;
    assert!(again.from_cache, "not taken from the cache");
    assert_eq!(again.compile_peak, None);
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

#[test]
fn a_compile_past_its_data_limit_fails_with_the_memory_reason() -> Result<()> {
    let _serial = SERIAL.blocking_lock();
    compile_in_children();
    let cache = temp_dir("compile-data-limit-cache")?;
    // The poll would let it through (4 GiB); the hard RLIMIT_DATA does not.
    let child = ChildCompile {
        data_limit: 64 << 20,
        ..ChildCompile::new(host_binary(), 4 << 30)
    };
    let rt = runtime(Some(child), Some(cache.clone()))?;
    let err = match rt.compile(&std::fs::read(plugin("typed-pod-noop")?)?) {
        Ok(_) => anyhow::bail!("typed-pod-noop compiled within 64 MiB of data"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("more than the compile process may reserve (64 MiB of data"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&cache)?.collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

#[test]
fn the_default_data_limit_lets_the_largest_shipped_compiles_through() -> Result<()> {
    let _serial = SERIAL.blocking_lock();
    compile_in_children();
    // --max-compile-memory-mb's default, and the data limit that follows from it.
    let child = ChildCompile::new(host_binary(), compiler::DEFAULT_MAX_COMPILE_MEMORY_MB << 20);
    assert_eq!(
        child.data_limit,
        2 * (compiler::DEFAULT_MAX_COMPILE_MEMORY_MB << 20)
    );
    for name in ["typed-pod-noop", "config_reloader"] {
        let rt = runtime(Some(child.clone()), None)?;
        let compiled = rt.compile(&std::fs::read(plugin(name)?)?)?;
        eprintln!(
            "{name}: compiled, the child's peak {:?} MiB",
            compiled.compile_peak.map(|p| p >> 20)
        );
        assert!(compiled.compile_peak.is_some());
    }
    Ok(())
}

/// A tmpfs of `size` mounted at a new directory, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(size: &str) -> Result<SmallFs> {
        let dir = temp_dir("compile-small-fs")?;
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "mount a tmpfs (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(SmallFs(dir))
    }

    fn remount_read_only(&self) -> Result<()> {
        let out = std::process::Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_full_or_read_only_compile_cache_hands_the_artifact_over_through_a_private_directory()
-> Result<()> {
    let _serial = SERIAL.blocking_lock();
    // SAFETY: a plain syscall with no arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small file system needs root");
        return Ok(());
    }
    compile_in_children();
    let wasm = std::fs::read(plugin("noop")?)?;
    // 64 KiB: the cache directory fits, `noop`'s artifact does not.
    let fs = SmallFs::mount("64k")?;
    let cache = fs.0.join("cache");
    let child = ChildCompile::new(host_binary(), LIMIT_MIB << 20);
    let full = runtime(Some(child.clone()), Some(cache.clone()))?.compile(&wasm)?;
    assert!(!full.from_cache && full.compile_peak.is_some());
    // Nothing half-written is left in the cache.
    let left: Vec<_> = std::fs::read_dir(&cache)?.collect();
    assert!(left.is_empty(), "{left:?}");
    // The plugin works: what was mapped is `noop`.
    let rt = runtime(Some(child.clone()), Some(cache.clone()))?;
    let d = tokio::runtime::Runtime::new()?.block_on(rt.describe(
        &rt.compile(&wasm)?,
        Arc::new(Services::for_describe("t", Default::default())),
        &Limits::default(),
    ))?;
    assert_eq!(d.name, "noop");

    fs.remount_read_only()?;
    let read_only = runtime(Some(child), Some(cache.clone()))?.compile(&wasm)?;
    assert!(!read_only.from_cache && read_only.compile_peak.is_some());
    Ok(())
}
