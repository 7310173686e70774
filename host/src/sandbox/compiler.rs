//! Compiling a component in a short-lived child process.
//!
//! Cranelift needs hundreds of MiB to compile a large component (477 MB of peak RSS for a 680 KB
//! plugin that parses typed Pods), and the allocator keeps that peak for the life of the process.
//! So the binary compiles in a child of itself (`wasm-controller-manager compile-worker`, hidden),
//! which gets the wasm bytes on stdin, compiles them with an engine whose compatibility hash must
//! equal the host's, writes the artifact with `compile_cache::write_artifact`, reports its peak
//! RSS and exits; the host then maps the artifact under the compile cache's checks. The host's own
//! memory never holds a compile, and the compile's memory goes back to the system when the child
//! exits.
//!
//! Bounds:
//! - one compile at a time in a process (`ONE_AT_A_TIME`), so the peaks never add up;
//! - the child's peak RSS (VmHWM) is watched every 10 ms: past `max_memory` it is killed and that
//!   plugin fails with the reason, instead of the container meeting its limit;
//! - a hard `RLIMIT_DATA` (`data_limit`, twice `max_memory` by default) backs the poll up: an
//!   allocation the poll would be too late for fails in the child, which then dies with the same
//!   reason;
//! - it sets its own `oom_score_adj` to 1000 before it runs, so under a container limit the
//!   kernel's OOM killer takes the compile, not the host;
//! - it may take `timeout` at most, and stops as soon as it is no longer wanted
//!   ([`CompileCancel`]: the plugin's file changed or went, the load was dropped, the host stops),
//!   waiting for the one-compile lock included;
//! - however the wait ends (an error, a panic, a cancel), the child is killed and reaped
//!   ([`Reaped`]), and the temporary file it may have left is removed;
//! - what it writes to stdout and stderr is read up to 8 KiB, and the error text is escaped before
//!   it reaches a log or `/plugins`;
//! - it dies with the thread that started it (`PR_SET_PDEATHSIG`), and gets no environment.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wasmtime::Engine;

use super::compile_cache::{engine_key, remove_temporaries_of};
pub use super::compile_worker::{WorkerArgs, worker_main};

/// The hidden subcommand a compile child runs.
pub const WORKER_COMMAND: &str = "compile-worker";

/// The largest peak RSS of a compile child by default, MiB (`--max-compile-memory-mb`): the
/// largest measured peak (465 MiB, `typed-pod-noop`: a plugin that parses typed Pods) with about
/// 35 % headroom (docs/benchmarks.md).
pub const DEFAULT_MAX_COMPILE_MEMORY_MB: u64 = 640;

/// The longest a compile may take.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the child's memory is read.
const POLL: Duration = Duration::from_millis(10);

/// What is kept of the child's stdout and of its stderr.
const MAX_CHILD_OUTPUT: u64 = 8 << 10;

/// The exit code of a compile child that compiled but could not write the artifact (a full or
/// read-only compile cache): the host then hands it over through a private directory instead.
pub const EXIT_NOT_WRITTEN: i32 = 3;

/// How a process compiles in a child: the binary (this one), the peak RSS the child may reach,
/// the data segment it may reserve, and how long it may take.
#[derive(Debug, Clone)]
pub struct ChildCompile {
    pub exe: PathBuf,
    /// The peak RSS (VmHWM) past which the child is killed, bytes.
    pub max_memory: u64,
    /// The child's hard `RLIMIT_DATA`, bytes (private writable mappings: the heap, malloc's
    /// arenas, thread stacks). Above `max_memory`: the allocator reserves more than it touches
    /// (`typed-pod-noop`: VmData 677 MiB at a 461 MiB peak RSS, docs/benchmarks.md).
    pub data_limit: u64,
    pub timeout: Duration,
}

/// The default `RLIMIT_DATA` of a child whose peak RSS may reach `max_memory`: twice that.
pub fn default_data_limit(max_memory: u64) -> u64 {
    max_memory.saturating_mul(2)
}

impl ChildCompile {
    /// `exe` as the compile child, with the default data limit and time.
    pub fn new(exe: PathBuf, max_memory: u64) -> ChildCompile {
        ChildCompile {
            exe,
            max_memory,
            data_limit: default_data_limit(max_memory),
            timeout: COMPILE_TIMEOUT,
        }
    }

    /// This very binary: `/proc/self/exe` is the file this process runs, even after a new one was
    /// put at its path (a different build would have another engine hash, and be refused).
    pub fn this_binary(max_memory: u64) -> ChildCompile {
        ChildCompile::new(PathBuf::from("/proc/self/exe"), max_memory)
    }
}

/// Says a compile is no longer wanted: its child is killed at the next poll (10 ms), or it gives
/// up its wait for the one-compile lock. Cheap to clone; every clone is the same flag.
#[derive(Debug, Clone, Default)]
pub struct CompileCancel(Arc<AtomicBool>);

impl CompileCancel {
    pub fn new() -> CompileCancel {
        CompileCancel::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Cancels its compile when dropped: held by the future that waits for a compile on a blocking
/// thread, so a dropped future (a load cancelled, the host stopping) stops the child too.
pub struct CancelOnDrop(pub CompileCancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Whether an error is a cancelled compile.
pub fn is_cancelled(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ChildFailure>(),
            Some(ChildFailure::Cancelled)
        )
    })
}

/// Whether an error is a compile whose artifact could not be written where it was asked to be.
pub(super) fn is_not_written(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ChildFailure>(),
            Some(ChildFailure::NotWritten(_))
        )
    })
}

static PROCESS_DEFAULT: OnceLock<ChildCompile> = OnceLock::new();

/// Makes every runtime of this process compile in a child (the binary's `main` does this; a
/// library user, such as a test, compiles in its own process unless it sets
/// `RuntimeSettings::child_compile`).
pub fn compile_in_child_process(c: ChildCompile) {
    let _ = PROCESS_DEFAULT.set(c);
}

/// Whether a compile may fall back to this process when no directory can take a child's artifact:
/// yes for the short-lived commands (`inspect`, `rbac`, `replay`: better a compile than none, and
/// the process ends), never for `run`, whose memory would keep the compile's peak for good and
/// have none of the child's bounds.
static IN_PROCESS_FALLBACK: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

/// Refuses the in-process fallback for the rest of this process (`run`).
pub fn forbid_in_process_fallback() {
    IN_PROCESS_FALLBACK.store(false, std::sync::atomic::Ordering::Release);
}

/// See [`forbid_in_process_fallback`].
pub fn in_process_fallback_allowed() -> bool {
    IN_PROCESS_FALLBACK.load(std::sync::atomic::Ordering::Acquire)
}

/// The process-wide choice, for `RuntimeSettings::default`.
pub fn process_default() -> Option<ChildCompile> {
    PROCESS_DEFAULT.get().cloned()
}

/// One compile at a time in this process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Why a compile child failed.
#[derive(Debug, thiserror::Error)]
pub enum ChildFailure {
    #[error(
        "compiling this component needed more than {limit_mib} MiB (--max-compile-memory-mb {limit_mib}); the compile was stopped"
    )]
    Memory { limit_mib: u64 },
    #[error(
        "compiling this component needed more than the compile process may reserve ({data_mib} MiB of data, twice --max-compile-memory-mb {limit_mib}); the compile was stopped"
    )]
    DataLimit { data_mib: u64, limit_mib: u64 },
    #[error("compiling this component took longer than {0:?}; the compile was stopped")]
    Timeout(Duration),
    #[error(
        "the compile was cancelled: the plugin's file changed or was removed, or the host is stopping"
    )]
    Cancelled,
    #[error("the compiled artifact could not be written: {0}")]
    NotWritten(String),
}

/// A compile child, killed and reaped when dropped unless it was waited for; the temporary file a
/// killed child may have left in `dir` (`.tmp-PID-*`) goes with it.
struct Reaped<'a> {
    child: Option<Child>,
    dir: &'a Path,
}

impl Reaped<'_> {
    fn child(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// The child exited and was waited for.
    fn exited(&mut self, success: bool) {
        if let Some(c) = self.child.take()
            && !success
        {
            remove_temporaries_of(self.dir, c.id());
        }
    }
}

impl Drop for Reaped<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            remove_temporaries_of(self.dir, c.id());
        }
    }
}

/// Takes the one-compile lock, or gives up when the compile is cancelled meanwhile.
fn one_at_a_time(cancel: &CompileCancel) -> Result<std::sync::MutexGuard<'static, ()>> {
    loop {
        match ONE_AT_A_TIME.try_lock() {
            Ok(g) => return Ok(g),
            Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) => {}
        }
        if cancel.is_cancelled() {
            return Err(ChildFailure::Cancelled.into());
        }
        std::thread::sleep(POLL);
    }
}

/// Compiles `wasm` in a child process, which writes the artifact at `path` (in `dir`). Returns the
/// child's peak RSS, bytes.
pub(super) fn compile_in_child(
    engine: &Engine,
    c: &ChildCompile,
    wasm: &[u8],
    dir: &Path,
    path: &Path,
    cancel: &CompileCancel,
) -> Result<u64> {
    let _one = one_at_a_time(cancel)?;
    debug_assert!(path.parent() == Some(dir));
    let mut cmd = Command::new(&c.exe);
    cmd.arg(WORKER_COMMAND)
        .arg("--artifact")
        .arg(path)
        .arg("--engine-key")
        .arg(engine_key(engine))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Never above the hard limit this process already has (raising it would need privilege).
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: fills the struct it is given.
    unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut current) };
    let data_limit = (c.data_limit as libc::rlim_t).min(current.rlim_max);
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, setrlimit, open, write,
    // close) on memory prepared before the fork. The thread that spawns the child waits for it
    // below, so the death signal comes only if that thread (or this process) dies.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let limit = libc::rlimit {
                rlim_cur: data_limit,
                rlim_max: data_limit,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The OOM killer's first choice (raising one's own score needs no privilege). Where
            // /proc is not writable the poll and the data limit still hold.
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                let _ = libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("start the compile process {}", c.exe.display()))?;
    let mut child = Reaped {
        child: Some(child),
        dir,
    };
    let Some(c_ref) = child.child() else {
        anyhow::bail!("the compile process is gone");
    };
    let (stdin, stdout, stderr) = (c_ref.stdin.take(), c_ref.stdout.take(), c_ref.stderr.take());
    let (watched, out, err) = std::thread::scope(|s| {
        // Owned here: should the watch panic, the child is killed as this closure unwinds, before
        // the scope joins the pipe threads (which end only once the child is gone).
        let mut child = child;
        // The bytes go in from a thread of their own, so the watch below runs from the start
        // (the pipe holds 64 KiB; a child that stops reading is still killed in time).
        s.spawn(move || {
            if let Some(mut stdin) = stdin {
                // A child that died early closes the pipe: its exit says why.
                let _ = stdin.write_all(wasm);
            }
        });
        let out = s.spawn(move || read_bounded(stdout));
        let err = s.spawn(move || read_bounded(stderr));
        let watched = watch(&mut child, c, started, cancel);
        // Past its bounds or no longer wanted: killed and reaped before its pipes are read out.
        drop(child);
        (
            watched,
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    });
    let (status, polled_peak) = watched?;
    if !status.success() {
        let why = child_error(&err);
        if status.code() == Some(EXIT_NOT_WRITTEN) {
            return Err(ChildFailure::NotWritten(why).into());
        }
        // Rust's allocator aborts the child with this line when RLIMIT_DATA refuses it memory.
        if String::from_utf8_lossy(&err).contains("memory allocation of ") {
            return Err(ChildFailure::DataLimit {
                data_mib: c.data_limit >> 20,
                limit_mib: c.max_memory >> 20,
            }
            .into());
        }
        anyhow::bail!(
            "{}",
            match status.code() {
                Some(_) => why,
                None => format!(
                    "the compile process was killed ({status}; by the kernel when memory ran out?) {why}"
                ),
            }
        );
    }
    let reported = serde_json::from_slice::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v["peak_rss_bytes"].as_u64());
    // The child's own reading is exact; the polled one may miss the last 10 ms.
    let peak = reported.unwrap_or(polled_peak);
    tracing::debug!(
        peak_rss_mib = peak >> 20,
        millis = started.elapsed().as_millis() as u64,
        "compiled in a child process"
    );
    Ok(peak)
}

/// Waits for the child, until it exits or is past its memory or time or no longer wanted (an
/// error: the child is then killed and reaped by `Reaped`'s drop). Returns its exit status and the
/// highest peak RSS read.
fn watch(
    child: &mut Reaped<'_>,
    c: &ChildCompile,
    started: Instant,
    cancel: &CompileCancel,
) -> Result<(ExitStatus, u64)> {
    let mut peak = 0;
    loop {
        let Some(ch) = child.child() else {
            anyhow::bail!("the compile process is gone");
        };
        let pid = ch.id();
        // Until it is waited for, the pid stays this child's (a zombie at worst).
        if let Some(status) = ch.try_wait().context("wait for the compile process")? {
            child.exited(status.success());
            return Ok((status, peak));
        }
        peak = peak.max(peak_rss(&format!("/proc/{pid}/status")).unwrap_or(0));
        if peak > c.max_memory {
            return Err(ChildFailure::Memory {
                limit_mib: c.max_memory >> 20,
            }
            .into());
        }
        if started.elapsed() > c.timeout {
            return Err(ChildFailure::Timeout(c.timeout).into());
        }
        if cancel.is_cancelled() {
            return Err(ChildFailure::Cancelled.into());
        }
        std::thread::sleep(POLL);
    }
}

/// Up to `MAX_CHILD_OUTPUT` bytes of a pipe, the rest drained (so the child never blocks on it).
fn read_bounded<R: Read>(pipe: Option<R>) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let _ = (&mut pipe).take(MAX_CHILD_OUTPUT).read_to_end(&mut kept);
    let _ = std::io::copy(&mut pipe, &mut std::io::sink());
    kept
}

/// The child's error, from its stderr: the `error: ...` line `main` prints, escaped.
fn child_error(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("error: "))
        .unwrap_or_else(|| text.trim());
    let line = if line.is_empty() {
        "the compile process failed and said nothing"
    } else {
        line
    };
    crate::contract::validate::log_text(line, 2048)
}

/// The peak resident set of this process so far, bytes (`None` without `/proc`).
pub fn peak_rss_of_this_process() -> Option<u64> {
    peak_rss("/proc/self/status")
}

/// VmHWM (the peak resident set) of a `/proc/PID/status` file, bytes.
pub(super) fn peak_rss(status: &str) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_error_line_is_escaped_and_bounded() {
        let err = b"some log\nerror: invalid component: bad\x1b[31m thing\n";
        assert_eq!(child_error(err), "invalid component: bad\\u{1b}[31m thing");
        let long = format!("error: {}", "x".repeat(10_000));
        assert!(child_error(long.as_bytes()).len() < 2100);
        assert_eq!(
            child_error(b""),
            "the compile process failed and said nothing"
        );
    }

    use std::os::unix::fs::PermissionsExt;

    /// The smallest valid component: the header alone.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    /// A stand-in for the compile child, written once (before any test spawns it, so no test's
    /// fork holds it open for writing): a shell script that records, next to the artifact it is
    /// asked for (`$3`), its pid, its `oom_score_adj` and its data limit; appends that artifact
    /// path to `artifacts` in its own directory; then sleeps if the artifact's directory holds a
    /// file `sleep` (until killed), else fails.
    fn fake_compiler() -> &'static Path {
        static SCRIPT: OnceLock<PathBuf> = OnceLock::new();
        SCRIPT.get_or_init(|| {
            let dir = scratch_dir("fake-compiler");
            let script = dir.join("compile.sh");
            let body = format!(
                r#"#!/bin/sh
d=${{3%/*}}
echo "$3" >> {artifacts}
read adj < /proc/self/oom_score_adj
echo "$adj" > "$d/oom"
ulimit -d > "$d/data"
echo $$ > "$d/pid"
if [ -e "$d/sleep" ]; then exec /bin/sleep 600; fi
echo "error: the fake compiler compiles nothing" >&2
exit 1
"#,
                artifacts = dir.join("artifacts").display()
            );
            std::fs::write(&script, body).expect("write the fake compiler");
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            script
        })
    }

    /// A fresh private directory of this test process.
    fn scratch_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::AtomicU64;
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "wcm-compiler-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    fn fake_child(timeout: Duration) -> ChildCompile {
        ChildCompile {
            timeout,
            ..ChildCompile::new(fake_compiler().to_path_buf(), 100 << 20)
        }
    }

    /// Whether a process exists (a zombie, not yet reaped, still does).
    fn exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    fn wait_for_file(path: &Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(path)
                && text.ends_with('\n')
            {
                return text.trim().to_string();
            }
            assert!(Instant::now() < deadline, "no {}", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_compile_child_is_the_oom_killers_first_choice_and_has_a_hard_data_limit() {
        let dir = scratch_dir("limits");
        let child = fake_child(Duration::from_secs(20));
        let engine = Engine::default();
        let err = compile_in_child(
            &engine,
            &child,
            EMPTY_COMPONENT,
            &dir,
            &dir.join("x.cwasm"),
            &CompileCancel::new(),
        )
        .expect_err("the fake compiler fails");
        assert!(format!("{err:#}").contains("compiles nothing"), "{err:#}");
        // What the child itself read of its own process.
        assert_eq!(wait_for_file(&dir.join("oom")), "1000");
        // `ulimit -d` is in KiB: twice --max-compile-memory-mb.
        assert_eq!(wait_for_file(&dir.join("data")), (200 << 10).to_string());
        // This process is untouched.
        let own = std::fs::read_to_string("/proc/self/oom_score_adj").expect("read");
        assert_ne!(own.trim(), "1000");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cancelled_compile_kills_and_reaps_its_child_at_once() {
        let dir = scratch_dir("cancel");
        std::fs::write(dir.join("sleep"), b"").expect("sleep marker");
        let cancel = CompileCancel::new();
        let started = Instant::now();
        let (err, pid) = std::thread::scope(|s| {
            let compile = s.spawn(|| {
                compile_in_child(
                    &Engine::default(),
                    // Without the cancel, the child would sleep until this timeout.
                    &fake_child(Duration::from_secs(60)),
                    EMPTY_COMPONENT,
                    &dir,
                    &dir.join("x.cwasm"),
                    &cancel,
                )
            });
            let pid: u32 = wait_for_file(&dir.join("pid")).parse().expect("pid");
            assert!(exists(pid));
            // A temporary file it left mid-write.
            let tmp = dir.join(format!(".tmp-{pid}-0-1.cwasm"));
            std::fs::write(&tmp, b"half").expect("tmp");
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            cancel.cancel();
            let err = compile
                .join()
                .expect("no panic")
                .expect_err("cancelled compiles fail");
            (err, pid)
        });
        assert!(is_cancelled(&err), "{err:#}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "took {:?}",
            started.elapsed()
        );
        // Killed and waited for: not even a zombie is left.
        assert!(!exists(pid), "the compile child {pid} is still there");
        assert!(!dir.join(format!(".tmp-{pid}-0-1.cwasm")).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cancelled_compile_waiting_for_its_turn_never_starts() {
        let dir = scratch_dir("turn");
        let cancel = CompileCancel::new();
        let (took, result) = std::thread::scope(|s| {
            // Another compile holds the turn for 3 s.
            let (held, holding) = std::sync::mpsc::channel();
            s.spawn(move || {
                let _turn = ONE_AT_A_TIME
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let _ = held.send(());
                std::thread::sleep(Duration::from_secs(3));
            });
            let _ = holding.recv();
            // From the moment the turn is held (other tests may have held it before).
            let started = Instant::now();
            let (dir, cancel) = (&dir, &cancel);
            let waiting = s.spawn(move || {
                let r = compile_in_child(
                    &Engine::default(),
                    &fake_child(Duration::from_secs(60)),
                    EMPTY_COMPONENT,
                    dir,
                    &dir.join("x.cwasm"),
                    cancel,
                );
                (started.elapsed(), r)
            });
            std::thread::sleep(Duration::from_millis(100));
            cancel.cancel();
            waiting.join().expect("no panic")
        });
        let err = result.expect_err("cancelled");
        assert!(is_cancelled(&err), "{err:#}");
        // It left as it was cancelled, not when the turn came.
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(!dir.join("pid").exists(), "the compile child ran");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_child_dropped_unwaited_is_killed_and_reaped_with_its_temporary_file() {
        let dir = scratch_dir("reap");
        let child = Command::new("/bin/sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let mode = std::fs::Permissions::from_mode(0o600);
        let (mine, other) = (
            dir.join(format!(".tmp-{pid}-0-1.cwasm")),
            dir.join(".tmp-1-0-1.cwasm"),
        );
        for f in [&mine, &other] {
            std::fs::write(f, b"half").expect("tmp");
            std::fs::set_permissions(f, mode.clone()).expect("chmod");
        }
        drop(Reaped {
            child: Some(child),
            dir: &dir,
        });
        assert!(!exists(pid), "the child {pid} is still there");
        assert!(!mine.exists(), "its temporary file is left");
        assert!(other.exists(), "another compile's temporary file went too");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_private_hand_over_directory_has_a_random_name() {
        let engine = Engine::default();
        let child = fake_child(Duration::from_secs(20));
        let sha = super::super::compile_cache::sha256_hex(EMPTY_COMPONENT);
        // No cache: each compile hands over through a directory of its own (the fake fails it).
        for _ in 0..2 {
            let r = super::super::compile_cache::load_or_compile(
                &engine,
                None,
                &sha,
                EMPTY_COMPONENT,
                Some(&child),
                &CompileCancel::new(),
            );
            assert!(r.is_err());
        }
        let artifacts = std::fs::read_to_string(fake_compiler().with_file_name("artifacts"))
            .expect("artifacts asked for");
        let dirs: Vec<String> = artifacts
            .lines()
            .filter_map(|a| {
                let name = Path::new(a).parent()?.file_name()?.to_str()?;
                name.starts_with("wcm-compile-").then(|| name.to_string())
            })
            .collect();
        assert!(dirs.len() >= 2, "{artifacts}");
        let pid = std::process::id().to_string();
        for d in &dirs {
            let random = d.trim_start_matches("wcm-compile-");
            assert!(
                random.len() == 32 && random.chars().all(|c| c.is_ascii_hexdigit()),
                "{d}: not 128 random bits"
            );
            assert!(!random.contains(&pid), "{d}: has this process's pid");
        }
        let distinct: std::collections::HashSet<_> = dirs.iter().collect();
        assert_eq!(distinct.len(), dirs.len(), "{dirs:?}");
    }

    #[test]
    fn peak_rss_reads_vmhwm_in_bytes() {
        let peak = peak_rss("/proc/self/status").expect("VmHWM");
        assert!(peak > 1 << 20, "{peak}");
        assert_eq!(peak_rss("/proc/0/status"), None);
    }
}
