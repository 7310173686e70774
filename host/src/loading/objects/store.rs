//! The disk cache of fetched components. Every file is checked against its digest when read (by
//! the caller), so the cache is trusted for nothing but holding bytes: a file replaced by someone
//! else is simply not used. Reads still refuse a symlink, a FIFO or a device, and anything larger
//! than the cap, so a planted file can neither block nor exhaust the host.

use std::fs::DirBuilder;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::safe_fs::{kind_of, open_no_follow};

/// Makes `dir` (and its parents) if missing, mode 0700 for what is made here.
pub fn private_dir(dir: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("create {}", dir.display()))
}

/// The bytes of the regular file `path`, at most `max` of them.
pub fn read_private(path: &Path, max: usize) -> Result<Vec<u8>> {
    let file = open_no_follow(path).with_context(|| format!("open {}", path.display()))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        bail!("{} is {}", path.display(), kind_of(&meta));
    }
    if meta.len() > max as u64 {
        bail!("{} is larger than {max} bytes", path.display());
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max as u64 + 1).read_to_end(&mut out)?;
    if out.len() > max {
        bail!("{} grew past {max} bytes", path.display());
    }
    Ok(out)
}

/// Writes `bytes` to `path` through a new 0600 file beside it renamed into place, so a reader
/// never sees half a file.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("no parent directory")?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("no file name")?;
    let tmp = dir.join(format!(".tmp-{name}-{:016x}", rand_u64()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("write {}", path.display()))
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        return t as u64 ^ u64::from(std::process::id());
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_and_planted_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("wcm-store-{}", rand_u64()));
        private_dir(&dir).unwrap();
        let f = dir.join("a.wasm");
        write_private(&f, b"hello").unwrap();
        assert_eq!(read_private(&f, 10).unwrap(), b"hello");
        assert!(read_private(&f, 3).is_err(), "over the cap");
        let link = dir.join("link.wasm");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(read_private(&link, 10).is_err(), "a symlink");
        let fifo = dir.join("fifo.wasm");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_private(&fifo, 10).is_err(), "a FIFO, without blocking");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
