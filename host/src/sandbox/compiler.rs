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
//! - it may take `timeout` at most;
//! - what it writes to stdout and stderr is read up to 8 KiB, and the error text is escaped before
//!   it reaches a log or `/plugins`;
//! - it dies with the thread that started it (`PR_SET_PDEATHSIG`), and gets no environment.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wasmtime::Engine;

use super::compile_cache::{check_header, engine_key, write_artifact};

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

/// How a process compiles in a child: the binary (this one), the peak RSS the child may reach,
/// and how long it may take.
#[derive(Debug, Clone)]
pub struct ChildCompile {
    pub exe: PathBuf,
    pub max_memory: u64,
    pub timeout: Duration,
}

impl ChildCompile {
    /// This very binary: `/proc/self/exe` is the file this process runs, even after a new one was
    /// put at its path (a different build would have another engine hash, and be refused).
    pub fn this_binary(max_memory: u64) -> ChildCompile {
        ChildCompile {
            exe: PathBuf::from("/proc/self/exe"),
            max_memory,
            timeout: COMPILE_TIMEOUT,
        }
    }
}

static PROCESS_DEFAULT: OnceLock<ChildCompile> = OnceLock::new();

/// Makes every runtime of this process compile in a child (the binary's `main` does this; a
/// library user, such as a test, compiles in its own process unless it sets
/// `RuntimeSettings::child_compile`).
pub fn compile_in_child_process(c: ChildCompile) {
    let _ = PROCESS_DEFAULT.set(c);
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
    #[error("compiling this component took longer than {0:?}; the compile was stopped")]
    Timeout(Duration),
}

/// Compiles `wasm` in a child process, which writes the artifact at `path` (in `dir`). Returns the
/// child's peak RSS, bytes.
pub(super) fn compile_in_child(
    engine: &Engine,
    c: &ChildCompile,
    wasm: &[u8],
    dir: &Path,
    path: &Path,
) -> Result<u64> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
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
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent. The thread that
    // spawns the child waits for it below, so the signal comes only if this process dies.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("start the compile process {}", c.exe.display()))?;
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (watched, out, err) = std::thread::scope(|s| {
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
        let watched = watch(&mut child, c, started);
        (
            watched,
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    });
    let (status, polled_peak) = watched?;
    if !status.success() {
        let why = child_error(&err);
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

/// Waits for the child, killing it past its memory or time. Returns its exit status and the
/// highest peak RSS read.
fn watch(child: &mut Child, c: &ChildCompile, started: Instant) -> Result<(ExitStatus, u64)> {
    let pid = child.id();
    let mut peak = 0;
    loop {
        // Until it is waited for, the pid stays this child's (a zombie at worst).
        if let Some(status) = child.try_wait().context("wait for the compile process")? {
            return Ok((status, peak));
        }
        peak = peak.max(peak_rss(&format!("/proc/{pid}/status")).unwrap_or(0));
        let failure = if peak > c.max_memory {
            Some(ChildFailure::Memory {
                limit_mib: c.max_memory >> 20,
            })
        } else if started.elapsed() > c.timeout {
            Some(ChildFailure::Timeout(c.timeout))
        } else {
            None
        };
        if let Some(f) = failure {
            let _ = child.kill();
            let _ = child.wait();
            return Err(f.into());
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
fn peak_rss(status: &str) -> Option<u64> {
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

/// How the child compiles; the knobs other than the defaults are for measurements
/// (docs/decisions.md): an artifact made with another Cranelift level has another engine hash, and
/// the host refuses it.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// Where to write the artifact (its directory must exist).
    pub artifact: PathBuf,
    /// The host engine's key: the child refuses to compile for another engine.
    pub engine_key: Option<String>,
    /// wasmtime's parallel compilation (functions compiled on a thread pool); off by default: a
    /// lower peak, and the other cores stay with the running plugins.
    pub parallel_compilation: bool,
    /// Cranelift's optimisation level, for measurements only.
    pub opt_level: Option<wasmtime::OptLevel>,
    /// Cranelift's register allocator, for measurements only.
    pub regalloc: Option<wasmtime::RegallocAlgorithm>,
}

/// The child's side: reads the wasm from stdin, compiles, writes the artifact, prints its peak RSS
/// as JSON on stdout.
pub fn worker_main(args: &WorkerArgs) -> Result<()> {
    let mut wasm = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut wasm)
        .context("read the component from stdin")?;
    let mut config = super::code_config();
    config.parallel_compilation(args.parallel_compilation);
    if let Some(level) = args.opt_level {
        config.cranelift_opt_level(level);
    }
    if let Some(algo) = args.regalloc {
        config.cranelift_regalloc_algorithm(algo);
    }
    let engine =
        Engine::new(&config).map_err(|e| anyhow::anyhow!("create the wasm engine: {e:#}"))?;
    let key = engine_key(&engine);
    if let Some(expected) = &args.engine_key {
        anyhow::ensure!(
            &key == expected,
            "the compile process's engine ({key}) is not the host's ({expected}): a different build?"
        );
    }
    check_header(&wasm)?;
    let bytes = engine
        .precompile_component(&wasm)
        .map_err(|e| anyhow::anyhow!("invalid component: {e:#}"))?;
    drop(wasm);
    let dir = match args.artifact.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    write_artifact(dir, &args.artifact, &bytes)?;
    let peak = peak_rss("/proc/self/status").unwrap_or(0);
    println!("{}", serde_json::json!({ "peak_rss_bytes": peak }));
    Ok(())
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

    #[test]
    fn peak_rss_reads_vmhwm_in_bytes() {
        let peak = peak_rss("/proc/self/status").expect("VmHWM");
        assert!(peak > 1 << 20, "{peak}");
        assert_eq!(peak_rss("/proc/0/status"), None);
    }
}
