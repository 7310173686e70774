//! The compile child's side (`wasm-controller-manager compile-worker`, hidden): the host's side
//! and the bounds it runs under are in `compiler.rs`.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use wasmtime::Engine;

use super::compile_cache::{check_header, engine_key, write_artifact};
use super::compiler::{EXIT_NOT_WRITTEN, peak_rss};

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
    if let Err(e) = write_artifact(dir, &args.artifact, &bytes) {
        // A full or read-only cache: the host hands the artifact over another way.
        eprintln!("error: {e:#}");
        std::process::exit(EXIT_NOT_WRITTEN);
    }
    let peak = peak_rss("/proc/self/status").unwrap_or(0);
    println!("{}", serde_json::json!({ "peak_rss_bytes": peak }));
    Ok(())
}
