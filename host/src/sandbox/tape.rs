//! Record and replay of one reconcile: the request, every host call the plugin made with the answer
//! it got, and the result. The host records to `--record-dir` (`Recorder`); `wasm-controller-manager
//! replay FILE PLUGIN.wasm` runs a component against a recording with no cluster, answering each
//! host call from it, and reports every call that differs.
//!
//! Secret values are never written: a `config.secret` answer, and any occurrence of a secret value
//! elsewhere in the recording, is written as a placeholder made from its digest, and a replay hands
//! the plugin that placeholder, so it makes the same calls.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::contract::{Action, ReconcileError, Request};
use crate::sandbox::CallError;

/// The version of the file format.
pub const FORMAT: u32 = 1;

/// A recording file's largest accepted size.
pub const MAX_RECORDING_BYTES: u64 = 64 << 20;

/// Bytes of calls one recording holds (arguments and answers as JSON); a plugin that makes more
/// is recorded up to here, and the recording says it was cut short.
pub const MAX_TAPE_BYTES: usize = 16 << 20;

/// One host call: what was asked, and what was answered (null for calls that return nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub call: String,
    pub args: Value,
    #[serde(default)]
    pub answer: Value,
}

/// The request a reconcile was called with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    pub namespace: Option<String>,
    pub name: String,
    pub object: Option<String>,
    pub attempt: u32,
}

impl RecordedRequest {
    pub fn to_request(&self) -> Request {
        Request {
            key: crate::contract::ObjectKey {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            },
            object: self.object.clone(),
            attempt: self.attempt,
        }
    }
}

/// A recorded reconcile, as written to a file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recording {
    pub format: u32,
    pub plugin: String,
    /// SHA-256 of the component that ran.
    pub sha256: String,
    /// When the call started (Unix milliseconds).
    #[serde(default)]
    pub started_at_ms: Option<u64>,
    /// The guest's wall-clock readings, in order (Unix nanoseconds); a replay hands them back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock: Vec<u64>,
    /// The call ran in an instance that had served earlier calls (`isolation = "worker"`): state
    /// it kept from them (a cached token, say) is not in the recording.
    #[serde(default)]
    pub reused_instance: bool,
    pub request: RecordedRequest,
    pub calls: Vec<Exchange>,
    /// Outbound HTTP requests and their responses, in the order they were sent (matched in that
    /// order, apart from the host calls).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<Exchange>,
    /// Calls made after the recording reached its size bound, and so not in it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls_left_out: usize,
    pub result: Value,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Recording {
    /// Reads and checks a recording file.
    pub fn read(path: &Path) -> anyhow::Result<Recording> {
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        if !meta.is_file() {
            anyhow::bail!("{} is not a file", path.display());
        }
        if meta.len() > MAX_RECORDING_BYTES {
            anyhow::bail!(
                "{} has {} bytes; a recording has at most {MAX_RECORDING_BYTES}",
                path.display(),
                meta.len()
            );
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let rec: Recording = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a recording: {e}", path.display()))?;
        if rec.format != FORMAT {
            anyhow::bail!(
                "{} is a recording of format {}; this host reads format {FORMAT}",
                path.display(),
                rec.format
            );
        }
        Ok(rec)
    }
}

/// The two tapes of one call: host calls, and outbound HTTP (which the HTTP client's hooks reach
/// from futures of their own, so it is shared).
pub struct Tapes {
    pub calls: Tape,
    pub http: Arc<Mutex<Tape>>,
    /// The guest's wall-clock readings: recorded, or played back.
    pub clock: Arc<Mutex<ClockTape>>,
}

/// Most wall-clock readings one recording keeps.
const MAX_CLOCK_READINGS: usize = 10_000;

/// The guest's wall-clock readings (nanoseconds since the Unix epoch). Recording: each reading is
/// kept. Replaying: the recorded readings are handed back in order, then the last one moves on with
/// real time. So a plugin that writes the time (a condition's `lastTransitionTime`) replays the same.
#[derive(Debug, Default)]
pub struct ClockTape {
    replaying: bool,
    readings: Vec<u64>,
    next: usize,
    /// Replaying, past the recorded readings: the last one, and when it was handed out.
    last: Option<(u64, std::time::Instant)>,
}

impl ClockTape {
    /// A reading of the wall clock.
    pub fn now(&mut self) -> std::time::Duration {
        let real = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
        };
        if !self.replaying {
            let now = real();
            if self.readings.len() < MAX_CLOCK_READINGS {
                self.readings
                    .push(u64::try_from(now.as_nanos()).unwrap_or(u64::MAX));
            }
            return now;
        }
        if let Some(&r) = self.readings.get(self.next) {
            self.next += 1;
            self.last = Some((r, std::time::Instant::now()));
            return std::time::Duration::from_nanos(r);
        }
        match self.last {
            Some((r, at)) => std::time::Duration::from_nanos(r) + at.elapsed(),
            None => real(),
        }
    }

    pub fn into_readings(self) -> Vec<u64> {
        self.readings
    }
}

impl Tapes {
    pub fn recording() -> Tapes {
        Tapes {
            calls: Tape::recording(),
            http: Arc::new(Mutex::new(Tape::recording())),
            clock: Arc::default(),
        }
    }

    pub fn replaying(rec: &Recording) -> Tapes {
        Tapes {
            calls: Tape::replaying(rec.calls.clone()),
            http: Arc::new(Mutex::new(Tape::replaying(rec.http.clone()))),
            clock: Arc::new(Mutex::new(ClockTape {
                replaying: true,
                readings: rec.clock.clone(),
                ..ClockTape::default()
            })),
        }
    }

    /// The HTTP tape, out of its sharing (a request the guest abandoned may still hold it).
    pub fn take_http(http: Arc<Mutex<Tape>>) -> Tape {
        match Arc::try_unwrap(http) {
            Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
            Err(shared) => {
                let mut t = shared.lock().unwrap_or_else(|p| p.into_inner());
                let empty = if t.is_replaying() {
                    Tape::replaying(Vec::new())
                } else {
                    Tape::recording()
                };
                std::mem::replace(&mut *t, empty)
            }
        }
    }
}

/// The host calls of one call into a plugin, as they are made (recording) or answered from a
/// recording (replaying).
#[derive(Debug)]
pub enum Tape {
    Recording(Taken),
    Replaying(Replay),
}

/// The calls recorded so far, bounded by [`MAX_TAPE_BYTES`].
#[derive(Debug, Default)]
pub struct Taken {
    pub calls: Vec<Exchange>,
    bytes: usize,
    /// Calls left out once the bound was reached.
    pub left_out: usize,
}

/// A replay in progress.
#[derive(Debug, Default)]
pub struct Replay {
    recorded: Vec<Exchange>,
    next: usize,
    /// Every call the plugin made, with the answer it was given.
    pub made: Vec<Exchange>,
    /// What differed from the recording, in order.
    pub differences: Vec<String>,
}

impl Tape {
    pub fn recording() -> Tape {
        Tape::Recording(Taken::default())
    }

    pub fn replaying(recorded: Vec<Exchange>) -> Tape {
        Tape::Replaying(Replay {
            recorded,
            next: 0,
            made: Vec::new(),
            differences: Vec::new(),
        })
    }

    pub fn is_replaying(&self) -> bool {
        matches!(self, Tape::Replaying(_))
    }

    /// Replaying: the recorded answer to this call (null when the recording has no such call,
    /// which is noted as a difference). Recording: nothing.
    pub fn answer(&mut self, call: &str, args: &Value) -> Option<Value> {
        let Tape::Replaying(r) = self else {
            return None;
        };
        let found = r.recorded[r.next..]
            .iter()
            .position(|e| e.call == call && &e.args == args)
            .map(|i| r.next + i);
        let answer = match found {
            Some(i) => {
                for skipped in &r.recorded[r.next..i] {
                    r.differences
                        .push(format!("recorded call not made: {}", summary(skipped)));
                }
                r.next = i + 1;
                r.recorded[i].answer.clone()
            }
            None => {
                r.differences.push(format!(
                    "call not in the recording: {}",
                    summary(&Exchange {
                        call: call.into(),
                        args: args.clone(),
                        answer: Value::Null,
                    })
                ));
                Value::Null
            }
        };
        r.made.push(Exchange {
            call: call.into(),
            args: args.clone(),
            answer: answer.clone(),
        });
        Some(answer)
    }

    /// Recording: notes a call and its answer. Replaying: checks a call that returns nothing
    /// (an event, a log line) against the recording.
    pub fn note(&mut self, call: &str, args: Value, answer: Value) {
        match self {
            Tape::Recording(taken) => {
                let size = call.len() + json_len(&args) + json_len(&answer);
                if taken.left_out > 0 || taken.bytes + size > MAX_TAPE_BYTES {
                    taken.left_out += 1;
                    return;
                }
                taken.bytes += size;
                taken.calls.push(Exchange {
                    call: call.into(),
                    args,
                    answer,
                });
            }
            Tape::Replaying(_) => {
                self.answer(call, &args);
            }
        }
    }

    /// Ends a replay: recorded calls the plugin never reached are differences too.
    pub fn finish(self) -> Option<Replay> {
        match self {
            Tape::Recording(_) => None,
            Tape::Replaying(mut r) => {
                for e in &r.recorded[r.next..] {
                    r.differences
                        .push(format!("recorded call not made: {}", summary(e)));
                }
                Some(r)
            }
        }
    }

    /// The calls, and how many were left out past the bound.
    pub fn into_calls(self) -> (Vec<Exchange>, usize) {
        match self {
            Tape::Recording(t) => (t.calls, t.left_out),
            Tape::Replaying(r) => (r.made, 0),
        }
    }
}

/// The length of a value's JSON text, without allocating it.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// One line for a call, its arguments shortened.
pub fn summary(e: &Exchange) -> String {
    let args = e.args.to_string();
    let args = crate::contract::validate::truncate(&args, 300);
    format!("{} {args}", e.call)
}

/// What a replay hands the plugin in place of a secret value, and what stands for that value
/// wherever a recording would have held it.
pub fn secret_placeholder(value: &str) -> String {
    format!("redacted-{}", crate::sandbox::sha256_hex(value.as_bytes()))
}

impl Recording {
    /// Replaces every occurrence of a secret value in the recording (a plugin may put one into a
    /// request body or a log line) with its placeholder, so no secret is written and a replay,
    /// which hands the plugin the placeholder, makes the same calls.
    pub fn redact<'a>(&mut self, secrets: impl Iterator<Item = &'a str>) {
        // Values this short would redact unrelated text; such a secret is no secret anyway.
        let secrets: Vec<(&str, String)> = secrets
            .filter(|s| s.len() >= 6)
            .map(|s| (s, secret_placeholder(s)))
            .collect();
        if secrets.is_empty() {
            return;
        }
        let scrub = |s: &mut String| {
            for (value, placeholder) in &secrets {
                if s.contains(value) {
                    *s = s.replace(value, placeholder);
                }
            }
        };
        if let Some(o) = self.request.object.as_mut() {
            scrub(o);
        }
        for call in self.calls.iter_mut().chain(self.http.iter_mut()) {
            scrub_value(&mut call.args, &scrub);
            scrub_value(&mut call.answer, &scrub);
        }
        scrub_value(&mut self.result, &scrub);
    }
}

fn scrub_value(v: &mut Value, scrub: &impl Fn(&mut String)) {
    match v {
        Value::String(s) => scrub(s),
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_value(x, scrub)),
        Value::Object(o) => o.values_mut().for_each(|x| scrub_value(x, scrub)),
        _ => {}
    }
}

/// A reconcile's outcome as recorded.
pub fn result_json(r: &Result<Result<Action, ReconcileError>, CallError>) -> Value {
    match r {
        Ok(Ok(Action::Done)) => json!({"action": "done"}),
        Ok(Ok(Action::RequeueAfter(ms))) => json!({"action": "requeue-after", "ms": ms}),
        Ok(Err(e)) => json!({"error": {"message": e.message, "terminal": e.terminal}}),
        Err(e) => json!({"failure": e.to_string()}),
    }
}

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
}

impl Recorder {
    pub fn new(dir: PathBuf, what: RecordWhat, keep: usize) -> Self {
        Recorder {
            dir,
            what,
            keep: keep.max(1),
            seq: Mutex::new(0),
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
        serde_json::to_writer_pretty(&mut file, rec)?;
        std::io::Write::write_all(&mut file, b"\n")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(call: &str, n: u32) -> Exchange {
        Exchange {
            call: call.into(),
            args: json!({"n": n}),
            answer: json!(n * 10),
        }
    }

    #[test]
    fn a_replay_in_the_recorded_order_matches() {
        let mut t = Tape::replaying(vec![ex("a", 1), ex("b", 2)]);
        assert_eq!(t.answer("a", &json!({"n": 1})), Some(json!(10)));
        assert_eq!(t.answer("b", &json!({"n": 2})), Some(json!(20)));
        let r = t.finish().expect("replay");
        assert!(r.differences.is_empty(), "{:?}", r.differences);
        assert_eq!(r.made.len(), 2);
    }

    #[test]
    fn other_calls_and_missing_calls_are_differences() {
        let mut t = Tape::replaying(vec![ex("a", 1), ex("b", 2), ex("c", 3)]);
        assert_eq!(t.answer("x", &json!({"n": 9})), Some(Value::Null));
        // b is found past a: a was not made.
        assert_eq!(t.answer("b", &json!({"n": 2})), Some(json!(20)));
        let r = t.finish().expect("replay");
        assert_eq!(r.differences.len(), 3, "{:?}", r.differences);
        assert!(r.differences[0].starts_with("call not in the recording: x"));
        assert!(r.differences[1].starts_with("recorded call not made: a"));
        assert!(r.differences[2].starts_with("recorded call not made: c"));
    }

    #[test]
    fn secret_values_never_reach_a_recording() {
        let mut rec = Recording {
            format: FORMAT,
            plugin: "p".into(),
            sha256: "s".into(),
            started_at_ms: None,
            clock: vec![],
            reused_instance: false,
            request: RecordedRequest {
                namespace: None,
                name: "k".into(),
                object: Some(r#"{"data":"hunter22"}"#.into()),
                attempt: 0,
            },
            calls: vec![Exchange {
                call: "client.create".into(),
                args: json!({"body": "{\"password\":\"hunter22\"}", "list": ["a hunter22 b"]}),
                answer: json!({"ok": "hunter22"}),
            }],
            http: vec![Exchange {
                call: "http.request".into(),
                args: json!({"body": "secret=hunter22"}),
                answer: json!({"status": 200}),
            }],
            calls_left_out: 0,
            result: json!({"error": {"message": "bad hunter22", "terminal": false}}),
        };
        rec.redact(["hunter22", "abc"].into_iter());
        let text = serde_json::to_string(&rec).expect("json");
        assert!(!text.contains("hunter22"), "{text}");
        assert!(text.contains(&secret_placeholder("hunter22")), "{text}");
        // Too short to redact without hitting unrelated text.
        assert!(text.contains("abc") || !text.contains(&secret_placeholder("abc")));
    }

    #[test]
    fn a_recording_stops_at_its_bound_and_counts_what_it_left_out() {
        let mut t = Tape::recording();
        let big = "x".repeat(1 << 20);
        for _ in 0..40 {
            t.note("client.create", json!({"body": big}), json!({"ok": ""}));
        }
        let (calls, left_out) = t.into_calls();
        assert!(calls.len() < 16, "{}", calls.len());
        assert_eq!(calls.len() + left_out, 40);
    }

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
                },
                calls: vec![],
                http: vec![],
                calls_left_out: 0,
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
