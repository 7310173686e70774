//! A compile child holds the host's one-compile turn for as long as it runs (up to 5 minutes). A
//! compile no one wants any more is stopped: its file removed or changed meanwhile, or the host
//! stopping. What proves it is the process table (the child is gone, not even a zombie) and the
//! next plugin running, with the real API server.
//!
//! The compile child here is a wrapper script around the host binary: while a `slow` file exists
//! it records its pid and sleeps (a compile that never ends), else it execs the real compile.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use common::*;
use wasm_controller_manager::loading::plugins::FileStatus;
use wasm_controller_manager::sandbox::compiler::{self, ChildCompile};

/// Longer than any wait below: without the cancel, a sleeping compile holds the turn this long.
const TIMEOUT: Duration = Duration::from_secs(150);

/// One test at a time: they share the `slow` switch.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The wrapper's directory (its `slow` switch and `slow-pids` record), made once, and every
/// runtime of this test binary set to compile through it.
fn wrapper_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("compile-cancel-wrapper").expect("temp dir");
        let script = dir.join("compile.sh");
        let body = format!(
            "#!/bin/sh\nif [ -e {d}/slow ]; then echo $$ >> {d}/slow-pids; exec /bin/sleep 600; fi\nexec {host} \"$@\"\n",
            d = dir.display(),
            host = env!("CARGO_BIN_EXE_wasm-controller-manager"),
        );
        std::fs::write(&script, body).expect("write the wrapper");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        compiler::compile_in_child_process(ChildCompile {
            timeout: TIMEOUT,
            ..ChildCompile::new(script, compiler::DEFAULT_MAX_COMPILE_MEMORY_MB << 20)
        });
        dir
    })
}

fn slow(on: bool) -> Result<()> {
    let switch = wrapper_dir().join("slow");
    if on {
        let _ = std::fs::remove_file(wrapper_dir().join("slow-pids"));
        std::fs::write(switch, b"")?;
    } else {
        std::fs::remove_file(switch)?;
    }
    Ok(())
}

/// The pid of the sleeping compile child, once it runs.
async fn sleeping_compile() -> Result<u32> {
    eventually(
        "a compile child sleeping",
        Duration::from_secs(60),
        || async {
            Ok(std::fs::read_to_string(wrapper_dir().join("slow-pids"))
                .ok()
                .and_then(|t| t.lines().next()?.trim().parse().ok()))
        },
    )
    .await
}

/// Whether a process exists (a zombie, not yet reaped, still does).
fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn gone_within(pid: u32, within: Duration) -> Result<()> {
    eventually(
        &format!("compile child {pid} killed and reaped"),
        within,
        || async { Ok((!exists(pid)).then_some(())) },
    )
    .await
}

/// `noop` as NAME.wasm with NAME.toml naming it `name`, in `dir`.
fn noop_as(dir: &Path, stem: &str, name: &str) -> Result<PathBuf> {
    std::fs::write(
        dir.join(format!("{stem}.toml")),
        format!("name = \"{name}\"\n"),
    )?;
    install(dir, "noop", &format!("{stem}.wasm"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_for_a_removed_file_is_cancelled_so_the_next_compile_starts() -> Result<()> {
    let _serial = SERIAL.lock().await;
    wrapper_dir();
    // Granted first: generating the RBAC compiles too (through the wrapper, not slow yet).
    let staging = temp_dir("compile-cancel-staging")?;
    let a = noop_as(&staging, "a", "cancel-a")?;
    let b = noop_as(&staging, "b", "cancel-b")?;
    grant(&[a, b]).await?;

    let dir = temp_dir("compile-cancel")?;
    let mut cfg = test_config(&dir);
    // A cache of its own: every file compiles.
    cfg.compile_cache = Some(temp_dir("compile-cancel-cache")?);
    // Started on an empty directory (the first scan waits for what it finds).
    let m = wasm_controller_manager::app::Manager::start(cfg, host_config().await?).await?;
    slow(true)?;
    noop_as(&dir, "a", "cancel-a")?;
    let pid = sleeping_compile().await?;

    // b's compile waits for the turn a's holds.
    slow(false)?;
    noop_as(&dir, "b", "cancel-b")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !matches!(status_of(&m, "b").await, Some(FileStatus::Running { .. })),
        "b ran while a's compile held the turn"
    );
    assert!(exists(pid));

    // a is removed: its compile stops, and b's starts.
    let removed = Instant::now();
    std::fs::remove_file(dir.join("a.wasm"))?;
    gone_within(pid, Duration::from_secs(20)).await?;
    wait_status_within(&m, "b", "running", Duration::from_secs(60), |s| {
        matches!(s, FileStatus::Running { .. })
    })
    .await
    .with_context(|| {
        format!(
            "b still not running {:?} after a was removed",
            removed.elapsed()
        )
    })?;
    // Nothing is recorded for content no one wants any more.
    assert_eq!(status_of(&m, "a").await, None);
    m.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_in_flight_is_killed_and_reaped_when_the_host_stops() -> Result<()> {
    let _serial = SERIAL.lock().await;
    wrapper_dir();
    let dir = temp_dir("compile-cancel-stop")?;
    let mut cfg = test_config(&dir);
    cfg.compile_cache = Some(temp_dir("compile-cancel-stop-cache")?);
    let m = wasm_controller_manager::app::Manager::start(cfg, host_config().await?).await?;
    slow(true)?;
    noop_as(&dir, "c", "cancel-c")?;
    let pid = sleeping_compile().await?;
    let stopping = Instant::now();
    m.stop().await;
    eprintln!("stopped in {:?}", stopping.elapsed());
    // No orphan compile keeps running after the host stopped.
    gone_within(pid, Duration::from_secs(5)).await?;
    slow(false)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
