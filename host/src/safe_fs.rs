//! Opening files that someone else may control (the plugins directory, the compile cache) without
//! following a symlink in the last component and without blocking on a FIFO. Below both the loader
//! and the sandbox, which both need it.

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The error of opening a symlink with `O_NOFOLLOW`.
pub(crate) const ELOOP: i32 = libc::ELOOP;

/// Opens `path` read-only without following a symlink in its last component and without blocking
/// on a FIFO (std adds `O_CLOEXEC` itself).
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
}

/// What a non-regular file is, for messages.
pub(crate) fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}
