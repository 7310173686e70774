//! The test OpenTelemetry Collector (`testenv/otelcol/`): what a real OTLP/HTTP export gives back
//! through `Collector::spans`, that it refuses malformed exports without recording them, and that
//! it listens and connects on loopback only. Needs `WCM_TESTENV_OTELCOL_BIN`
//! (`$(testenv/otelcol/build.sh)`).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use testenv::{Collector, CollectorOptions, SpanRecord, SpanStatus};

const TRACE_ID: &str = "5b8efff798038103d269b633813fc60c";
const PARENT_ID: &str = "eee19b7ec3c1b174";
const CHILD_ID: &str = "eee19b7ec3c1b175";

/// A parent span and its child in one OTLP/HTTP JSON export (the body of `POST /v1/traces`).
fn parent_and_child(trace_id: &str, service: &str) -> String {
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"{service}"}}}}]}},"scopeSpans":[{{"scope":{{"name":"wcm-test"}},"spans":[
{{"traceId":"{trace_id}","spanId":"{PARENT_ID}","name":"reconcile","kind":1,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000001000000000","attributes":[{{"key":"wcm.plugin","value":{{"stringValue":"pod-counter"}}}},{{"key":"wcm.attempt","value":{{"intValue":"3"}}}}],"status":{{"code":1}}}},
{{"traceId":"{trace_id}","spanId":"{CHILD_ID}","parentSpanId":"{PARENT_ID}","name":"host.kube.get","kind":3,"startTimeUnixNano":"1700000000100000000","endTimeUnixNano":"1700000000200000000","attributes":[{{"key":"wcm.cached","value":{{"boolValue":false}}}}],"status":{{"code":2,"message":"not found"}}}}
]}}]}}]}}"#
    )
}

/// One HTTP/1.1 POST over a plain TCP connection; returns the status code and the body.
fn post(addr: SocketAddr, path: &str, content_type: &str, body: &[u8]) -> Result<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connect {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    conn.write_all(body)?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn span<'a>(spans: &'a [SpanRecord], id: &str) -> &'a SpanRecord {
    spans
        .iter()
        .find(|s| s.span_id == id)
        .unwrap_or_else(|| panic!("span {id} not received: {spans:#?}"))
}

#[tokio::test]
async fn an_otlp_http_export_comes_back_with_the_parent_link_attributes_and_service_name()
-> Result<()> {
    let collector = Collector::start()?;
    let endpoint = collector.otlp_http_endpoint();
    assert_eq!(endpoint, format!("http://{}", collector.otlp_http_addr()));
    let (status, body) = post(
        collector.otlp_http_addr(),
        "/v1/traces",
        "application/json",
        parent_and_child(TRACE_ID, "wasm-controller-manager").as_bytes(),
    )?;
    assert_eq!(status, 200, "{body}");

    let spans = collector
        .wait_for_spans(|s| s.len() >= 2, Duration::from_secs(10))
        .await?;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let parent = span(&spans, PARENT_ID);
    let child = span(&spans, CHILD_ID);
    assert_eq!(parent.trace_id, TRACE_ID);
    assert_eq!(child.trace_id, TRACE_ID);
    assert_eq!(parent.parent_span_id, "");
    assert_eq!(child.parent_span_id, parent.span_id);
    assert_eq!(parent.name, "reconcile");
    assert_eq!(child.name, "host.kube.get");
    assert_eq!(parent.kind, 1);
    assert_eq!(child.kind, 3);
    assert_eq!(parent.attributes["wcm.plugin"], "pod-counter");
    assert_eq!(parent.attributes["wcm.attempt"], "3");
    assert_eq!(child.attributes["wcm.cached"], "false");
    assert_eq!(parent.status, SpanStatus::Ok);
    assert_eq!(child.status, SpanStatus::Error);
    assert_eq!(child.status_message, "not found");
    for s in [parent, child] {
        assert_eq!(s.service_name.as_deref(), Some("wasm-controller-manager"));
        assert_eq!(s.scope_name, "wcm-test");
    }
    assert_eq!(parent.start_time_unix_nano, 1_700_000_000_000_000_000);
    assert_eq!(child.end_time_unix_nano, 1_700_000_000_200_000_000);
    Ok(())
}

#[tokio::test]
async fn a_malformed_otlp_export_is_refused_with_400_and_nothing_is_recorded() -> Result<()> {
    let collector = Collector::start()?;
    let addr = collector.otlp_http_addr();
    let good = parent_and_child(TRACE_ID, "svc");
    let malformed: [(&str, &[u8]); 4] = [
        ("application/json", br#"{"resourceSpans":[{"#),
        ("application/json", &good.as_bytes()[..good.len() / 2]),
        ("application/json", br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"not-hex","spanId":"zz","name":"x"}]}]}]}"#),
        ("application/x-protobuf", b"\xff\xff\xff\xff garbage"),
    ];
    for (content_type, body) in malformed {
        let (status, answer) = post(addr, "/v1/traces", content_type, body)?;
        assert_eq!(
            status,
            400,
            "{content_type} {:?} was answered {status} {answer}",
            String::from_utf8_lossy(body)
        );
    }
    // A good export after them: once it is in the file, anything the bad ones had recorded would
    // be there before it.
    let marker = "0af7651916cd43dd8448eb211c80319c";
    let (status, body) = post(
        addr,
        "/v1/traces",
        "application/json",
        parent_and_child(marker, "marker").as_bytes(),
    )?;
    assert_eq!(status, 200, "{body}");
    let spans = collector
        .wait_for_spans(|s| s.len() >= 2, Duration::from_secs(10))
        .await?;
    // And one more flush interval for anything that came late.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans_after = collector.spans()?;
    assert_eq!(spans, spans_after);
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(
        traces,
        BTreeSet::from([marker]),
        "only the good export is recorded: {spans:#?}"
    );
    assert_eq!(spans.len(), 2);
    Ok(())
}

/// The local addresses of every TCP and UDP socket that process `pid` holds.
fn socket_addresses(pid: u32) -> Result<Vec<String>> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Ok(target) = std::fs::read_link(fd?.path()) {
            let target = target.display().to_string();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for table in ["tcp", "tcp6", "udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))?;
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if cols.len() > 9 && inodes.contains(cols[9]) {
                out.push(format!("{table} {} state {}", cols[1], cols[3]));
            }
        }
    }
    Ok(out)
}

/// 127.0.0.1 in /proc/net/tcp is `0100007F`; ::1 in tcp6 is `00000000000000000000000001000000`,
/// ::ffff:127.0.0.1 is `0000000000000000FFFF00000100007F`.
fn is_loopback_hex(addr: &str) -> bool {
    let host = addr.split(':').next().unwrap_or_default();
    (host.len() == 8 && host.ends_with("7F"))
        || host == "00000000000000000000000001000000"
        || (host.len() == 32
            && host.starts_with("0000000000000000FFFF0000")
            && host.ends_with("7F"))
}

#[tokio::test]
async fn the_collector_listens_and_connects_on_loopback_only() -> Result<()> {
    // What it listens on: the two receiver ports on 127.0.0.1, no metrics or other endpoint.
    let collector = Collector::start()?;
    let sockets = socket_addresses(collector.pid())?;
    let listening: Vec<&String> = sockets.iter().filter(|s| s.ends_with("state 0A")).collect();
    assert_eq!(listening.len(), 2, "{sockets:?}");
    for s in &sockets {
        let local = s.split_whitespace().nth(1).unwrap_or_default();
        assert!(is_loopback_hex(local), "a socket off loopback: {s}");
    }
    drop(collector);

    // Where it connects, from start to shutdown, with an export received in between.
    if std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("SKIP the connect() check: strace is not installed");
        return Ok(());
    }
    let collector = Collector::start_with(CollectorOptions {
        strace_connect: true,
    })?;
    let (status, body) = post(
        collector.otlp_http_addr(),
        "/v1/traces",
        "application/json",
        parent_and_child(TRACE_ID, "svc").as_bytes(),
    )?;
    assert_eq!(status, 200, "{body}");
    collector
        .wait_for_spans(|s| s.len() >= 2, Duration::from_secs(10))
        .await?;
    // Its sockets under strace are the same: loopback only.
    for s in socket_addresses(collector.pid())? {
        let local = s.split_whitespace().nth(1).unwrap_or_default();
        assert!(is_loopback_hex(local), "a socket off loopback: {s}");
    }
    let calls = collector.socket_calls().context("strace log")?;
    // The trace works: it shows the receivers' two binds.
    let http_bind = format!("sin_port=htons({})", collector.otlp_http_addr().port());
    assert!(
        calls
            .iter()
            .any(|l| l.contains("bind(") && l.contains(&http_bind)),
        "strace saw no bind of the OTLP/HTTP port: {calls:#?}"
    );
    for line in &calls {
        let inet = line.contains("AF_INET");
        // Go's IPv6 probe binds port 0 on ::1 and ::ffff:127.0.0.1 at start.
        let loopback = line.contains("inet_addr(\"127.")
            || line.contains("\"::1\"")
            || line.contains("\"::ffff:127.");
        if inet && !loopback {
            bail!("the collector bound or connected off loopback: {line}\nall: {calls:#?}");
        }
    }
    eprintln!("collector bind()/connect() calls: {calls:#?}");
    assert!(
        !calls.iter().any(|l| l.contains("connect(")),
        "the collector connected somewhere: {calls:#?}"
    );
    let pid = collector.pid();
    drop(collector);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the collector {pid} outlived its handle"
    );
    Ok(())
}
