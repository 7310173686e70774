//! Precompiled components on disk, keyed by the component's content hash and the engine's
//! compatibility hash (wasmtime version, target, settings). A key never matches a different engine,
//! so a stale artifact is simply not found, never loaded.

use std::hash::{Hash, Hasher};
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn engine_key(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Loads the precompiled artifact if there is one, else compiles and stores it. Returns the
/// component and whether it came from the cache.
pub fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    sha256: &str,
    wasm: &[u8],
) -> Result<(Component, bool)> {
    let Some(dir) = dir else {
        return Ok((compile(engine, wasm)?, false));
    };
    let path = dir.join(format!("{sha256}-{}.cwasm", engine_key(engine)));
    if path.is_file() {
        // SAFETY: the file was written by `Component::serialize` of an engine with the same
        // compatibility hash (it is in the name), in a directory the operator owns.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => return Ok((c, true)),
            Err(e) => {
                tracing::warn!(path = %path.display(), "precompiled artifact unusable, compiling again: {e:#}")
            }
        }
    }
    let component = compile(engine, wasm)?;
    if let Err(e) = store(&component, dir, &path) {
        tracing::warn!(path = %path.display(), "could not write the precompiled artifact: {e:#}");
    }
    Ok((component, false))
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Component> {
    if !wasm.starts_with(b"\0asm") {
        anyhow::bail!("not a WebAssembly file (no \\0asm header)");
    }
    if wasm.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00]) {
        anyhow::bail!(
            "a core WebAssembly module, not a component: build it for wasm32-wasip2 (cargo build --target wasm32-wasip2)"
        );
    }
    Component::new(engine, wasm).map_err(|e| anyhow::anyhow!("invalid component: {e:#}"))
}

fn store(component: &Component, dir: &Path, path: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let bytes = component.serialize()?;
    // Write then rename: a reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
