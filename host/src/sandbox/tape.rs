//! Record and replay of one reconcile: the request, every host call the plugin made with the answer
//! it got, and the result. The host records to `--record-dir` (`Recorder`); `wasm-controller-manager
//! replay FILE PLUGIN.wasm` runs a component against a recording with no cluster, answering each
//! host call from it, and reports every call that differs.
//!
//! Secret values are never written: a `config.secret` answer, and any known form of a secret value
//! elsewhere in the recording, is written as a placeholder naming the setting (`redact.rs`), and a
//! replay hands the plugin that placeholder, so it makes the same calls. The free text of a plugin
//! that holds secrets (its log lines, its error message) is withheld.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::contract::{Action, ReconcileError, Request};
use crate::sandbox::CallError;
use crate::sandbox::redact::{Credentials, Redactor, Unsafe};

pub use crate::sandbox::recorder::{RecordWhat, Recorder};
pub use crate::sandbox::redact::secret_placeholder;

/// The version of the file format.
pub const FORMAT: u32 = 1;

/// A recording file's largest accepted size.
pub const MAX_RECORDING_BYTES: u64 = 64 << 20;

/// Bytes of calls one recording holds (arguments and answers as JSON); a plugin that makes more
/// is recorded up to here, and the recording says it was cut short.
pub const MAX_TAPE_BYTES: usize = 16 << 20;

/// Bytes of the reconciled object a recording holds; a larger one is left out.
pub const MAX_RECORDED_OBJECT: usize = 4 << 20;

/// Bytes of a free-text field (a log message or field, the guest's error, a failure) recorded.
pub const MAX_RECORDED_TEXT: usize = 4 << 10;

/// Fields of one log line recorded (as many as a log line keeps).
pub const MAX_RECORDED_LOG_FIELDS: usize = 32;

/// What stands for free text a plugin that holds secrets produced.
pub const WITHHELD: &str = "withheld";

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
    /// The schedule whose tick enqueued the key (contract 0.3); absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<String>,
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
            scheduled: self.scheduled.clone(),
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
    /// Calls made after the recording reached its size bound, and so not in it (an object or an
    /// HTTP exchange too large to record counts as one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls_left_out: usize,
    /// The plugin held secrets: its log lines and its error message are not in the recording
    /// (only their levels and whether it was terminal), and a replay compares them so.
    #[serde(default, skip_serializing_if = "is_false")]
    pub free_text_withheld: bool,
    pub result: Value,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
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
    /// `withhold`: the plugin holds secrets, so its free text is not recorded.
    pub fn recording(withhold: bool) -> Tapes {
        let mut calls = Tape::recording();
        if let Tape::Recording(t) = &mut calls {
            t.withhold = withhold;
        }
        Tapes {
            calls,
            http: Arc::new(Mutex::new(Tape::recording())),
            clock: Arc::default(),
        }
    }

    pub fn replaying(rec: &Recording) -> Tapes {
        let mut calls = Tape::replaying(rec.calls.clone());
        if let Tape::Replaying(r) = &mut calls {
            r.withhold = rec.free_text_withheld;
        }
        Tapes {
            calls,
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
    /// Credentials seen where the recording shows none (credential headers), to be replaced
    /// wherever else they occur.
    pub credentials: Credentials,
    /// Free text is withheld (the plugin holds secrets).
    withhold: bool,
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
    /// The recording withheld free text: the replay compares it withheld too.
    withhold: bool,
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
            withhold: false,
        })
    }

    pub fn is_replaying(&self) -> bool {
        matches!(self, Tape::Replaying(_))
    }

    /// Whether the plugin's free text is withheld from the recording.
    pub fn withholds_free_text(&self) -> bool {
        match self {
            Tape::Recording(t) => t.withhold,
            Tape::Replaying(r) => r.withhold,
        }
    }

    /// Recording: bytes the tape may still take (0 once a call was left out). Replaying: 0.
    pub fn room(&self) -> usize {
        match self {
            Tape::Recording(t) if t.left_out == 0 => MAX_TAPE_BYTES.saturating_sub(t.bytes),
            _ => 0,
        }
    }

    /// Recording: a call that is not recorded (too large for what is left).
    pub fn leave_out(&mut self) {
        if let Tape::Recording(t) = self {
            t.left_out += 1;
        }
    }

    /// Recording: the value of credential header `name`, kept out of the file wherever it occurs.
    pub fn credential_header(&mut self, name: &str, value: &str) {
        if let Tape::Recording(t) = self {
            t.credentials.header(name, value);
        }
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

    /// The calls, how many were left out past the bound, and the credentials seen.
    pub fn into_calls(self) -> (Vec<Exchange>, usize, Credentials) {
        match self {
            Tape::Recording(t) => (t.calls, t.left_out, t.credentials),
            Tape::Replaying(r) => (r.made, 0, Credentials::default()),
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

impl Recording {
    /// Keeps every secret out of the recording: each known form (`redact::forms`) of a secret
    /// value of the plugin (`secrets`: setting name and value), and of each credential its HTTP
    /// exchanges carried (`credentials`: from credential headers; the JSON fields, form fields and
    /// query parameters named like credentials are collected here), is replaced by its placeholder,
    /// so no secret is written and a replay, which hands the plugin the placeholders, makes the
    /// same calls. Fails, and the recording must not be written, when that cannot be done safely
    /// (a value too short to find, too many credentials, too much growth).
    pub fn redact<'a>(
        &mut self,
        secrets: impl Iterator<Item = (&'a str, &'a str)>,
        mut credentials: Credentials,
    ) -> Result<(), Unsafe> {
        for e in &self.http {
            credentials.value(&e.args);
            credentials.value(&e.answer);
        }
        for e in &self.calls {
            credentials.value(&e.args);
            credentials.value(&e.answer);
        }
        if credentials.too_many {
            return Err(Unsafe::TooManyCredentials);
        }
        let mut r = Redactor::new(secrets, &credentials.found, MAX_TAPE_BYTES)?;
        if let Some(o) = self.request.object.as_mut()
            && let Some(clean) = r.scrub(o)?
        {
            *o = clean;
        }
        // The key too (a plugin can name an object after a secret): it also names the file.
        if let Some(clean) = r.scrub(&self.request.name)? {
            self.request.name = clean;
        }
        if let Some(ns) = self.request.namespace.as_mut()
            && let Some(clean) = r.scrub(ns)?
        {
            *ns = clean;
        }
        for call in self.calls.iter_mut().chain(self.http.iter_mut()) {
            r.scrub_value(&mut call.args)?;
            r.scrub_value(&mut call.answer)?;
        }
        r.scrub_value(&mut self.result)
    }
}

/// The arguments of a log line as recorded: cut as the log line is, or only its level when the
/// plugin's free text is withheld.
pub fn log_args(level: &str, message: &str, fields: &[(String, String)], withhold: bool) -> Value {
    use crate::contract::validate::truncate;
    if withhold {
        return json!({"level": level, "text": WITHHELD});
    }
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .take(MAX_RECORDED_LOG_FIELDS)
        .map(|(k, v)| (truncate(k, 64), truncate(v, MAX_RECORDED_TEXT)))
        .collect();
    json!({"level": level, "message": truncate(message, MAX_RECORDED_TEXT), "fields": fields})
}

/// A reconcile's outcome as recorded: texts cut at [`MAX_RECORDED_TEXT`]; with `withhold`, the
/// guest's own text (its error message, a panic message) left out.
pub fn result_json(r: &Result<Result<Action, ReconcileError>, CallError>, withhold: bool) -> Value {
    use crate::contract::validate::truncate;
    match r {
        Ok(Ok(Action::Done)) => json!({"action": "done"}),
        Ok(Ok(Action::RequeueAfter(ms))) => json!({"action": "requeue-after", "ms": ms}),
        Ok(Err(e)) => {
            let message = if withhold {
                WITHHELD
            } else {
                truncate(&e.message, MAX_RECORDED_TEXT)
            };
            json!({"error": {"message": message, "terminal": e.terminal}})
        }
        Err(e) => {
            let text = match e {
                // Their text is the guest's (a panic message, a start function's trap).
                CallError::Trap(_) if withhold => format!("plugin trapped: {WITHHELD}"),
                CallError::Instantiate(_) if withhold => {
                    format!("could not instantiate: {WITHHELD}")
                }
                other => other.to_string(),
            };
            json!({"failure": truncate(&text, MAX_RECORDED_TEXT)})
        }
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

    fn recording(
        object: &str,
        calls: Vec<Exchange>,
        http: Vec<Exchange>,
        result: Value,
    ) -> Recording {
        Recording {
            format: FORMAT,
            plugin: "p".into(),
            sha256: "s".into(),
            started_at_ms: None,
            clock: vec![],
            reused_instance: false,
            request: RecordedRequest {
                namespace: None,
                name: "k".into(),
                object: Some(object.into()),
                attempt: 0,
                scheduled: None,
            },
            calls,
            http,
            calls_left_out: 0,
            free_text_withheld: false,
            result,
        }
    }

    #[test]
    fn secret_values_never_reach_a_recording() {
        let mut rec = recording(
            r#"{"data":"hunter22"}"#,
            vec![Exchange {
                call: "client.create".into(),
                args: json!({"body": "{\"password\":\"hunter22\"}", "list": ["a hunter22 b"], "hunter22": 1}),
                answer: json!({"ok": "hunter22"}),
            }],
            vec![Exchange {
                call: "http.request".into(),
                args: json!({"body": "secret=aHVudGVyMjI%3D"}),
                answer: json!({"status": 200}),
            }],
            json!({"error": {"message": "bad 68756e7465723232", "terminal": false}}),
        );
        rec.redact([("pw", "hunter22")].into_iter(), Credentials::default())
            .expect("redacted");
        let text = serde_json::to_string(&rec).expect("json");
        for form in ["hunter22", "aHVudGVyMjI", "68756e7465723232"] {
            assert!(!text.contains(form), "{form} in {text}");
        }
        assert!(text.contains(&secret_placeholder("pw")), "{text}");
    }

    #[test]
    fn a_secret_too_short_to_find_refuses_the_recording() {
        let mut rec = recording("{}", vec![], vec![], json!({"action": "done"}));
        assert_eq!(
            rec.redact([("pin", "abc")].into_iter(), Credentials::default()),
            Err(Unsafe::TooShort)
        );
        // Empty values hide nothing.
        let mut rec = recording("{}", vec![], vec![], json!({"action": "done"}));
        assert_eq!(
            rec.redact([("none", "")].into_iter(), Credentials::default()),
            Ok(())
        );
    }

    #[test]
    fn credentials_in_http_exchanges_are_replaced_everywhere() {
        let token = "gAAAAABtokenTOKENtoken0123456789";
        let mut creds = Credentials::default();
        creds.header("x-subject-token", token);
        let mut rec = recording(
            "{}",
            vec![Exchange {
                call: "log.log".into(),
                args: json!({"level": "Info", "message": format!("using {token}"), "fields": []}),
                answer: Value::Null,
            }],
            vec![Exchange {
                call: "http.request".into(),
                args: json!({"method": "POST", "uri": "http://idp/token?client_secret=s3cr3t-value",
                        "headers": [["x-auth-token", "redacted"]],
                        "body": "grant_type=password&password=p%40ssw0rd"}),
                answer: json!({"status": 200, "headers": [["x-subject-token", "redacted"]],
                        "body": "{\"access_token\":\"eyJhbGciOi.x.y\",\"token\":{\"methods\":[\"password\"]},\"Refresh_Token\":\"rt-123456\"}"}),
            }],
            json!({"action": "done"}),
        );
        rec.redact(std::iter::empty(), creds).expect("redacted");
        let text = serde_json::to_string(&rec).expect("json");
        for leak in [
            token,
            "s3cr3t-value",
            "p%40ssw0rd",
            "p@ssw0rd",
            "eyJhbGciOi.x.y",
            "rt-123456",
        ] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
        // What is not a credential stays: the replay needs it.
        assert!(text.contains("methods"), "{text}");
        assert!(text.contains("redacted-credential-"), "{text}");
    }

    #[test]
    fn free_text_is_cut_or_withheld() {
        let long = "x".repeat(10_000);
        let fields = vec![("k".to_string(), long.clone())];
        let args = log_args("Info", &long, &fields, false);
        assert!(
            args.to_string().len() < 2 * MAX_RECORDED_TEXT + 100,
            "{args}"
        );
        let args = log_args("Info", "s3cret in a line", &fields, true);
        assert_eq!(args, json!({"level": "Info", "text": WITHHELD}));
        let err: Result<Result<Action, ReconcileError>, CallError> = Ok(Err(ReconcileError {
            message: long.clone(),
            terminal: true,
            retry_after_ms: None,
        }));
        assert!(result_json(&err, false).to_string().len() < MAX_RECORDED_TEXT + 100);
        assert_eq!(
            result_json(&err, true),
            json!({"error": {"message": WITHHELD, "terminal": true}})
        );
        let trap: Result<Result<Action, ReconcileError>, CallError> =
            Err(CallError::Trap("panicked at s3cret".into()));
        assert!(!result_json(&trap, true).to_string().contains("s3cret"));
    }

    #[test]
    fn a_recording_stops_at_its_bound_and_counts_what_it_left_out() {
        let mut t = Tape::recording();
        let big = "x".repeat(1 << 20);
        for _ in 0..40 {
            t.note("client.create", json!({"body": big}), json!({"ok": ""}));
        }
        let (calls, left_out, _) = t.into_calls();
        assert!(calls.len() < 16, "{}", calls.len());
        assert_eq!(calls.len() + left_out, 40);
    }
}
