//! Test support: a real OpenTelemetry Collector on loopback (`testenv/otelcol/`: the upstream
//! collector with the OTLP receiver and the contrib file exporter).
//!
//! [`Collector::start`] runs `testenv-otelcol` (the binary named by `WCM_TESTENV_OTELCOL_BIN`,
//! built by `testenv/otelcol/build.sh`) with a config it writes into a fresh directory: the OTLP
//! receiver on `127.0.0.1` (HTTP and gRPC, free ports), the file exporter writing every traces
//! export it accepted to `traces.jsonl` as OTLP JSON (one `ExportTraceServiceRequest` object a
//! line), its own metrics and traces off, its log on stderr into `collector.log`.
//! [`Collector::spans`] parses that file into [`SpanRecord`]s; [`Collector::wait_for_spans`] polls
//! it until a predicate holds. Dropping the handle stops the collector (SIGTERM, then SIGKILL) and
//! removes its directory.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

/// Environment variable naming the `testenv-otelcol` binary (`$(testenv/otelcol/build.sh)`).
pub const TESTENV_OTELCOL_BIN: &str = "WCM_TESTENV_OTELCOL_BIN";

/// The collector is ready in well under a second; a loaded machine takes longer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the file exporter flushes its buffer to `traces.jsonl`.
const FLUSH_INTERVAL_MS: u64 = 100;
/// What the collector logs once every component has started.
const READY_LINE: &str = "Everything is ready";

/// How the collector is started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectorOptions {
    /// Run it under `strace -f -e trace=connect,bind` and keep the trace
    /// ([`Collector::socket_calls`]), to show where it binds and connects. Needs `strace` on PATH.
    pub strace_connect: bool,
}

/// A span's status code, as OTLP numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStatus {
    Unset,
    Ok,
    Error,
}

/// One span as the collector received it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's SpanKind number (0 unspecified, 1 internal, 2 server, 3 client, 4 producer,
    /// 5 consumer).
    pub kind: i64,
    /// Every attribute's value as a string: strings as they are, ints and doubles in decimal,
    /// bools as `true`/`false`, arrays, maps and bytes as their OTLP JSON.
    pub attributes: BTreeMap<String, String>,
    pub status: SpanStatus,
    pub status_message: String,
    /// The resource's `service.name`, when it has one.
    pub service_name: Option<String>,
    /// The instrumentation scope's name.
    pub scope_name: String,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
}

/// A collector owned by this process. Dropping it stops the collector and removes its directory.
pub struct Collector {
    child: Child,
    dir: PathBuf,
    http: SocketAddr,
    grpc: SocketAddr,
    export: PathBuf,
    log: PathBuf,
    strace_log: Option<PathBuf>,
}

impl Collector {
    /// Starts a collector on free ports of 127.0.0.1 and waits until it accepts connections.
    pub fn start() -> Result<Collector> {
        Self::start_with(CollectorOptions::default())
    }

    pub fn start_with(options: CollectorOptions) -> Result<Collector> {
        let bin = otelcol_binary()?;
        // A port picked here can be taken by someone else before the collector binds it: retry.
        let mut last = None;
        for attempt in 0..3 {
            match Self::try_start(&bin, &options, attempt) {
                Ok(c) => return Ok(c),
                Err(e) if format!("{e:#}").contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("testenv-otelcol did not start")))
    }

    fn try_start(bin: &Path, options: &CollectorOptions, attempt: u32) -> Result<Collector> {
        let dir = std::env::temp_dir().join(format!(
            "wcm-otelcol-{}-{}-{attempt}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let http = free_port()?;
        let grpc = free_port()?;
        let export = dir.join("traces.jsonl");
        let log = dir.join("collector.log");
        let config = dir.join("config.yaml");
        std::fs::write(&config, config_yaml(http, grpc, &export))
            .with_context(|| format!("write {}", config.display()))?;
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let config_arg = format!("--config=file:{}", config.display());
        let strace_log = options.strace_connect.then(|| dir.join("connect.strace"));
        let mut cmd = match &strace_log {
            Some(trace) => {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq", "-e", "trace=connect,bind", "-o"])
                    .arg(trace)
                    .arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg(&config_arg)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().context("collector log")?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut collector = Collector {
            child,
            dir,
            http,
            grpc,
            export,
            log,
            strace_log,
        };
        collector.wait_ready()?;
        Ok(collector)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("collector status")? {
                bail!(
                    "testenv-otelcol exited ({status}) before it was ready:\n{}",
                    self.log()
                );
            }
            if self.log().contains(READY_LINE)
                && TcpStream::connect_timeout(&self.http, Duration::from_secs(1)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "testenv-otelcol was not ready within {}s:\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`: the OTLP/HTTP base URL. Traces go to `{endpoint}/v1/traces`
    /// (`application/x-protobuf` or `application/json`).
    pub fn otlp_http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `127.0.0.1:PORT` of the OTLP/HTTP receiver.
    pub fn otlp_http_addr(&self) -> SocketAddr {
        self.http
    }

    /// `http://127.0.0.1:PORT`: the OTLP/gRPC receiver (plain text).
    pub fn otlp_grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The file the exporter writes: one OTLP JSON traces export a line.
    pub fn export_file(&self) -> &Path {
        &self.export
    }

    /// The collector's own log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The collector's process id (under strace: strace's child, not strace).
    pub fn pid(&self) -> u32 {
        let pid = self.child.id();
        if self.strace_log.is_none() {
            return pid;
        }
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or(pid)
    }

    /// The `connect()` and `bind()` lines strace recorded so far; `None` without
    /// [`CollectorOptions::strace_connect`].
    pub fn socket_calls(&self) -> Option<Vec<String>> {
        let path = self.strace_log.as_ref()?;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Some(
            text.lines()
                .filter(|l| l.contains("connect(") || l.contains("bind("))
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Every span in the export file so far, in the order the collector received them. A last
    /// line the exporter is still writing is left for the next call.
    pub fn spans(&self) -> Result<Vec<SpanRecord>> {
        let text = match std::fs::read_to_string(&self.export) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("read {}", self.export.display())),
        };
        let mut spans = Vec::new();
        let mut lines = text.split_inclusive('\n').peekable();
        while let Some(line) = lines.next() {
            if !line.ends_with('\n') && lines.peek().is_none() {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            spans.extend(
                parse_export_line(line)
                    .with_context(|| format!("{}: {line}", self.export.display()))?,
            );
        }
        Ok(spans)
    }

    /// Polls [`Collector::spans`] until `done` holds for them, and returns them; fails after
    /// `timeout` naming what it saw.
    pub async fn wait_for_spans(
        &self,
        done: impl Fn(&[SpanRecord]) -> bool,
        timeout: Duration,
    ) -> Result<Vec<SpanRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans()?;
            if done(&spans) {
                return Ok(spans);
            }
            if Instant::now() > deadline {
                let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
                bail!(
                    "the collector did not receive the expected spans within {:?}; it has {} span(s): {names:?}",
                    timeout,
                    spans.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // The collector itself: strace, signalled, would detach and leave it running.
            let target = self.pid();
            let _ = Command::new("kill")
                .args(["-TERM", &target.to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if target != self.child.id() {
                let _ = Command::new("kill")
                    .args(["-KILL", &target.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The binary named by `WCM_TESTENV_OTELCOL_BIN`.
pub fn otelcol_binary() -> Result<PathBuf> {
    let Some(bin) = std::env::var_os(TESTENV_OTELCOL_BIN) else {
        bail!(
            "{TESTENV_OTELCOL_BIN} is not set: build the test collector and name it, \
             `export {TESTENV_OTELCOL_BIN}=$(testenv/otelcol/build.sh)` (scripts/setup and scripts/test do)"
        );
    };
    let bin = PathBuf::from(bin);
    anyhow::ensure!(
        bin.is_file(),
        "{TESTENV_OTELCOL_BIN}={} is not a file",
        bin.display()
    );
    Ok(bin)
}

fn config_yaml(http: SocketAddr, grpc: SocketAddr, export: &Path) -> String {
    // JSON strings are valid YAML scalars: the path is quoted whatever it contains.
    let export = Value::String(export.display().to_string());
    format!(
        "receivers:
  otlp:
    protocols:
      http:
        endpoint: {http}
      grpc:
        endpoint: {grpc}
exporters:
  file:
    path: {export}
    format: json
    flush_interval: {FLUSH_INTERVAL_MS}ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: info
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"
    )
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    listener.local_addr().context("local address")
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The spans of one line of the file exporter's JSON output (an `ExportTraceServiceRequest`).
pub fn parse_export_line(line: &str) -> Result<Vec<SpanRecord>> {
    let export: Value = serde_json::from_str(line).context("not JSON")?;
    let mut out = Vec::new();
    for rs in array(&export, "resourceSpans") {
        let service_name = rs
            .get("resource")
            .map(attributes)
            .and_then(|mut a| a.remove("service.name"));
        for ss in array(rs, "scopeSpans") {
            let scope_name = ss
                .get("scope")
                .and_then(|s| s.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            for span in array(ss, "spans") {
                out.push(SpanRecord {
                    trace_id: string(span, "traceId"),
                    span_id: string(span, "spanId"),
                    parent_span_id: string(span, "parentSpanId"),
                    name: string(span, "name"),
                    kind: span.get("kind").and_then(Value::as_i64).unwrap_or(0),
                    attributes: attributes(span),
                    status: match span
                        .get("status")
                        .and_then(|s| s.get("code"))
                        .and_then(Value::as_i64)
                    {
                        Some(1) => SpanStatus::Ok,
                        Some(2) => SpanStatus::Error,
                        _ => SpanStatus::Unset,
                    },
                    status_message: span
                        .get("status")
                        .map(|s| string(s, "message"))
                        .unwrap_or_default(),
                    service_name: service_name.clone(),
                    scope_name: scope_name.clone(),
                    start_time_unix_nano: nanos(span, "startTimeUnixNano"),
                    end_time_unix_nano: nanos(span, "endTimeUnixNano"),
                });
            }
        }
    }
    Ok(out)
}

fn array<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter())
        .into_iter()
        .flatten()
}

fn string(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// OTLP JSON writes 64-bit integers as strings; accept numbers too.
fn nanos(v: &Value, key: &str) -> u64 {
    match v.get(key) {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(n) => n.as_u64().unwrap_or(0),
        None => 0,
    }
}

fn attributes(v: &Value) -> BTreeMap<String, String> {
    array(v, "attributes")
        .filter_map(|kv| {
            let key = kv.get("key")?.as_str()?.to_owned();
            Some((key, any_value(kv.get("value")?)))
        })
        .collect()
}

fn any_value(v: &Value) -> String {
    if let Some(s) = v.get("stringValue").and_then(Value::as_str) {
        return s.to_owned();
    }
    if let Some(b) = v.get("boolValue").and_then(Value::as_bool) {
        return b.to_string();
    }
    match v.get("intValue") {
        Some(Value::String(s)) => return s.clone(),
        Some(n @ Value::Number(_)) => return n.to_string(),
        _ => {}
    }
    if let Some(d) = v.get("doubleValue") {
        return match d {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_line_parses_into_spans_with_resource_scope_and_attributes() {
        let line = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},"scopeSpans":[{"scope":{"name":"sc"},"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b175","parentSpanId":"eee19b7ec3c1b174","name":"child","kind":3,"startTimeUnixNano":"1700000000100000000","endTimeUnixNano":"1700000000200000000","attributes":[{"key":"n","value":{"intValue":"3"}},{"key":"b","value":{"boolValue":true}},{"key":"d","value":{"doubleValue":1.5}},{"key":"a","value":{"arrayValue":{"values":[{"stringValue":"x"}]}}}],"status":{"message":"boom","code":2}}]}]}]}"#;
        let spans = parse_export_line(line).unwrap();
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.trace_id, "5b8efff798038103d269b633813fc60c");
        assert_eq!(s.parent_span_id, "eee19b7ec3c1b174");
        assert_eq!(s.service_name.as_deref(), Some("svc"));
        assert_eq!(s.scope_name, "sc");
        assert_eq!(s.kind, 3);
        assert_eq!(s.status, SpanStatus::Error);
        assert_eq!(s.status_message, "boom");
        assert_eq!(s.start_time_unix_nano, 1_700_000_000_100_000_000);
        assert_eq!(s.attributes["n"], "3");
        assert_eq!(s.attributes["b"], "true");
        assert_eq!(s.attributes["d"], "1.5");
        assert_eq!(
            s.attributes["a"],
            r#"{"arrayValue":{"values":[{"stringValue":"x"}]}}"#
        );
        assert!(parse_export_line("not json").is_err());
    }
}
