//! Reading a file from the untrusted plugins directory: only regular files inside it, size-capped.
//!
//! The directory may be a mounted ConfigMap, where `NAME.wasm -> ..data/NAME.wasm` and
//! `..data -> ..2024_01_01_xx/`: symlinks are followed as long as the final target lies inside the
//! directory. A symlink out of it, a FIFO (reading blocks forever), a device such as `/dev/zero`
//! (reading never ends) or a file over the limit is refused with a reason for the operator.
//! Refusal messages name paths and sizes, never file contents.

use std::fs::File;

use crate::safe_fs::{ELOOP, kind_of, open_no_follow};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a file in the plugins directory was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileRefusal {
    #[error("{} does not exist (removed while being read?)", path.display())]
    Missing { path: PathBuf },
    #[error("{} is a symlink to {}, which does not exist", path.display(), target.display())]
    Dangling { path: PathBuf, target: PathBuf },
    #[error("{} is a symlink to {}, outside the plugins directory {}", path.display(), target.display(), dir.display())]
    Outside {
        path: PathBuf,
        target: PathBuf,
        dir: PathBuf,
    },
    /// `kind` is e.g. "a FIFO", "a character device", "a directory".
    #[error("{} is {kind}, not a regular file", shown(path, target))]
    NotRegular {
        path: PathBuf,
        /// Where `path` leads, when it differs from `path`.
        target: Option<PathBuf>,
        kind: &'static str,
    },
    #[error("{} is {size} bytes, over the {limit} byte limit ({limit_name})", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("{} grew past the {limit} byte limit ({limit_name}) while being read", path.display())]
    Grew {
        path: PathBuf,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("{} was replaced while being opened; it is read again at the next rescan", path.display())]
    Replaced { path: PathBuf },
    #[error("{} is not UTF-8 text (first bad byte at offset {offset})", path.display())]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn shown(path: &Path, target: &Option<PathBuf>) -> String {
    match target {
        Some(t) => format!("{} (a symlink to {})", path.display(), t.display()),
        None => path.display().to_string(),
    }
}

/// Reads a plugin's `NAME.wasm`; `max_bytes` is `--max-plugin-bytes`.
pub fn read_plugin_file(dir: &Path, path: &Path, max_bytes: u64) -> Result<Vec<u8>, FileRefusal> {
    read_inside(dir, path, max_bytes, "--max-plugin-bytes")?
        .ok_or_else(|| FileRefusal::Missing { path: path.into() })
}

/// Reads a plugin's optional `NAME.toml`: `None` when there is none.
pub fn read_settings_file(
    dir: &Path,
    path: &Path,
    max_bytes: u64,
) -> Result<Option<String>, FileRefusal> {
    let Some(bytes) = read_inside(dir, path, max_bytes, "for a settings file")? else {
        return Ok(None);
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| FileRefusal::NotUtf8 {
            path: path.into(),
            offset: e.utf8_error().valid_up_to(),
        })
}

/// `None` when `path` does not exist at all (not even as a dangling symlink).
fn read_inside(
    dir: &Path,
    path: &Path,
    max_bytes: u64,
    limit_name: &'static str,
) -> Result<Option<Vec<u8>>, FileRefusal> {
    let unreadable = |p: &Path| {
        let p = p.to_path_buf();
        move |source: std::io::Error| FileRefusal::Unreadable { path: p, source }
    };
    let link_meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(path)(e)),
    };
    let canon_dir = std::fs::canonicalize(dir).map_err(unreadable(dir))?;
    let target = match std::fs::canonicalize(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(match std::fs::read_link(path) {
                Ok(target) => FileRefusal::Dangling {
                    path: path.into(),
                    target,
                },
                Err(_) => FileRefusal::Missing { path: path.into() },
            });
        }
        Err(e) => return Err(unreadable(path)(e)),
    };
    let shown_target = link_meta.file_type().is_symlink().then(|| target.clone());
    if !target.starts_with(&canon_dir) {
        return Err(FileRefusal::Outside {
            path: path.into(),
            target,
            dir: canon_dir,
        });
    }
    // `target` has no symlink left; a symlink here means it was swapped since.
    let checked = match std::fs::symlink_metadata(&target) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(FileRefusal::Replaced { path: path.into() });
        }
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(FileRefusal::Replaced { path: path.into() });
        }
        Err(e) => return Err(unreadable(path)(e)),
    };
    if !checked.file_type().is_file() {
        return Err(FileRefusal::NotRegular {
            path: path.into(),
            target: shown_target,
            kind: kind_of(&checked),
        });
    }
    if checked.len() > max_bytes {
        return Err(FileRefusal::TooLarge {
            path: path.into(),
            size: checked.len(),
            limit: max_bytes,
            limit_name,
        });
    }
    let file = match open_no_follow(&target) {
        Ok(f) => f,
        // ELOOP (a symlink now) or gone: swapped between the check and the open.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(ELOOP) => {
            return Err(FileRefusal::Replaced { path: path.into() });
        }
        Err(e) => return Err(unreadable(path)(e)),
    };
    let opened = file.metadata().map_err(unreadable(path))?;
    if !opened.file_type().is_file()
        || opened.dev() != checked.dev()
        || opened.ino() != checked.ino()
    {
        return Err(FileRefusal::Replaced { path: path.into() });
    }
    if !opened_inside(&file, &canon_dir) {
        return Err(FileRefusal::Replaced { path: path.into() });
    }
    if opened.len() > max_bytes {
        return Err(FileRefusal::TooLarge {
            path: path.into(),
            size: opened.len(),
            limit: max_bytes,
            limit_name,
        });
    }
    // One byte over the limit tells a file that grew during the read from one that fits exactly.
    let mut bytes = Vec::with_capacity(usize::try_from(opened.len()).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(unreadable(path))?;
    if bytes.len() as u64 > max_bytes {
        return Err(FileRefusal::Grew {
            path: path.into(),
            limit: max_bytes,
            limit_name,
        });
    }
    Ok(Some(bytes))
}

/// Where the open file really is, by `/proc/self/fd`: a directory on the canonical path could have
/// been swapped for a symlink between the check and the open. Without `/proc` (not Linux), the
/// dev/ino comparison is what remains.
fn opened_inside(file: &File, canon_dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(real) => real.starts_with(canon_dir),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "wcm-plugin-files-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(p.join("plugins")).expect("create temp dir");
            TempDir(p)
        }
        fn plugins(&self) -> PathBuf {
            self.0.join("plugins")
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const MAX: u64 = 1 << 20;

    #[test]
    fn reads_a_regular_file() {
        let t = TempDir::new();
        let p = t.plugins().join("a.wasm");
        std::fs::write(&p, b"\0asm-bytes").expect("write");
        let got = read_plugin_file(&t.plugins(), &p, MAX).expect("read");
        assert_eq!(got, b"\0asm-bytes");
    }

    #[test]
    fn reads_through_a_configmap_data_swap() {
        let t = TempDir::new();
        let d = t.plugins();
        let old = d.join("..2024_01_01_00_00_00.1");
        std::fs::create_dir(&old).expect("mkdir");
        std::fs::write(old.join("a.wasm"), b"v1").expect("write");
        std::fs::write(old.join("a.toml"), "enabled = true\n").expect("write");
        symlink("..2024_01_01_00_00_00.1", d.join("..data")).expect("symlink");
        symlink("..data/a.wasm", d.join("a.wasm")).expect("symlink");
        symlink("..data/a.toml", d.join("a.toml")).expect("symlink");
        assert_eq!(
            read_plugin_file(&d, &d.join("a.wasm"), MAX).expect("v1"),
            b"v1"
        );
        // The kubelet writes a new timestamped directory and renames a new `..data` link over the
        // old one.
        let new = d.join("..2024_01_02_00_00_00.2");
        std::fs::create_dir(&new).expect("mkdir");
        std::fs::write(new.join("a.wasm"), b"v2").expect("write");
        std::fs::write(new.join("a.toml"), "enabled = false\n").expect("write");
        symlink("..2024_01_02_00_00_00.2", d.join("..data_tmp")).expect("symlink");
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).expect("rename");
        std::fs::remove_dir_all(&old).expect("rm old");
        assert_eq!(
            read_plugin_file(&d, &d.join("a.wasm"), MAX).expect("v2"),
            b"v2"
        );
        assert_eq!(
            read_settings_file(&d, &d.join("a.toml"), MAX).expect("toml"),
            Some("enabled = false\n".to_string())
        );
    }

    #[test]
    fn a_symlink_out_of_the_directory_is_refused() {
        let t = TempDir::new();
        let outside = t.0.join("secret.txt");
        std::fs::write(&outside, b"do not read me").expect("write");
        let p = t.plugins().join("a.wasm");
        symlink(&outside, &p).expect("symlink");
        let err = read_plugin_file(&t.plugins(), &p, MAX).expect_err("must refuse");
        assert!(matches!(err, FileRefusal::Outside { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("outside the plugins directory"), "{msg}");
        assert!(msg.contains("secret.txt"), "{msg}");
        assert!(!msg.contains("do not read me"), "{msg}");
        // Through a `..data`-style directory link too.
        let d = t.plugins();
        symlink(&t.0, d.join("..data")).expect("symlink");
        let err = read_settings_file(&d, &d.join("..data/secret.txt"), MAX).expect_err("refuse");
        assert!(matches!(err, FileRefusal::Outside { .. }), "{err:?}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let t = TempDir::new();
        let d = t.plugins();
        let fifo = d.join("a.wasm");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");
        let started = Instant::now();
        let err = within_5s({
            let (d, fifo) = (d.clone(), fifo.clone());
            move || read_plugin_file(&d, &fifo, MAX)
        })
        .expect_err("must refuse");
        assert!(
            err.to_string().contains("is a FIFO, not a regular file"),
            "{err}"
        );
        // The open itself must not block either: O_NONBLOCK takes effect.
        let is_file = within_5s({
            let fifo = fifo.clone();
            move || open_no_follow(&fifo).map(|f| f.metadata().map(|m| m.is_file()))
        });
        assert!(matches!(is_file, Ok(Ok(false))), "{is_file:?}");
        // The same through a symlink (the settings reader).
        let link = d.join("b.toml");
        symlink("a.wasm", &link).expect("symlink");
        let err = within_5s(move || read_settings_file(&d, &link, MAX)).expect_err("must refuse");
        assert!(
            matches!(err, FileRefusal::NotRegular { kind: "a FIFO", .. }),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Runs `f` on a thread so that a regression (a blocking open or read) fails the test instead of
    /// hanging it.
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("blocked for 5 s on a FIFO")
    }

    #[test]
    fn dev_zero_is_refused() {
        let t = TempDir::new();
        let d = t.plugins();
        let p = d.join("a.toml");
        symlink("/dev/zero", &p).expect("symlink");
        let err = read_settings_file(&d, &p, MAX).expect_err("must refuse");
        assert!(matches!(err, FileRefusal::Outside { .. }), "{err:?}");
        // With the directory being /dev itself, the check that remains is the file type.
        let err = read_settings_file(Path::new("/dev"), Path::new("/dev/zero"), MAX)
            .expect_err("must refuse");
        assert!(
            err.to_string()
                .contains("is a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_link_to_a_directory_is_refused() {
        let t = TempDir::new();
        let d = t.plugins();
        std::fs::create_dir(d.join("..data")).expect("mkdir");
        symlink("..data", d.join("a.wasm")).expect("symlink");
        let err = read_plugin_file(&d, &d.join("a.wasm"), MAX).expect_err("must refuse");
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn oversize_is_refused() {
        let t = TempDir::new();
        let p = t.plugins().join("a.wasm");
        std::fs::write(&p, vec![7u8; 101]).expect("write");
        let err = read_plugin_file(&t.plugins(), &p, 100).expect_err("must refuse");
        assert_eq!(
            err.to_string(),
            format!(
                "{} is 101 bytes, over the 100 byte limit (--max-plugin-bytes)",
                p.display()
            )
        );
        // Exactly at the limit is fine.
        assert_eq!(
            read_plugin_file(&t.plugins(), &p, 101).expect("fits").len(),
            101
        );
    }

    #[test]
    fn missing_settings_is_none_and_a_dangling_link_is_refused() {
        let t = TempDir::new();
        let d = t.plugins();
        assert_eq!(
            read_settings_file(&d, &d.join("a.toml"), MAX).expect("ok"),
            None
        );
        assert!(matches!(
            read_plugin_file(&d, &d.join("a.wasm"), MAX),
            Err(FileRefusal::Missing { .. })
        ));
        symlink("..data/a.toml", d.join("a.toml")).expect("symlink");
        let err = read_settings_file(&d, &d.join("a.toml"), MAX).expect_err("must refuse");
        assert!(matches!(err, FileRefusal::Dangling { .. }), "{err:?}");
    }

    #[test]
    fn non_utf8_settings_are_refused() {
        let t = TempDir::new();
        let p = t.plugins().join("a.toml");
        std::fs::write(&p, b"name = \"\xff\xfe\"\n").expect("write");
        let err = read_settings_file(&t.plugins(), &p, MAX).expect_err("must refuse");
        assert!(
            matches!(err, FileRefusal::NotUtf8 { offset: 8, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("is not UTF-8"), "{err}");
    }

    #[test]
    fn open_does_not_follow_a_final_symlink() {
        let t = TempDir::new();
        let p = t.plugins().join("a.wasm");
        std::fs::write(t.plugins().join("real"), b"x").expect("write");
        symlink("real", &p).expect("symlink");
        let err = open_no_follow(&p).expect_err("O_NOFOLLOW must refuse a symlink");
        assert_eq!(err.raw_os_error(), Some(ELOOP), "{err}");
    }
}
