//! Writing recordings to `--record-dir`: a private directory per plugin, the newest files kept, each
//! file bounded in size.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::sandbox::redact::Unsafe;
use crate::sandbox::tape::{MAX_RECORDING_BYTES, Recording};

/// What the host records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordWhat {
    /// Reconciles that returned an error or failed.
    Failures,
    /// Every reconcile.
    All,
}

/// Writes recordings of a plugin's reconciles to `DIR/PLUGIN/`, keeping the newest `keep` of each
/// plugin. The directory is made private to this user: recordings hold the objects the plugin saw.
#[derive(Debug)]
pub struct Recorder {
    dir: PathBuf,
    what: RecordWhat,
    keep: usize,
    /// Serialises writes and pruning; also numbers the files.
    seq: Mutex<u64>,
    /// Plugins already warned about as not recordable (one warning each).
    warned: Mutex<std::collections::BTreeSet<String>>,
}

impl Recorder {
    pub fn new(dir: PathBuf, what: RecordWhat, keep: usize) -> Self {
        Recorder {
            dir,
            what,
            keep: keep.max(1),
            seq: Mutex::new(0),
            warned: Mutex::default(),
        }
    }

    /// Notes that a plugin's reconcile is not recorded, and why: warned once per plugin and reason.
    pub fn refuse(&self, plugin: &str, why: &Unsafe) {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.len() < 4096 && warned.insert(format!("{plugin}\0{why}")) {
            tracing::warn!(plugin, "reconciles of this plugin are not recorded: {why}");
        }
    }

    pub fn wants(&self, failed: bool) -> bool {
        failed || self.what == RecordWhat::All
    }

    /// Writes one recording; a failure to write is logged, never passed on to the reconcile.
    pub fn save(&self, rec: &Recording) {
        if let Err(e) = self.write(rec) {
            tracing::warn!(plugin = %rec.plugin, dir = %self.dir.display(), "could not write a recording: {e:#}");
        }
    }

    fn write(&self, rec: &Recording) -> anyhow::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let mut seq = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        *seq += 1;
        // The plugin's name is a validated DNS label; the key's parts are validated names. Still,
        // only these characters reach a path.
        let safe = |s: &str| -> String {
            let out: String = s
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(120)
                .collect();
            // Never "", "." or "..", nor a hidden name.
            if out.is_empty() || out.starts_with('.') {
                format!("_{out}")
            } else {
                out
            }
        };
        let dir = self.dir.join(safe(&rec.plugin));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let key = match &rec.request.namespace {
            Some(ns) => format!("{}_{}", safe(ns), safe(&rec.request.name)),
            None => safe(&rec.request.name),
        };
        let name = format!("{millis:015}-{:06}-{key}.json", *seq % 1_000_000);
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        if let Err(e) = write_bounded(&mut file, rec) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, dir.join(&name))?;
        // Keep the newest `keep`: names sort by time.
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect();
        names.sort();
        let excess = names.len().saturating_sub(self.keep);
        for old in &names[..excess] {
            let _ = std::fs::remove_file(dir.join(old));
        }
        Ok(())
    }
}

/// Writes a recording of at most [`MAX_RECORDING_BYTES`]: pretty when it fits, else compact, else
/// not at all (what was written is left for the caller to remove).
fn write_bounded(file: &mut std::fs::File, rec: &Recording) -> anyhow::Result<()> {
    use std::io::{Seek, Write};
    /// Fails once more than the bound was written.
    struct Bounded<'a>(&'a mut std::fs::File, u64);
    impl Write for Bounded<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.1 += buf.len() as u64;
            if self.1 > MAX_RECORDING_BYTES {
                return Err(std::io::Error::other("over the recording size bound"));
            }
            self.0.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
    let mut w = std::io::BufWriter::new(Bounded(file, 1));
    let pretty = serde_json::to_writer_pretty(&mut w, rec)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(w.write_all(b"\n")?))
        .and_then(|()| Ok(w.flush()?));
    drop(w);
    if pretty.is_ok() {
        return Ok(());
    }
    file.set_len(0)?;
    file.rewind()?;
    let mut w = std::io::BufWriter::new(Bounded(file, 0));
    serde_json::to_writer(&mut w, rec)?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::tape::{FORMAT, RecordedRequest};
    use serde_json::json;

    #[test]
    fn the_recorder_keeps_the_newest_files_in_a_private_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("wcm-tape-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let r = Recorder::new(dir.clone(), RecordWhat::All, 3);
        for i in 0..5 {
            r.write(&Recording {
                format: FORMAT,
                plugin: "p/../x".into(),
                sha256: "s".into(),
                started_at_ms: None,
                clock: vec![],
                reused_instance: false,
                request: RecordedRequest {
                    namespace: Some("ns".into()),
                    name: format!("o{i}"),
                    object: None,
                    attempt: 0,
                    scheduled: None,
                },
                calls: vec![],
                http: vec![],
                calls_left_out: 0,
                free_text_withheld: false,
                result: json!({"action": "done"}),
            })
            .expect("write");
        }
        let sub = dir.join("p_.._x");
        let mut names: Vec<String> = std::fs::read_dir(&sub)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[2].ends_with("ns_o4.json"), "{names:?}");
        let mode = std::fs::metadata(&sub).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let back = Recording::read(&sub.join(&names[2])).expect("read");
        assert_eq!(back.request.name, "o4");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
