//! Precompiled components on disk, keyed by the component's content hash and the engine's
//! compatibility hash (wasmtime version, target, settings). A key never matches a different engine,
//! so a stale artifact is simply not found, never loaded.
//!
//! Loading an artifact runs its contents as native code, so only files this host wrote are loaded:
//! a regular file (not a symlink) owned by this process's user and not writable by group or others,
//! in a directory with the same properties. Anything else is logged and the component is compiled
//! from the wasm bytes instead.
//!
//! A compile is done in a short-lived child process when the host runs as the binary
//! (`compiler.rs`): the child writes the artifact here, and this process maps it under the same
//! checks, so the compile's memory goes back to the system when the child exits.

use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::compiler::{self, ChildCompile, CompileCancel};
use crate::safe_fs::{ELOOP, kind_of, open_no_follow};

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn engine_key(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Why the cache directory or an artifact in it is not trusted.
#[derive(Debug, thiserror::Error)]
enum CacheRefusal {
    #[error("is a symlink, not a file this host wrote")]
    Symlink,
    #[error("is {0}, not a file this host wrote")]
    NotRegular(&'static str),
    #[error("is {0}, not a directory")]
    NotDir(&'static str),
    #[error("is owned by uid {owner}, not by this process's uid {euid}")]
    Owner { owner: u32, euid: u32 },
    #[error(
        "is writable by group or others (mode {mode:o}); run `chmod go-w` on it, or point the cache at a new directory (created with mode 700)"
    )]
    Writable { mode: u32 },
    #[error("was replaced between the check and the open")]
    Replaced,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A component ready to link, and how it was had.
pub struct Loaded {
    pub component: Component,
    /// Mapped from an artifact an earlier compile left in the cache.
    pub from_cache: bool,
    /// The peak resident memory of the compile, when a child process compiled it.
    pub compile_peak: Option<u64>,
}

impl Loaded {
    fn compiled_here(component: Component) -> Loaded {
        Loaded {
            component,
            from_cache: false,
            compile_peak: None,
        }
    }
}

/// Loads the precompiled artifact if there is one this host wrote, else compiles and stores it:
/// in a child process when `child` is given (the artifact is then mapped from the file the child
/// wrote, under the same checks as a cached one; without a usable cache directory, or with one that
/// is read-only or full, the hand-over goes through a private temporary directory), else in this
/// process. `cancel` stops a compile child that is no longer wanted.
pub fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    sha256: &str,
    wasm: &[u8],
    child: Option<&ChildCompile>,
    cancel: &CompileCancel,
) -> Result<Loaded> {
    let euid = match effective_uid() {
        Ok(uid) => uid,
        Err(e) if child.is_some() && !compiler::in_process_fallback_allowed() => {
            anyhow::bail!(
                "cannot tell this process's uid ({e:#}), so neither a cached artifact's owner nor a \
                 compile child's memory can be checked; the host never compiles in its own process"
            )
        }
        Err(e) => {
            // Without /proc neither the artifact's owner nor a child's memory can be checked.
            tracing::warn!(
                "compiling in this process, without the compile cache: cannot tell this process's uid: {e:#}"
            );
            return Ok(Loaded::compiled_here(compile(engine, wasm)?));
        }
    };
    let dir = match dir.map(|d| (d, prepare_dir(d, euid))) {
        Some((d, Ok(()))) => Some(d),
        Some((d, Err(refusal))) => {
            tracing::warn!(dir = %d.display(), "compile cache directory refused, compiling without it: the directory {refusal}");
            None
        }
        None => None,
    };
    let Some(dir) = dir else {
        return match child {
            Some(c) => compile_through_private_dir(engine, c, euid, wasm, cancel),
            None => Ok(Loaded::compiled_here(compile(engine, wasm)?)),
        };
    };
    let path = dir.join(format!("{sha256}-{}.cwasm", engine_key(engine)));
    match open_artifact(&path, euid) {
        Ok(Some(file)) => match map_checked(engine, &file) {
            Ok(component) => {
                return Ok(Loaded {
                    component,
                    from_cache: true,
                    compile_peak: None,
                });
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "precompiled artifact unusable, compiling again: {e:#}")
            }
        },
        Ok(None) => {}
        Err(refusal) => {
            tracing::warn!(path = %path.display(), "precompiled artifact refused, compiling from the wasm instead: the file {refusal}")
        }
    }
    if let Some(c) = child {
        if read_only(dir) {
            // Artifacts put there beforehand are used (above); a new one cannot be kept.
            tracing::warn!(dir = %dir.display(), "the compile cache is read-only: this compile is handed over through a private directory and not kept");
            return compile_through_private_dir(engine, c, euid, wasm, cancel);
        }
        // The child writes the artifact by `write_artifact` (a new private file renamed into
        // place, so a refused file is replaced, never written through).
        return match compiler::compile_in_child(engine, c, wasm, dir, &path, cancel) {
            Ok(peak) => Ok(Loaded {
                component: load_written(engine, &path, euid)?,
                from_cache: false,
                compile_peak: Some(peak),
            }),
            // A full cache (or one that became read-only): compiled again, through a private
            // directory, rather than the plugin failing for want of disk.
            Err(e) if compiler::is_not_written(&e) => {
                tracing::warn!(dir = %dir.display(), "the compile cache could not take the artifact ({e:#}): compiling again through a private directory");
                compile_through_private_dir(engine, c, euid, wasm, cancel)
            }
            Err(e) => Err(e),
        };
    }
    let component = compile(engine, wasm)?;
    // Replaces a refused file too: the rename swaps the directory entry, never writes through it.
    if let Err(e) = store(&component, dir, &path) {
        tracing::warn!(path = %path.display(), "could not write the precompiled artifact: {e:#}");
    }
    Ok(Loaded::compiled_here(component))
}

/// Maps the artifact behind a checked descriptor.
fn map_checked(engine: &Engine, file: &File) -> Result<Component> {
    // Mapped rather than read: the code pages are the file's, shared with the page cache, and
    // only those a call touches become resident. `/proc/self/fd/N` opens the very file the checks
    // were made on, not whatever the path names by now.
    let checked = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // SAFETY: the descriptor's file is checked to be a regular file of this user, writable by no
    // one else, in a directory only this user can write: written by `write_artifact` (here or in
    // a compile child of this same binary) from a serialisation by an engine with the same
    // compatibility hash (it is in the name, and the child checks it). It is never written in
    // place (a new artifact is renamed over it), so the mapping does not change under the engine.
    unsafe { Component::deserialize_file(engine, &checked) }.map_err(|e| anyhow::anyhow!("{e:#}"))
}

/// The artifact a compile child just wrote, under the checks a cached one passes.
fn load_written(engine: &Engine, path: &Path, euid: u32) -> Result<Component> {
    let file = open_artifact(path, euid)
        .map_err(|r| anyhow::anyhow!("the compiled artifact {} {r}", path.display()))?
        .ok_or_else(|| {
            anyhow::anyhow!("the compile process left no artifact at {}", path.display())
        })?;
    map_checked(engine, &file)
}

/// Whether the file system of `dir` is mounted read-only.
fn read_only(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_RDONLY != 0
    }
}

/// 128 random bits from the kernel, in hex.
fn random_name() -> Result<String> {
    let mut buf = [0u8; 16];
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    anyhow::ensure!(
        n == buf.len() as isize,
        "getrandom: {}",
        std::io::Error::last_os_error()
    );
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes a new private (mode 700) directory with a random name in the system's temporary
/// directory: not predictable, so no other user of a shared /tmp can have prepared it or race us to
/// it; not recursive, so the name must be new.
fn make_private_dir() -> std::io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..4 {
        let name = random_name().map_err(std::io::Error::other)?;
        let dir = std::env::temp_dir().join(format!("wcm-compile-{name}"));
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no private directory")))
}

/// Without a usable compile cache: the child writes into a directory made for this one compile
/// (mode 700, a random name), the artifact is mapped, and the directory is removed (the mapping
/// keeps the file's pages).
fn compile_through_private_dir(
    engine: &Engine,
    child: &ChildCompile,
    euid: u32,
    wasm: &[u8],
    cancel: &CompileCancel,
) -> Result<Loaded> {
    let dir = match make_private_dir() {
        Ok(d) => d,
        Err(e) if !compiler::in_process_fallback_allowed() => {
            // `run`: a compile in this process would keep its peak for good, unbounded. The plugin
            // is refused with what to give instead.
            anyhow::bail!(
                "no directory to hand the compiled plugin over: --compile-cache is missing, refused, \
                 full or read-only, and no private directory could be made in {} ({e}); the host \
                 never compiles in its own process: set TMPDIR or --compile-cache to a writable \
                 directory of its own",
                std::env::temp_dir().display()
            )
        }
        Err(e) => {
            // E.g. `inspect` run in the Pod, whose root (and /tmp) is read-only: better a compile in
            // this short-lived process than none.
            tracing::warn!(
                "compiling in this process: no usable --compile-cache, and no private directory for a compile child could be made in {} ({e}; set TMPDIR or give --compile-cache)",
                std::env::temp_dir().display()
            );
            return Ok(Loaded::compiled_here(compile(engine, wasm)?));
        }
    };
    let result = (|| {
        let meta = std::fs::symlink_metadata(&dir)?;
        check_owner_and_mode(&meta, euid)
            .map_err(|r| anyhow::anyhow!("the directory {} {r}", dir.display()))?;
        let path = dir.join("artifact.cwasm");
        let peak = compiler::compile_in_child(engine, child, wasm, &dir, &path, cancel)?;
        Ok(Loaded {
            component: load_written(engine, &path, euid)?,
            from_cache: false,
            compile_peak: Some(peak),
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Component> {
    check_header(wasm)?;
    Component::new(engine, wasm).map_err(|e| anyhow::anyhow!("invalid component: {e:#}"))
}

/// A WebAssembly component, by its header; a core module is refused with what to do instead.
pub(super) fn check_header(wasm: &[u8]) -> Result<()> {
    if !wasm.starts_with(b"\0asm") {
        anyhow::bail!("not a WebAssembly file (no \\0asm header)");
    }
    if wasm.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00]) {
        anyhow::bail!(
            "a core WebAssembly module, not a component: build it for wasm32-wasip2 (cargo build --target wasm32-wasip2)"
        );
    }
    Ok(())
}

/// The effective uid, from `/proc/self/status` (`Uid: real effective saved fs`): the `libc` crate
/// is not a direct dependency. Without `/proc` the cache is not used.
pub(super) fn effective_uid() -> Result<u32> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .context("no effective uid in /proc/self/status")
}

/// Owned by `euid` and writable by no one else.
fn check_owner_and_mode(meta: &Metadata, euid: u32) -> Result<(), CacheRefusal> {
    if meta.uid() != euid {
        return Err(CacheRefusal::Owner {
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(CacheRefusal::Writable {
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

fn check_artifact(meta: &Metadata, euid: u32) -> Result<(), CacheRefusal> {
    let t = meta.file_type();
    if t.is_symlink() {
        return Err(CacheRefusal::Symlink);
    }
    if !t.is_file() {
        return Err(CacheRefusal::NotRegular(kind_of(meta)));
    }
    check_owner_and_mode(meta, euid)
}

/// Creates the directory (mode 700) if missing, and checks it. A symlink to the directory is
/// followed: the operator chose the path.
fn prepare_dir(dir: &Path, euid: u32) -> Result<(), CacheRefusal> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(CacheRefusal::NotDir(kind_of(&meta)));
    }
    check_owner_and_mode(&meta, euid)
}

/// The artifact, opened, if it exists and passes the checks, both on the path and on the opened
/// descriptor (what is checked is what is loaded).
fn open_artifact(path: &Path, euid: u32) -> Result<Option<File>, CacheRefusal> {
    let checked = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    check_artifact(&checked, euid)?;
    let file = match open_no_follow(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        // ELOOP: a symlink now.
        Err(e) if e.raw_os_error() == Some(ELOOP) => return Err(CacheRefusal::Replaced),
        Err(e) => return Err(e.into()),
    };
    let opened = file.metadata()?;
    check_artifact(&opened, euid)?;
    if opened.dev() != checked.dev() || opened.ino() != checked.ino() {
        return Err(CacheRefusal::Replaced);
    }
    Ok(Some(file))
}

/// A temporary file `write_artifact` made older than this is left from a compile that was killed
/// (every compile child is stopped by `COMPILE_TIMEOUT`); a younger one may be another replica's,
/// writing into the same cache now.
pub const STALE_TEMPORARY: std::time::Duration =
    compiler::COMPILE_TIMEOUT.saturating_add(std::time::Duration::from_secs(60));

/// Removes the temporary files in `dir` whose name `matches`, and which this host can have written:
/// regular files (not links: nothing is followed), of this user, readable by no one else, as
/// `write_artifact` makes them. Returns how many were removed.
fn remove_temporaries(dir: &Path, matches: impl Fn(&str, &Metadata) -> bool) -> usize {
    let (Ok(euid), Ok(entries)) = (effective_uid(), std::fs::read_dir(dir)) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(".tmp-") && name.ends_with(".cwasm")) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let ours = meta.file_type().is_file() && meta.uid() == euid && meta.mode() & 0o077 == 0;
        if ours && matches(name, &meta) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The temporary file a compile child with this pid may have left (it was killed mid-write).
pub(super) fn remove_temporaries_of(dir: &Path, pid: u32) {
    let prefix = format!(".tmp-{pid}-");
    remove_temporaries(dir, |name, _| name.starts_with(&prefix));
}

/// At start: the temporary files killed compiles left in the cache (older than
/// `STALE_TEMPORARY`). Returns how many were removed.
/// Keeps the cache within `max_bytes`: while its artifacts together are larger, removes the
/// oldest (by modification time) of those whose component is not in `named` (what the plugins
/// directory and the Plugin objects name now). Artifacts of named components are never removed, so
/// the cache can stay over the bound only by what runs. Returns how many were removed.
///
/// Without it, whoever may change a Plugin's source could fill the cache's volume with artifacts
/// of digests named once each (and get the Pod evicted).
pub fn keep_within(dir: &Path, named: &std::collections::HashSet<String>, max_bytes: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut artifacts: Vec<(std::time::SystemTime, u64, PathBuf, bool)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            // `SHA-ENGINE.cwasm`: the component's digest before the last `-`.
            let sha = name.strip_suffix(".cwasm")?.rsplit_once('-')?.0.to_string();
            let meta = e.path().symlink_metadata().ok()?;
            meta.is_file().then(|| {
                (
                    meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                    meta.len(),
                    e.path(),
                    named.contains(&sha),
                )
            })
        })
        .collect();
    let mut total: u64 = artifacts.iter().map(|a| a.1).sum();
    if total <= max_bytes {
        return 0;
    }
    artifacts.sort_by_key(|a| a.0);
    let mut removed = 0;
    for (_, len, path, is_named) in artifacts {
        if total <= max_bytes {
            break;
        }
        if is_named {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
            removed += 1;
        }
    }
    removed
}

pub fn clean_stale_temporaries(dir: &Path) -> usize {
    let now = std::time::SystemTime::now();
    remove_temporaries(dir, |_, meta| {
        meta.modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > STALE_TEMPORARY)
    })
}

fn store(component: &Component, dir: &Path, path: &Path) -> Result<()> {
    let bytes = component.serialize()?;
    write_artifact(dir, path, &bytes)
}

/// Writes a new file (O_EXCL, mode 600, a name no one can have prepared), syncs it, then renames it
/// into place: a reader never sees half a file, and nothing planted is written through.
pub(super) fn write_artifact(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp: PathBuf = dir.join(format!(
        ".tmp-{}-{}-{nanos}.cwasm",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| -> Result<()> {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("create {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {

    #[test]
    fn over_its_bound_the_cache_drops_the_oldest_unnamed_artifacts_only() {
        let dir = TempDir::new();
        let d = dir.cache();
        std::fs::create_dir_all(&d).unwrap();
        let write = |sha: &str, age_s: u64| {
            let p = d.join(format!("{sha}-engine.cwasm"));
            std::fs::write(&p, vec![0u8; 1000]).unwrap();
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        write("old-named", 400);
        write("old", 300);
        write("mid", 200);
        write("new", 100);
        std::fs::write(d.join(".tmp-writing"), vec![0u8; 1000]).unwrap();
        let named: std::collections::HashSet<String> = ["old-named".to_string()].into();
        // Within the bound: nothing goes.
        assert_eq!(keep_within(&d, &named, 4000), 0);
        // Over it: the oldest unnamed first, until within; the named one and a file being
        // written stay.
        assert_eq!(keep_within(&d, &named, 2500), 2);
        let left: std::collections::BTreeSet<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            left,
            ["old-named-engine.cwasm", "new-engine.cwasm", ".tmp-writing"]
                .into_iter()
                .map(String::from)
                .collect()
        );
        // Named artifacts are never removed, even over the bound.
        assert_eq!(keep_within(&d, &named, 0), 1);
        assert!(d.join("old-named-engine.cwasm").exists());
    }
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::{PermissionsExt, symlink};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "wcm-compile-cache-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            TempDir(p)
        }
        fn cache(&self) -> PathBuf {
            self.0.join("cache")
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn euid() -> u32 {
        effective_uid().expect("uid from /proc")
    }

    fn contents(file: Option<File>) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        file?.read_to_end(&mut bytes).expect("read");
        Some(bytes)
    }

    /// The smallest valid component: the header alone.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    #[test]
    fn effective_uid_is_the_owner_of_what_we_create() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        assert_eq!(std::fs::metadata(t.cache()).expect("stat").uid(), euid());
    }

    #[test]
    fn a_missing_directory_is_created_private() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let mode = std::fs::metadata(t.cache()).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_loose_or_foreign_directory_is_refused() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        std::fs::set_permissions(t.cache(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = prepare_dir(&t.cache(), euid()).expect_err("must refuse");
        assert!(
            matches!(err, CacheRefusal::Writable { mode: 0o777 }),
            "{err:?}"
        );
        std::fs::set_permissions(t.cache(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        prepare_dir(&t.cache(), euid()).expect("0755 is fine");
        let err = prepare_dir(&t.cache(), euid() + 1).expect_err("must refuse");
        assert!(matches!(err, CacheRefusal::Owner { .. }), "{err:?}");
    }

    #[test]
    fn a_file_written_by_the_cache_passes() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let path = t.cache().join("x.cwasm");
        write_artifact(&t.cache(), &path, b"artifact").expect("write");
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        assert_eq!(meta.mode() & 0o777, 0o600);
        let got = contents(open_artifact(&path, euid()).expect("passes"));
        assert_eq!(got.as_deref(), Some(&b"artifact"[..]));
        // Nothing left behind but the artifact.
        let names: Vec<_> = std::fs::read_dir(t.cache())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.cwasm")]);
        // Written again over itself: a new temporary name each time.
        write_artifact(&t.cache(), &path, b"again").expect("write");
        let got = contents(open_artifact(&path, euid()).expect("passes"));
        assert_eq!(got.as_deref(), Some(&b"again"[..]));
    }

    #[test]
    fn a_planted_writable_file_is_refused() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let path = t.cache().join("x.cwasm");
        std::fs::write(&path, b"planted").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let err = open_artifact(&path, euid()).expect_err("must refuse");
        assert!(
            matches!(err, CacheRefusal::Writable { mode: 0o666 }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("writable by group or others"),
            "{err}"
        );
        // Someone else's file.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let err = open_artifact(&path, euid() + 1).expect_err("must refuse");
        assert!(matches!(err, CacheRefusal::Owner { .. }), "{err:?}");
    }

    #[test]
    fn a_symlink_in_place_of_the_artifact_is_refused() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let real = t.cache().join("real.cwasm");
        write_artifact(&t.cache(), &real, b"artifact").expect("write");
        let path = t.cache().join("x.cwasm");
        symlink(&real, &path).expect("symlink");
        let err = open_artifact(&path, euid()).expect_err("must refuse");
        assert!(matches!(err, CacheRefusal::Symlink), "{err:?}");
        // A directory or a FIFO in its place.
        std::fs::remove_file(&path).expect("rm");
        std::fs::create_dir(&path).expect("mkdir");
        let err = open_artifact(&path, euid()).expect_err("must refuse");
        assert!(
            matches!(err, CacheRefusal::NotRegular("a directory")),
            "{err:?}"
        );
    }

    #[test]
    fn a_planted_artifact_is_not_loaded_and_is_replaced() {
        let t = TempDir::new();
        let engine = Engine::default();
        let sha = sha256_hex(EMPTY_COMPONENT);
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let path = t
            .cache()
            .join(format!("{sha}-{}.cwasm", engine_key(&engine)));
        // A genuine artifact, but writable by others: had it been loaded, it would come from the
        // cache.
        let genuine = compile(&engine, EMPTY_COMPONENT)
            .and_then(|c| Ok(c.serialize()?))
            .expect("serialize");
        std::fs::write(&path, &genuine).expect("plant");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let from_cache = loaded_from_cache(&engine, &t.cache(), &sha);
        assert!(!from_cache, "a group/world-writable artifact was loaded");
        // Compiled and stored again, privately: the next load uses it.
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        assert_eq!(meta.mode() & 0o777, 0o600);
        let from_cache = loaded_from_cache(&engine, &t.cache(), &sha);
        assert!(from_cache);
    }

    /// Loads `EMPTY_COMPONENT` in this process through the cache `dir`: whether it came from it.
    fn loaded_from_cache(engine: &Engine, dir: &Path, sha: &str) -> bool {
        load_or_compile(
            engine,
            Some(dir),
            sha,
            EMPTY_COMPONENT,
            None,
            &CompileCancel::new(),
        )
        .expect("compiles or loads")
        .from_cache
    }

    #[test]
    fn a_loose_directory_compiles_without_the_cache() {
        let t = TempDir::new();
        let engine = Engine::default();
        let sha = sha256_hex(EMPTY_COMPONENT);
        prepare_dir(&t.cache(), euid()).expect("prepare");
        std::fs::set_permissions(t.cache(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        for _ in 0..2 {
            let from_cache = loaded_from_cache(&engine, &t.cache(), &sha);
            assert!(!from_cache);
        }
        assert_eq!(std::fs::read_dir(t.cache()).expect("ls").count(), 0);
    }

    #[test]
    fn stale_temporaries_of_killed_compiles_are_removed_at_start_and_nothing_else() {
        let t = TempDir::new();
        prepare_dir(&t.cache(), euid()).expect("prepare");
        let c = t.cache();
        let old =
            std::time::SystemTime::now() - STALE_TEMPORARY - std::time::Duration::from_secs(60);
        let private = std::fs::Permissions::from_mode(0o600);
        let file = |name: &str, mode: u32, stale: bool| {
            let p = c.join(name);
            std::fs::write(&p, b"half an artifact").expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            if stale {
                File::options()
                    .write(true)
                    .open(&p)
                    .and_then(|f| f.set_modified(old))
                    .expect("age it");
            }
            p
        };
        let killed = file(".tmp-11-0-1.cwasm", 0o600, true);
        // Another replica's compile writing now, into a shared cache.
        let writing = file(".tmp-12-0-1.cwasm", 0o600, false);
        // Not as `write_artifact` makes them: readable by others, or not a temporary.
        let loose = file(".tmp-13-0-1.cwasm", 0o644, true);
        let artifact = file("abc-def.cwasm", 0o600, true);
        // A link named like a temporary, to a file outside: neither followed nor removed.
        let outside = t.0.join("outside");
        std::fs::write(&outside, b"keep").expect("write");
        std::fs::set_permissions(&outside, private.clone()).expect("chmod");
        let link = c.join(".tmp-14-0-1.cwasm");
        symlink(&outside, &link).expect("symlink");
        // Someone else's (root may give it away).
        let foreign = file(".tmp-15-0-1.cwasm", 0o600, true);
        let chowned = euid() == 0 && std::os::unix::fs::chown(&foreign, Some(4242), None).is_ok();

        assert_eq!(clean_stale_temporaries(&c), 1);
        assert!(!killed.exists(), "the stale temporary is left");
        for kept in [&writing, &loose, &artifact, &outside] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(
            std::fs::symlink_metadata(&link).is_ok(),
            "the link was removed"
        );
        assert_eq!(std::fs::read(&outside).expect("read"), b"keep");
        if chowned {
            assert!(foreign.exists(), "another user's file was removed");
        }
    }
}
