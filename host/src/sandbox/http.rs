//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), only to the hosts the plugin declared
//! and the operator allowed ([`effective_hosts`]). Anything else gets an error inside the guest, a
//! (rate-limited) warning and a metric; the request never leaves the host.
//!
//! A request that passes the allow-list is still refused when its host resolves to an address that
//! must not be reached from a plugin (loopback, link-local including cloud metadata, unspecified,
//! multicast, or one of the `protected` addresses such as the API server's), unless the operator
//! allowed that address itself as an IP literal. The connection then goes to the address that was
//! checked, over our own TCP (and TLS) client: there is no second DNS lookup that could be answered
//! differently (DNS rebinding).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use http::uri::Scheme;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::cluster::services::HttpBudget;
use crate::metrics::Metrics;
use crate::sandbox::tape::Tape;

/// Requests one call may make, unless [`HttpPolicy::max_requests`] says otherwise.
pub const DEFAULT_MAX_REQUESTS: u32 = 100;
/// Longest request URI (scheme, authority, path and query), bytes.
pub const MAX_URI_BYTES: usize = 8 << 10;
/// Most header bytes in one request (names, values and separators).
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// The `resource` label of refused requests: fixed, so a guest cannot mint metric series.
const METRIC_RESOURCE: &str = "outbound-http";
/// Longest guest-supplied text (after escaping) that goes into a log line.
const LOG_TEXT_MAX: usize = 100;
/// Denial warnings per plugin and window; beyond that one summary line, then silence.
const DENIAL_WARNINGS_PER_WINDOW: u32 = 10;
const DENIAL_WINDOW: Duration = Duration::from_secs(60);
/// wasmtime-wasi-http's defaults when the guest sets no request options.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Warnings [`effective_hosts`] returns at most (the declared list comes from the guest).
const MAX_WARNINGS: usize = 20;

// ---------------------------------------------------------------------------------------------
// Allow-list entries

/// A normalised host: a lowercase DNS name without trailing dot, or an IP address (IPv4-mapped
/// IPv6 addresses are stored as IPv4).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// One allow-list entry: `host` (any port) or `host:port`. IPv6 addresses are written in
/// brackets: `[fd00::1]`, `[fd00::1]:8080`. Parse with [`HostRule::parse`] or `str::parse`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostRule {
    pub host: Host,
    /// `None`: any port.
    pub port: Option<u16>,
}

/// An allow-list entry (or request authority) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid outbound host \"{entry}\": {reason}")]
pub struct HostRuleError {
    /// The entry, escaped and truncated for logs.
    pub entry: String,
    pub reason: &'static str,
}

impl HostRule {
    /// Parses and normalises `host` or `host:port`.
    pub fn parse(entry: &str) -> Result<HostRule, HostRuleError> {
        let err = |reason| HostRuleError {
            entry: for_log(entry),
            reason,
        };
        let s = entry.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.contains('@') {
            return Err(err("user information (`user@`) is not allowed"));
        }
        if s.contains('/') {
            return Err(err("expected `host` or `host:port`, not a URL or path"));
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(|| err("`[` without `]`"))?;
            let ip: Ipv6Addr = ip
                .parse()
                .map_err(|_| err("not an IPv6 address inside `[…]`"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| err("unexpected text after `]`"))?,
                ),
            };
            (Host::Ip(IpAddr::V6(ip).to_canonical()), port)
        } else {
            let (host, port) = match s.split_once(':') {
                Some((_, p)) if p.contains(':') => {
                    return Err(err(
                        "IPv6 addresses must be in brackets: `[fd00::1]` or `[fd00::1]:8080`",
                    ));
                }
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            };
            (parse_host(host).map_err(err)?, port)
        };
        let port = port.map(parse_port).transpose().map_err(err)?;
        Ok(HostRule { host, port })
    }

    /// Whether a request to `host`:`port` falls under this entry.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.host == *host && self.port.is_none_or(|p| p == port)
    }

    /// What both entries allow: the same host, and the narrower port (nothing if ports differ).
    fn intersect(&self, other: &HostRule) -> Option<HostRule> {
        if self.host != other.host {
            return None;
        }
        let port = match (self.port, other.port) {
            (None, p) | (p, None) => p,
            (Some(a), Some(b)) if a == b => Some(a),
            _ => return None,
        };
        Some(HostRule {
            host: self.host.clone(),
            port,
        })
    }
}

impl FromStr for HostRule {
    type Err = HostRuleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostRule::parse(s)
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

fn parse_port(p: &str) -> Result<u16, &'static str> {
    // `u16::from_str` also takes `+80`; a port is digits only.
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the port must be a number from 1 to 65535");
    }
    match p.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err("the port must be a number from 1 to 65535"),
    }
}

fn parse_host(h: &str) -> Result<Host, &'static str> {
    let lower = h.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err("empty host");
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    if name.len() > 253 {
        return Err("host name longer than 253 bytes");
    }
    if name.contains('*') {
        return Err("wildcards are not supported");
    }
    if !name.is_ascii() {
        return Err("non-ASCII host names must be written in punycode (`xn--…`)");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated part of a host name must have 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a host name has only letters, digits, `-`, `_` and dots");
        }
    }
    // `127.1`, `2130706433` or `0x7f.1` are IPv4 addresses to resolvers and browsers, not names.
    let last = name.rsplit('.').next().unwrap_or(name);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
    if hex || last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a numeric host must be a dotted IPv4 address (a.b.c.d)");
    }
    Ok(Host::Name(name.to_string()))
}

/// The hosts a plugin may reach: what it declared intersected with what the operator allowed,
/// after normalisation. A bare host on one side and `host:port` on the other give that port; two
/// different ports give nothing. Also returns warnings for the log: entries that cannot be parsed,
/// declared but not allowed, allowed but never declared (at most [`MAX_WARNINGS`] plus a count).
pub fn effective_hosts(declared: &[String], allowed: &[String]) -> (Vec<HostRule>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut parse = |list: &[String], whose: &str| -> Vec<HostRule> {
        let mut rules = Vec::new();
        let mut seen = HashSet::new();
        for entry in list {
            match HostRule::parse(entry) {
                Ok(r) => {
                    if seen.insert(r.clone()) {
                        rules.push(r);
                    }
                }
                Err(e) => warnings.push(format!("{e} ({whose})")),
            }
        }
        rules
    };
    let declared = parse(declared, "declared by the plugin");
    let allowed = parse(allowed, "allowed by the operator");

    // Operator lists are short; index them by host so a long declared list costs little.
    let mut by_host: HashMap<&Host, Vec<usize>> = HashMap::new();
    for (i, a) in allowed.iter().enumerate() {
        by_host.entry(&a.host).or_default().push(i);
    }
    let mut used = vec![false; allowed.len()];
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for d in &declared {
        let mut granted = false;
        for &i in by_host.get(&d.host).map_or(&[][..], Vec::as_slice) {
            if let Some(r) = d.intersect(&allowed[i]) {
                granted = true;
                used[i] = true;
                if seen.insert(r.clone()) {
                    out.push(r);
                }
            }
        }
        if !granted {
            warnings.push(format!(
                "outbound host {d} is declared by the plugin but not allowed by the operator"
            ));
        }
    }
    for (a, _) in allowed.iter().zip(&used).filter(|(_, u)| !**u) {
        warnings.push(format!(
            "outbound host {a} is allowed by the operator but not declared by the plugin"
        ));
    }
    // `host` already covers `host:port`.
    let any_port: HashSet<Host> = out
        .iter()
        .filter(|r| r.port.is_none())
        .map(|r| r.host.clone())
        .collect();
    out.retain(|r| r.port.is_none() || !any_port.contains(&r.host));
    if warnings.len() > MAX_WARNINGS {
        let more = warnings.len() - MAX_WARNINGS;
        warnings.truncate(MAX_WARNINGS);
        warnings.push(format!("… and {more} more outbound host warnings"));
    }
    (out, warnings)
}

// ---------------------------------------------------------------------------------------------
// Requests

/// Where a request goes: its normalised host, its port (80/443 by default) and whether it is TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
    pub tls: bool,
}

/// The target of a request URI. Refuses URIs without scheme or authority, with user information,
/// or with a host that is not a plain name or IP address.
pub fn request_target(uri: &http::Uri) -> Result<Target, &'static str> {
    let tls = if uri.scheme() == Some(&Scheme::HTTPS) {
        true
    } else if uri.scheme() == Some(&Scheme::HTTP) {
        false
    } else {
        return Err("the scheme is not http or https");
    };
    let authority = uri.authority().ok_or("the URI has no host")?;
    if authority.as_str().contains('@') {
        return Err("user information in the URI");
    }
    let rule = HostRule::parse(authority.as_str()).map_err(|e| e.reason)?;
    Ok(Target {
        host: rule.host,
        port: rule.port.unwrap_or(if tls { 443 } else { 80 }),
        tls,
    })
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// AWS's IPv6 instance metadata endpoint (the IPv4 one, 169.254.169.254, is link-local).
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why a plugin must not connect to `ip`, if it must not: loopback, link-local (cloud metadata),
/// unspecified, broadcast, multicast, also inside IPv4-mapped, IPv4-compatible and NAT64 forms;
/// or one of `protected` (e.g. the API server's addresses).
pub fn address_risk(ip: IpAddr, protected: &[IpAddr]) -> Option<&'static str> {
    let ip = ip.to_canonical();
    if protected.iter().any(|p| p.to_canonical() == ip) {
        return Some("protected address");
    }
    match ip {
        IpAddr::V4(v4) => v4_risk(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if v6 == AWS_METADATA_V6 {
                Some("cloud metadata")
            } else if s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                // `::a.b.c.d` (deprecated) and NAT64 `64:ff9b::a.b.c.d` carry an IPv4 address.
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                v4_risk(Ipv4Addr::new(a, b, c, d))
            } else {
                None
            }
        }
    }
}

fn v4_risk(v4: Ipv4Addr) -> Option<&'static str> {
    if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.octets()[0] == 0 {
        // 0.0.0.0 reaches the local host on Linux; the rest of 0/8 is not routable.
        Some("unspecified")
    } else if v4.is_broadcast() {
        Some("broadcast")
    } else if v4.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

/// Checks every resolved address of a target: one that is risky refuses the whole request,
/// unless a rule names that very address (as an IP literal) and the port.
pub fn check_addresses(
    addrs: &[IpAddr],
    port: u16,
    rules: &[HostRule],
    protected: &[IpAddr],
) -> Result<Vec<SocketAddr>, (IpAddr, &'static str)> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for &ip in addrs {
        let ip = ip.to_canonical();
        if let Some(risk) = address_risk(ip, protected)
            && !rules.iter().any(|r| r.matches(&Host::Ip(ip), port))
        {
            return Err((ip, risk));
        }
        let sa = SocketAddr::new(ip, port);
        if !out.contains(&sa) {
            out.push(sa);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Denial logging

/// Rate limit of denial warnings, shared by all calls of one plugin: at most
/// [`DENIAL_WARNINGS_PER_WINDOW`] warnings per [`DENIAL_WINDOW`], then one summary line.
#[derive(Debug)]
pub struct DenialLog {
    state: Mutex<LogWindow>,
}

#[derive(Debug)]
struct LogWindow {
    start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

/// What to do with one denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Log it; `suppressed` denials of the previous window went unlogged.
    Log {
        suppressed: u64,
    },
    /// The window's budget is spent: say so once.
    Summary,
    Quiet,
}

/// One [`DenialLog`] per plugin name for the process: stores (and so policies) are made per call,
/// the limit is per plugin.
static DENIAL_LOGS: LazyLock<Mutex<HashMap<Arc<str>, Arc<DenialLog>>>> =
    LazyLock::new(Default::default);

impl DenialLog {
    fn new() -> Self {
        DenialLog {
            state: Mutex::new(LogWindow {
                start: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// The process-wide log of `plugin`.
    pub fn for_plugin(plugin: &Arc<str>) -> Arc<DenialLog> {
        let mut logs = DENIAL_LOGS.lock().unwrap_or_else(|e| e.into_inner());
        // Plugin names are few; a bound anyway, should names keep changing.
        if logs.len() >= 1024 && !logs.contains_key(plugin) {
            logs.clear();
        }
        logs.entry(plugin.clone())
            .or_insert_with(|| Arc::new(DenialLog::new()))
            .clone()
    }

    fn verdict(&self, now: Instant) -> Verdict {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut suppressed = 0;
        if w.start
            .is_none_or(|s| now.saturating_duration_since(s) >= DENIAL_WINDOW)
        {
            suppressed = std::mem::take(&mut w.suppressed);
            w.start = Some(now);
            w.logged = 0;
        }
        if w.logged < DENIAL_WARNINGS_PER_WINDOW {
            w.logged += 1;
            return Verdict::Log { suppressed };
        }
        w.suppressed += 1;
        if w.suppressed == 1 {
            Verdict::Summary
        } else {
            Verdict::Quiet
        }
    }
}

/// `s` for a log line: control characters and `\` escaped, at most about [`LOG_TEXT_MAX`] chars.
pub fn for_log(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if out.len() >= LOG_TEXT_MAX {
            out.push_str(&format!("…({} bytes)", s.len()));
            break;
        }
        if c == '\\' || c.is_control() || !(c.is_ascii() || c.is_alphanumeric()) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Reports refusals of one plugin: a counter with fixed labels and rate-limited warnings.
#[derive(Clone)]
struct Reporter {
    plugin: Arc<str>,
    metrics: Option<Arc<Metrics>>,
    log: Arc<DenialLog>,
}

impl Reporter {
    /// `authority`: already passed through [`for_log`].
    fn refused(&self, authority: &str, reason: &str) {
        if let Some(m) = &self.metrics {
            m.forbidden_call(&self.plugin, "http", METRIC_RESOURCE);
        }
        match self.log.verdict(Instant::now()) {
            Verdict::Log { suppressed } => tracing::warn!(
                plugin = %self.plugin,
                authority,
                reason,
                suppressed_before = suppressed,
                "outbound HTTP refused"
            ),
            Verdict::Summary => tracing::warn!(
                plugin = %self.plugin,
                "outbound HTTP refused again: further refusals of this plugin are not logged for up to {}s (the metric counts them)",
                DENIAL_WINDOW.as_secs()
            ),
            Verdict::Quiet => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The policy

/// The outbound HTTP policy of one plugin's store: the `wasi:http` hooks.
///
/// Built per store with [`HttpPolicy::new`] from the plugin's effective rules
/// ([`effective_hosts`]) and the protected addresses; [`HttpPolicy::begin_call`] resets the request
/// count when a store is reused for another call.
pub struct HttpPolicy {
    rules: Arc<[HostRule]>,
    protected: Arc<[IpAddr]>,
    /// Requests per call (default [`DEFAULT_MAX_REQUESTS`]); more are refused.
    pub max_requests: u32,
    requests: u32,
    report: Reporter,
    /// The plugin's requests per second and DNS lookups, shared by all its calls.
    budget: Arc<HttpBudget>,
    /// When the current call's wall time ends: a request whose token of the plugin's rate would
    /// come later is refused at once instead of waiting.
    deadline: Option<Instant>,
    /// Requests being recorded, or answered from a recording (`tape.rs`).
    pub(crate) tape: Option<Arc<Mutex<Tape>>>,
    /// The plugin asked for the trace context on its requests (`propagate-trace-context`).
    pub(crate) propagate_trace_context: bool,
}

impl HttpPolicy {
    /// `rules`: declared ∩ allowed, as [`effective_hosts`] returns them. `protected`: addresses no
    /// plugin may reach unless a rule names them as IP literal (give the API server's).
    /// `metrics`: where refusals are counted (`None` in `describe`). `budget`: the plugin's
    /// requests per second and DNS lookups.
    pub fn new(
        plugin: Arc<str>,
        rules: Arc<[HostRule]>,
        protected: Arc<[IpAddr]>,
        metrics: Option<Arc<Metrics>>,
        budget: Arc<HttpBudget>,
    ) -> Self {
        let log = DenialLog::for_plugin(&plugin);
        HttpPolicy {
            rules,
            protected,
            max_requests: DEFAULT_MAX_REQUESTS,
            requests: 0,
            report: Reporter {
                plugin,
                metrics,
                log,
            },
            budget,
            deadline: None,
            tape: None,
            propagate_trace_context: false,
        }
    }

    /// Starts a new call in a reused store: the request count starts over.
    pub fn begin_call(&mut self) {
        self.requests = 0;
        self.deadline = None;
    }

    /// Sets when the current call's wall time ends.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// A token of the plugin's request rate: the wait before the request may go, or the refusal
    /// when the token would come after the call's wall deadline (nothing is taken then).
    fn rate_token(&self) -> Result<Duration, Error> {
        let left = self.deadline.map_or(DEFAULT_TIMEOUT, |d| {
            d.saturating_duration_since(Instant::now())
        });
        // A tenth of what is left stays for the request itself and the rest of the call.
        let left = left.saturating_sub(left / 10);
        self.budget.requests.reserve_within(left).ok_or_else(|| {
            Error::InternalError(Some(format!(
                "rate limited: plugin {} may send {} outbound HTTP requests per second (burst {}); the next one would go after this call's wall timeout",
                self.report.plugin, self.budget.qps, self.budget.burst
            )))
        })
    }

    /// Whether the rules let requests reach `target` (the address check comes later).
    pub fn allows(&self, target: &Target) -> bool {
        self.rules
            .iter()
            .any(|r| r.matches(&target.host, target.port))
    }

    /// The checks that need no network: count, sizes, URI, allow-list.
    fn admit(
        &mut self,
        request: &http::Request<WasiBody>,
    ) -> Result<Target, (Error, &'static str)> {
        self.requests = self.requests.saturating_add(1);
        if self.requests > self.max_requests {
            return Err((Error::HttpRequestDenied, "too many requests in one call"));
        }
        let uri = request.uri();
        let uri_len = uri.scheme_str().map_or(0, |s| s.len() + 3)
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.path_and_query().map_or(0, |p| p.as_str().len());
        if uri_len > MAX_URI_BYTES {
            return Err((Error::HttpRequestUriTooLong, "URI too long"));
        }
        let header_bytes: usize = request
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if header_bytes > MAX_HEADER_BYTES {
            return Err((
                Error::HttpRequestHeaderSectionSize(Some(
                    u32::try_from(header_bytes).unwrap_or(u32::MAX),
                )),
                "headers too large",
            ));
        }
        let target = request_target(uri).map_err(|why| (Error::HttpRequestUriInvalid, why))?;
        if !self.allows(&target) {
            return Err((
                Error::HttpRequestDenied,
                "host not declared by the plugin and allowed by the operator",
            ));
        }
        Ok(target)
    }
}

type Response = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), Error>> + Send>,
)>;

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Response> + Send> {
        _ = fut;
        let tape = self.tape.clone();
        if let Some(tape) = tape.clone()
            && tape.lock().is_ok_and(|t| t.is_replaying())
        {
            // A replay reaches no network: the recorded answer, or an error where there is none.
            return Box::new(async move {
                let args = replayed_request(request).await?;
                let answer = tape
                    .lock()
                    .ok()
                    .and_then(|mut t| t.answer(HTTP_CALL, &args))
                    .unwrap_or_default();
                recorded_response(&answer)
            });
        }
        // Escaped and truncated once: it only goes into log lines.
        let authority = for_log(request.uri().authority().map_or("", |a| a.as_str()));
        let target = match self.admit(&request) {
            Ok(t) => t,
            Err((error, why)) => {
                self.report.refused(&authority, why);
                return Box::new(async move { Err(error) });
            }
        };
        // The plugin's rate, before any lookup or connection: a flood reaches neither the
        // resolver nor the target faster than it.
        let wait = match self.rate_token() {
            Ok(w) => w,
            Err(e) => {
                self.report
                    .refused(&authority, "over the plugin's outbound HTTP request rate");
                return Box::new(async move { Err(e) });
            }
        };
        let (rules, protected, report, lookups) = (
            self.rules.clone(),
            self.protected.clone(),
            self.report.clone(),
            self.budget.lookups.clone(),
        );
        // A child span of the reconcile (exported only with --otlp-endpoint), and its W3C trace
        // context on the request when the plugin asked for it.
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "http",
            otel.name = %format!("HTTP {}", request.method()),
            otel.kind = "client",
            http.request.method = %request.method(),
            server.address = %authority,
            http.response.status_code = tracing::field::Empty,
        );
        let mut request = request;
        let mut injected = false;
        if self.propagate_trace_context {
            let _inside = span.enter();
            for (name, value) in crate::telemetry::trace_context_headers() {
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::try_from(name.as_str()),
                    http::HeaderValue::try_from(value.as_str()),
                ) {
                    request.headers_mut().insert(name, value);
                    injected = true;
                }
            }
        }
        let traced = span.clone();
        Box::new(tracing::Instrument::instrument(
            async move {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                let timeouts = Timeouts::from(options);
                let ips = crate::sandbox::dns::resolve(&target, timeouts.connect, &lookups).await?;
                let addrs = match check_addresses(&ips, target.port, &rules, &protected) {
                    Ok(a) => a,
                    Err((ip, risk)) => {
                        report.refused(&authority, &format!("resolves to {ip} ({risk})"));
                        return Err(Error::DestinationIpProhibited);
                    }
                };
                let Some(tape) = tape else {
                    return send(request, &target, &addrs, timeouts).await;
                };
                // Recorded: the bodies are read, up to what the recording may still hold, so what was
                // sent and answered can be written. An exchange past that is sent as it comes, left
                // out of the recording (which then says so), and never buffered whole.
                let room = tape.lock().map_or(0, |t| t.room());
                let leave_out = || {
                    if let Ok(mut t) = tape.lock() {
                        t.leave_out();
                    }
                };
                let (parts, body) = request.into_parts();
                let (sent, rest) = read_up_to(body, room.min(MAX_TAPED_REQUEST_BODY)).await?;
                if let Some(rest) = rest {
                    leave_out();
                    let request = http::Request::from_parts(parts, prefixed(sent, rest));
                    return send(request, &target, &addrs, timeouts).await;
                }
                let (mut args, credentials) = request_json(&parts, &sent);
                if injected {
                    // The host's trace context differs at each run: not the plugin's request, so not
                    // in the recording (a replay compares what the plugin sent).
                    if let Some(headers) = args["headers"].as_array_mut() {
                        headers.retain(|h| {
                            !matches!(h[0].as_str(), Some("traceparent" | "tracestate"))
                        });
                    }
                }
                let request = http::Request::from_parts(parts, full_body(sent));
                let (response, io) = send(request, &target, &addrs, timeouts).await?;
                let limit = room
                    .saturating_sub(args.to_string().len())
                    .min(MAX_TAPED_RESPONSE_BODY);
                if response.body().size_hint().lower() > limit as u64 {
                    leave_out();
                    return Ok((response, io));
                }
                // The connection must be driven while the body is read; once it is read whole the
                // connection has nothing more to give.
                let driver = tokio::spawn(Box::into_pin(io));
                let stop = AbortOnDrop(driver.abort_handle());
                let (parts, body) = response.into_parts();
                let (bytes, rest) = read_up_to(body, limit).await?;
                if let Some(rest) = rest {
                    leave_out();
                    let response = http::Response::from_parts(parts, prefixed(bytes, rest));
                    let io = async move {
                        let _stop = stop;
                        driver.await.unwrap_or(Err(Error::HttpProtocolError))
                    };
                    return Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>));
                }
                drop(stop);
                let (answer, answer_credentials) = response_json(&parts, &bytes);
                if let Ok(mut t) = tape.lock() {
                    for (name, value) in credentials.iter().chain(&answer_credentials) {
                        t.credential_header(name, value);
                    }
                    t.note(HTTP_CALL, args, answer);
                }
                Ok((
                    http::Response::from_parts(parts, full_body(bytes)),
                    Box::new(async { Ok(()) }) as Box<dyn Future<Output = _> + Send>,
                ))
            },
            traced,
        ))
    }
}

/// The name of an outbound request in a recording.
const HTTP_CALL: &str = "http.request";

/// Bodies read whole while recording.
const MAX_TAPED_REQUEST_BODY: usize = 4 << 20;
const MAX_TAPED_RESPONSE_BODY: usize = 16 << 20;

/// The headers as recorded, with credential headers' values as "redacted"
/// ([`is_credential_header`](crate::sandbox::redact::is_credential_header): `Authorization`,
/// cookies, and any named like a credential, as `X-Subject-Token` or `X-API-Key`); and those
/// (name, value) pairs, to be kept out of the rest of the recording too.
fn headers_json(headers: &http::HeaderMap) -> (serde_json::Value, Vec<(String, String)>) {
    let mut credentials = Vec::new();
    let pairs: Vec<(String, String)> = headers
        .iter()
        // Follows from the body, which a recording may have redacted: left out, and made again
        // from the body a replay hands back.
        .filter(|(k, _)| *k != http::header::CONTENT_LENGTH)
        .map(|(k, v)| {
            let text = String::from_utf8_lossy(v.as_bytes()).into_owned();
            let value = if crate::sandbox::redact::is_credential_header(k.as_str()) {
                credentials.push((k.as_str().to_string(), text));
                "redacted".to_string()
            } else {
                text
            };
            (k.as_str().to_string(), value)
        })
        .collect();
    (serde_json::json!(pairs), credentials)
}

fn full_body(bytes: Bytes) -> WasiBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Reads a body up to `limit` bytes: the bytes and `None` when it ended within them, or the bytes
/// read so far and the rest of the body (never more than `limit` plus one frame is held).
async fn read_up_to(mut body: WasiBody, limit: usize) -> Result<(Bytes, Option<WasiBody>), Error> {
    use http_body_util::BodyExt;
    if body.size_hint().lower() > limit as u64 {
        return Ok((Bytes::new(), Some(body)));
    }
    let mut buf = Vec::new();
    loop {
        if buf.len() > limit {
            return Ok((Bytes::from(buf), Some(body)));
        }
        match body.frame().await {
            None => return Ok((Bytes::from(buf), None)),
            Some(frame) => {
                // Trailers end a body; a recording keeps none (as before).
                if let Ok(data) = frame?.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// A body of `first`, then whatever `rest` still gives.
fn prefixed(first: Bytes, rest: WasiBody) -> WasiBody {
    use http_body_util::BodyExt;
    let first = http_body_util::Full::new(first).map_err(|never| match never {});
    let stream = futures::stream::unfold((Some(first), rest), |(mut first, mut rest)| async move {
        if let Some(f) = first.as_mut()
            && let Some(frame) = f.frame().await
        {
            return Some((frame, (first, rest)));
        }
        let frame = rest.frame().await?;
        Some((frame, (None, rest)))
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

/// Aborts a spawned task when dropped (the guest dropped the response it was driving).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request as recorded, and the credential header values it carried.
fn request_json(
    parts: &http::request::Parts,
    body: &[u8],
) -> (serde_json::Value, Vec<(String, String)>) {
    let (headers, credentials) = headers_json(&parts.headers);
    let args = serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "headers": headers,
        "body": String::from_utf8_lossy(body),
    });
    (args, credentials)
}

/// A response as recorded, and the credential header values it carried.
fn response_json(
    parts: &http::response::Parts,
    body: &[u8],
) -> (serde_json::Value, Vec<(String, String)>) {
    let (headers, credentials) = headers_json(&parts.headers);
    let answer = serde_json::json!({
        "status": parts.status.as_u16(),
        "headers": headers,
        "body": String::from_utf8_lossy(body),
    });
    (answer, credentials)
}

/// A replayed request as recorded (its body read whole, as a recording reads it).
async fn replayed_request(request: http::Request<WasiBody>) -> Result<serde_json::Value, Error> {
    let (parts, body) = request.into_parts();
    let (bytes, rest) = read_up_to(body, MAX_TAPED_REQUEST_BODY).await?;
    if rest.is_some() {
        return Err(Error::HttpRequestBodySize(None));
    }
    Ok(request_json(&parts, &bytes).0)
}

/// The recorded response to a replayed request; a request not in the recording is refused.
fn recorded_response(answer: &serde_json::Value) -> Response {
    let Some(status) = answer["status"].as_u64() else {
        return Err(Error::ConnectionRefused);
    };
    let mut builder = http::Response::builder()
        .status(u16::try_from(status).map_err(|_| Error::HttpProtocolError)?);
    for pair in answer["headers"].as_array().into_iter().flatten() {
        if let (Some(k), Some(v)) = (pair[0].as_str(), pair[1].as_str()) {
            builder = builder.header(k, v);
        }
    }
    let body = answer["body"].as_str().unwrap_or_default().to_string();
    let response = builder
        .body(full_body(Bytes::from(body)))
        .map_err(|_| Error::HttpProtocolError)?;
    Ok((
        response,
        Box::new(async { Ok(()) }) as Box<dyn Future<Output = _> + Send>,
    ))
}

// ---------------------------------------------------------------------------------------------
// The client: wasmtime-wasi-http's `default_send_request`, but connecting to checked addresses.

#[derive(Clone, Copy)]
struct Timeouts {
    connect: Duration,
    first_byte: Duration,
    between_bytes: Duration,
}

impl From<Option<RequestOptions>> for Timeouts {
    fn from(o: Option<RequestOptions>) -> Self {
        let o = o.unwrap_or_default();
        Timeouts {
            connect: o.connect_timeout.unwrap_or(DEFAULT_TIMEOUT),
            first_byte: o.first_byte_timeout.unwrap_or(DEFAULT_TIMEOUT),
            // Tokio panics on a zero interval.
            between_bytes: o
                .between_bytes_timeout
                .unwrap_or(DEFAULT_TIMEOUT)
                .max(Duration::from_nanos(1)),
        }
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The TLS client configuration: webpki roots, ring (built once).
static TLS: LazyLock<Result<Arc<rustls::ClientConfig>, String>> = LazyLock::new(|| {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS configuration: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
});

/// TCP to the first of `addrs` that answers, then TLS for https (the certificate is checked
/// against the request's host name, not the address).
async fn connect(target: &Target, addrs: &[SocketAddr]) -> Result<Box<dyn Stream>, Error> {
    let mut last = Error::DestinationUnavailable;
    let mut tcp = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = Error::Connect(e),
        }
    }
    let tcp = tcp.ok_or(last)?;
    if !target.tls {
        return Ok(Box::new(tcp));
    }
    let config = TLS
        .as_ref()
        .map_err(|e| Error::InternalError(Some(e.clone())))?;
    let name = match &target.host {
        Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone())?,
        Host::Ip(ip) => rustls::pki_types::ServerName::IpAddress((*ip).into()),
    };
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(Error::Tls)?;
    Ok(Box::new(tls))
}

/// Sends `request` over a connection to one of `addrs`; the shape (and the timeouts) of
/// wasmtime-wasi-http's `default_send_request`.
async fn send(
    mut request: http::Request<WasiBody>,
    target: &Target,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
) -> Response {
    use core::future::poll_fn;
    use core::pin::pin;
    use core::task::{Poll, ready};
    use http_body_util::BodyExt;

    let stream = tokio::time::timeout(timeouts.connect, connect(target, addrs))
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
    let (mut sender, conn) = tokio::time::timeout(
        timeouts.connect,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;

    // Scheme and authority go on the wire only to proxies: the request line is the path.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;

    let send = async move {
        let res = tokio::time::timeout(timeouts.first_byte, sender.send_request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(Error::from)?;
        let mut timeout = tokio::time::interval(timeouts.between_bytes);
        timeout.reset();
        Ok::<_, Error>(res.map(|incoming| TimedBody { incoming, timeout }))
    };
    let mut send = pin!(send);
    let mut conn = Some(conn);
    // Drive the connection while waiting for the response.
    let res = poll_fn(|cx| match send.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(r),
        Poll::Pending => {
            let Some(fut) = conn.as_mut() else {
                return Poll::Pending;
            };
            let done = ready!(std::pin::Pin::new(fut).poll(cx));
            conn = None;
            match done {
                Ok(()) => send.as_mut().poll(cx),
                Err(e) => Poll::Ready(Err(Error::from(e))),
            }
        }
    })
    .await?;
    let io = async move {
        let Some(conn) = conn else {
            return Ok(());
        };
        match conn.await {
            Err(e) if e.is_timeout() => Err(Error::HttpResponseTimeout),
            Err(e) => Err(e.into()),
            Ok(()) => Ok(()),
        }
    };
    Ok((
        res.map(BodyExt::boxed_unsync),
        Box::new(io) as Box<dyn Future<Output = _> + Send>,
    ))
}

/// A response body that fails when no frame arrives within the between-bytes timeout.
struct TimedBody {
    incoming: Incoming,
    timeout: tokio::time::Interval,
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Error>>> {
        use std::task::{Poll, ready};
        match std::pin::Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                Error::HttpResponseTimeout
            } else {
                Error::from(e)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HostRule {
        HostRule::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_are_normalised() {
        assert_eq!(
            rule("Neutron.Example.:9696"),
            HostRule {
                host: Host::Name("neutron.example".into()),
                port: Some(9696)
            }
        );
        assert_eq!(rule(" neutron ").to_string(), "neutron");
        assert_eq!(rule("127.0.0.1").host, Host::Ip(ip("127.0.0.1")));
        assert_eq!(rule("[::1]:443").to_string(), "[::1]:443");
        assert_eq!(rule("[0:0::0001]").to_string(), "[::1]");
        assert_eq!(rule("[FD00::A]:1").host, Host::Ip(ip("fd00::a")));
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(rule("[::ffff:10.0.0.1]"), rule("10.0.0.1"));
        assert_eq!(rule("a:65535").port, Some(65535));
        assert_eq!(rule("a:08").port, Some(8));
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for (entry, why) in [
            ("", "empty"),
            ("neutron:0", "1 to 65535"),
            ("neutron:65536", "1 to 65535"),
            ("neutron:+80", "1 to 65535"),
            ("neutron:", "1 to 65535"),
            ("neutron:http", "1 to 65535"),
            ("::1", "brackets"),
            ("[::1", "without `]`"),
            ("[::1]x", "after `]`"),
            ("[10.0.0.1]", "IPv6"),
            ("user@neutron", "user information"),
            ("http://neutron", "not a URL"),
            ("*.example", "wildcards"),
            ("a..b", "1 to 63"),
            (".", "empty host"),
            ("bad host", "letters, digits"),
            ("café.example", "punycode"),
            ("127.1", "dotted IPv4"),
            ("2130706433", "dotted IPv4"),
            ("0x7f.1", "dotted IPv4"),
        ] {
            let e = HostRule::parse(entry).expect_err(entry);
            assert!(e.reason.contains(why), "{entry}: {e}");
            assert!(e.to_string().contains("invalid outbound host"), "{e}");
        }
        let long = format!("{}.example", "a".repeat(300));
        let e = HostRule::parse(&long).expect_err("long");
        assert!(e.entry.len() < 150, "error text is truncated: {}", e.entry);
    }

    #[test]
    fn effective_hosts_intersect_after_normalisation() {
        let eff = |d: &[&str], a: &[&str]| {
            let (rules, _) = effective_hosts(&strings(d), &strings(a));
            rules.iter().map(|r| r.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(eff(&["neutron"], &["neutron:9696"]), ["neutron:9696"]);
        assert_eq!(eff(&["neutron:9696"], &["neutron"]), ["neutron:9696"]);
        assert_eq!(eff(&["neutron"], &["neutron"]), ["neutron"]);
        assert!(eff(&["neutron:9696"], &["neutron:9697"]).is_empty());
        assert_eq!(eff(&["NEUTRON."], &["neutron:9696"]), ["neutron:9696"]);
        assert!(eff(&["neutron"], &["nova"]).is_empty());
        // A bare host subsumes its `host:port`s; duplicates go.
        assert_eq!(
            eff(&["neutron", "neutron:9696", "Neutron"], &["neutron"]),
            ["neutron"]
        );
        assert_eq!(
            eff(&["neutron"], &["neutron:1", "neutron:2"]),
            ["neutron:1", "neutron:2"]
        );
        assert_eq!(eff(&["[::1]"], &["[0::1]:80"]), ["[::1]:80"]);
    }

    #[test]
    fn effective_hosts_warn_about_what_does_not_match() {
        let (rules, warnings) = effective_hosts(
            &strings(&["neutron", "nova:8774", "bad host"]),
            &strings(&["neutron:9696", "nova:1", "glance", "x:0"]),
        );
        assert_eq!(rules, [rule("neutron:9696")]);
        let all = warnings.join("\n");
        assert!(
            all.contains("nova:8774 is declared by the plugin but not allowed"),
            "{all}"
        );
        assert!(
            all.contains("nova:1 is allowed by the operator but not declared"),
            "{all}"
        );
        assert!(
            all.contains("glance is allowed by the operator but not declared"),
            "{all}"
        );
        assert!(
            all.contains("\"bad host\"") && all.contains("declared by the plugin)"),
            "{all}"
        );
        assert!(
            all.contains("\"x:0\"") && all.contains("allowed by the operator)"),
            "{all}"
        );
        assert_eq!(warnings.len(), 5, "{all}");

        // A guest declaring thousands of hosts gets a bounded list of warnings.
        let many: Vec<String> = (0..10_000).map(|i| format!("h{i}")).collect();
        let (rules, warnings) = effective_hosts(&many, &[]);
        assert!(rules.is_empty());
        assert_eq!(warnings.len(), MAX_WARNINGS + 1);
        assert!(warnings[MAX_WARNINGS].contains("9980 more"));
    }

    #[test]
    fn request_targets() {
        let t = |u: &str| request_target(&u.parse::<http::Uri>().unwrap());
        assert_eq!(
            t("http://Neutron.:9696/v2.0").unwrap(),
            Target {
                host: Host::Name("neutron".into()),
                port: 9696,
                tls: false
            }
        );
        assert_eq!(t("http://neutron/").unwrap().port, 80);
        assert_eq!(t("https://neutron/").unwrap().port, 443);
        assert!(t("https://neutron/").unwrap().tls);
        assert_eq!(
            t("http://[::1]:8080/").unwrap(),
            Target {
                host: Host::Ip(ip("::1")),
                port: 8080,
                tls: false
            }
        );
        assert_eq!(t("https://[fe80::1]/").unwrap().port, 443);
        assert!(
            t("http://user:pw@neutron/")
                .unwrap_err()
                .contains("user information")
        );
        assert!(
            t("http://user@neutron/")
                .unwrap_err()
                .contains("user information")
        );
        assert!(t("/just/a/path").unwrap_err().contains("scheme"));
        assert!(t("ftp://neutron/").unwrap_err().contains("scheme"));
        assert!(t("http://neutron:0/").is_err());
        assert!(t("http://127.1/").is_err());

        let p = policy(&["neutron:9696", "127.0.0.1"]);
        assert!(p.allows(&t("http://NEUTRON:9696/x").unwrap()));
        assert!(!p.allows(&t("http://neutron/x").unwrap()));
        assert!(p.allows(&t("https://127.0.0.1/").unwrap()));
        assert!(p.allows(&t("http://[::ffff:127.0.0.1]:1/").unwrap()));
        assert!(!p.allows(&t("http://localhost/").unwrap()));
    }

    #[test]
    fn addresses_that_reach_the_host_or_metadata_are_risky() {
        for bad in [
            "127.0.0.1",
            "127.255.0.9",
            "::1",
            "169.254.169.254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "fe80::1",
            "febf::1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "255.255.255.255",
            "224.0.0.1",
            "ff02::1",
            "fd00:ec2::254",
        ] {
            assert!(
                address_risk(ip(bad), &[]).is_some(),
                "{bad} must be refused"
            );
        }
        for good in [
            "10.0.0.1",
            "192.168.1.1",
            "8.8.8.8",
            "2001:db8::1",
            "fd00::1",
            "fec0::1",
        ] {
            assert_eq!(address_risk(ip(good), &[]), None, "{good}");
        }
        // Protected addresses (the API server), also in their mapped form.
        let api = [ip("10.96.0.1")];
        assert_eq!(
            address_risk(ip("10.96.0.1"), &api),
            Some("protected address")
        );
        assert_eq!(
            address_risk(ip("::ffff:10.96.0.1"), &api),
            Some("protected address")
        );
        assert_eq!(address_risk(ip("10.96.0.2"), &api), None);
    }

    #[test]
    fn an_explicit_ip_rule_overrides_the_address_check() {
        let none: &[HostRule] = &[];
        assert_eq!(
            check_addresses(&[ip("10.0.0.1"), ip("10.0.0.1")], 80, none, &[]),
            Ok(vec!["10.0.0.1:80".parse().unwrap()])
        );
        // One bad address refuses the lot.
        assert_eq!(
            check_addresses(&[ip("10.0.0.1"), ip("127.0.0.1")], 80, none, &[]),
            Err((ip("127.0.0.1"), "loopback"))
        );
        let rules = [rule("127.0.0.1:9696"), rule("[::1]"), rule("10.96.0.1:443")];
        assert!(check_addresses(&[ip("127.0.0.1")], 9696, &rules, &[]).is_ok());
        assert!(check_addresses(&[ip("::ffff:127.0.0.1")], 9696, &rules, &[]).is_ok());
        assert!(check_addresses(&[ip("127.0.0.1")], 9697, &rules, &[]).is_err());
        assert!(check_addresses(&[ip("::1")], 1, &rules, &[]).is_ok());
        assert!(check_addresses(&[ip("169.254.169.254")], 80, &rules, &[]).is_err());
        let api = [ip("10.96.0.1")];
        assert!(check_addresses(&[ip("10.96.0.1")], 443, &rules, &api).is_ok());
        assert!(check_addresses(&[ip("10.96.0.1")], 6443, &rules, &api).is_err());
        // A name rule is no explicit address rule.
        let by_name = [rule("localhost:9696")];
        assert!(check_addresses(&[ip("127.0.0.1")], 9696, &by_name, &[]).is_err());
    }

    #[test]
    fn log_text_is_escaped_and_truncated() {
        assert_eq!(for_log("neutron:9696"), "neutron:9696");
        assert_eq!(for_log("a\nb\x1b[31m\\"), "a\\nb\\u{1b}[31m\\\\");
        assert_eq!(for_log("a\u{202e}b"), "a\\u{202e}b");
        let long = for_log(&"x".repeat(100_000));
        assert!(
            long.len() < 130 && long.ends_with("(100000 bytes)"),
            "{long}"
        );
    }

    #[test]
    fn the_denial_limiter_is_bounded() {
        let log = DenialLog::new();
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..100_000).map(|_| log.verdict(t0)).collect();
        let lines = verdicts.iter().filter(|v| **v != Verdict::Quiet).count();
        assert_eq!(lines, DENIAL_WARNINGS_PER_WINDOW as usize + 1);
        assert_eq!(verdicts[10], Verdict::Summary);
        // The next window logs again and says how many went unlogged.
        let later = t0 + DENIAL_WINDOW;
        assert_eq!(
            log.verdict(later),
            Verdict::Log {
                suppressed: 100_000 - 10
            }
        );
        // Spread over 100 s: at most two windows' worth of lines.
        let log = DenialLog::new();
        let lines = (0..100_000u64)
            .map(|i| log.verdict(t0 + Duration::from_millis(i)))
            .filter(|v| *v != Verdict::Quiet)
            .count();
        assert_eq!(lines, 2 * (DENIAL_WARNINGS_PER_WINDOW as usize + 1));
    }

    fn policy(rules: &[&str]) -> HttpPolicy {
        policy_for("test-plugin", rules, None)
    }

    fn policy_for(plugin: &str, rules: &[&str], metrics: Option<Arc<Metrics>>) -> HttpPolicy {
        let rules: Vec<HostRule> = rules.iter().map(|r| rule(r)).collect();
        let budget = Arc::new(HttpBudget::new(0.0, 1));
        HttpPolicy::new(plugin.into(), rules.into(), Arc::from([]), metrics, budget)
    }

    fn get(uri: &str) -> http::Request<WasiBody> {
        use http_body_util::BodyExt;
        let body = http_body_util::Empty::<Bytes>::new()
            .map_err(|e| match e {})
            .boxed_unsync();
        http::Request::get(uri).body(body).unwrap()
    }

    /// Runs the hook; the status code or the error.
    async fn call(p: &mut HttpPolicy, req: http::Request<WasiBody>) -> Result<u16, Error> {
        let fut = p.send_request(req, None, Box::new(async { Ok(()) }));
        let (res, io) = Box::into_pin(fut).await?;
        let status = res.status().as_u16();
        use http_body_util::BodyExt;
        res.into_body().collect().await?;
        Box::into_pin(io).await?;
        Ok(status)
    }

    /// A refusal that needs no network: the hook's future is ready at once.
    fn refuse(p: &mut HttpPolicy, req: http::Request<WasiBody>) -> Error {
        let mut fut = Box::into_pin(p.send_request(req, None, Box::new(async { Ok(()) })));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(e)) => e,
            _ => panic!("expected an immediate refusal"),
        }
    }

    #[test]
    fn requests_are_counted_and_sized_per_call() {
        let mut p = policy(&["neutron"]);
        p.max_requests = 3;
        for _ in 0..3 {
            // Allowed, so these pass `admit`; not awaited, nothing is sent.
            drop(p.send_request(get("http://neutron/"), None, Box::new(async { Ok(()) })));
        }
        assert!(matches!(
            refuse(&mut p, get("http://neutron/")),
            Error::HttpRequestDenied
        ));
        p.begin_call();
        drop(p.send_request(get("http://neutron/"), None, Box::new(async { Ok(()) })));
        assert_eq!(p.requests, 1);

        let mut p = policy(&["neutron"]);
        let long = format!("http://neutron/{}", "a".repeat(MAX_URI_BYTES));
        assert!(matches!(
            refuse(&mut p, get(&long)),
            Error::HttpRequestUriTooLong
        ));
        let mut req = get("http://neutron/");
        for i in 0..70 {
            req.headers_mut().insert(
                http::HeaderName::try_from(format!("x-h{i}")).unwrap(),
                http::HeaderValue::try_from("v".repeat(1000)).unwrap(),
            );
        }
        assert!(matches!(
            refuse(&mut p, req),
            Error::HttpRequestHeaderSectionSize(_)
        ));
        assert!(matches!(
            refuse(&mut p, get("http://u@neutron/")),
            Error::HttpRequestUriInvalid
        ));
        assert!(matches!(
            refuse(&mut p, get("http://nova/")),
            Error::HttpRequestDenied
        ));
    }

    #[test]
    fn a_request_over_the_plugins_rate_waits_within_the_call_or_is_refused_at_once() {
        let mut p = policy(&["neutron"]);
        p.budget = Arc::new(HttpBudget::new(1.0, 2));
        p.set_deadline(Instant::now() + Duration::from_millis(2500));
        // The burst goes at once; the next tokens come after 1 s and 2 s, within nine tenths of
        // the call's 2.5 s: those requests wait (not awaited here, nothing is sent).
        assert_eq!(p.rate_token().ok(), Some(Duration::ZERO));
        assert_eq!(p.rate_token().ok(), Some(Duration::ZERO));
        for expected in [1000, 2000] {
            let wait = p.rate_token().expect("within the call");
            assert!(
                wait <= Duration::from_millis(expected)
                    && wait > Duration::from_millis(expected - 100),
                "{wait:?}"
            );
        }
        // The next one's would come after 3 s: refused now, with the reason, and nothing taken.
        let e = refuse(&mut p, get("http://neutron/"));
        assert!(
            matches!(&e, Error::InternalError(Some(m))
                if m.contains("rate limited")
                    && m.contains("1 outbound HTTP requests per second (burst 2)")),
            "{e}"
        );
        assert!(p.rate_token().is_err());
        // A later call, with time enough, waits its turn instead.
        p.begin_call();
        p.set_deadline(Instant::now() + Duration::from_secs(10));
        let wait = p.rate_token().expect("within the call");
        assert!(wait > Duration::from_millis(2900), "{wait:?}");
    }

    #[test]
    fn many_denied_authorities_make_one_series_and_few_log_lines() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        #[derive(Clone)]
        struct Lines(Arc<AtomicUsize>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let n = buf.iter().filter(|b| **b == b'\n').count();
                self.0.fetch_add(n, Ordering::Relaxed);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines(Arc::new(AtomicUsize::new(0)));
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .finish();
        let metrics = Metrics::new();
        tracing::subscriber::with_default(subscriber, || {
            let mut p = policy_for("many-denials", &["neutron"], Some(metrics.clone()));
            p.max_requests = u32::MAX;
            for i in 0..100_000 {
                let e = refuse(&mut p, get(&format!("http://h{i}.example/")));
                assert!(matches!(e, Error::HttpRequestDenied));
            }
        });
        let n = lines.0.load(Ordering::Relaxed);
        assert!((1..=2 * 11).contains(&n), "{n} log lines");
        let text = metrics.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("many-denials") && !l.starts_with('#'))
            .collect();
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(
            series[0].contains("resource=\"outbound-http\""),
            "{series:?}"
        );
        assert!(series[0].ends_with(" 100000"), "{series:?}");
    }

    /// A loopback HTTP server answering 200 to anything; counts connections, keeps requests.
    async fn server() -> (u16, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    // Up to the end of the header, or the first read of a TLS ClientHello.
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.first() != Some(&0x16) {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    log.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                });
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn loopback_is_reached_only_when_allowed_as_an_address() {
        let (port, seen) = server().await;
        let url = |host: &str| format!("http://{host}:{port}/v2.0/networks?x=1");

        // The name is allowed, but it resolves to loopback: refused, nothing connects.
        let mut p = policy(&[&format!("localhost:{port}")]);
        let e = call(&mut p, get(&url("localhost"))).await.unwrap_err();
        assert!(matches!(e, Error::DestinationIpProhibited), "{e}");
        // Another port of the address: not allowed at all.
        let mut p = policy(&["127.0.0.1:1"]);
        let e = call(&mut p, get(&url("127.0.0.1"))).await.unwrap_err();
        assert!(matches!(e, Error::HttpRequestDenied), "{e}");
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing reached the server"
        );

        // The address allowed explicitly (as the integration test does), and by name too.
        let mut p = policy(&[&format!("127.0.0.1:{port}")]);
        assert_eq!(call(&mut p, get(&url("127.0.0.1"))).await.unwrap(), 200);
        let mut p = policy(&["127.0.0.1"]);
        assert_eq!(call(&mut p, get(&url("127.0.0.1"))).await.unwrap(), 200);
        let rules = [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        let mut p = policy(&rules.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(call(&mut p, get(&url("localhost"))).await.unwrap(), 200);

        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        // Origin form on the wire, not the absolute URI.
        assert!(
            seen[0].starts_with("GET /v2.0/networks?x=1 HTTP/1.1\r\n"),
            "{}",
            seen[0]
        );
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_held_only_up_to_it_and_streams_whole() {
        use http_body_util::BodyExt;
        let body = |n: u8| {
            let frames: Vec<Result<Frame<Bytes>, Error>> = (0..n)
                .map(|i| Ok(Frame::data(Bytes::from(vec![b'a' + i; 1000]))))
                .collect();
            http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed_unsync()
        };
        let (first, rest) = read_up_to(body(10), 2500).await.unwrap();
        // At most the limit and one frame.
        assert!(first.len() > 2500 && first.len() <= 3500, "{}", first.len());
        let all = prefixed(first, rest.expect("the rest"))
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(all.len(), 10_000);
        assert!(all[..1000].iter().all(|&b| b == b'a') && all[9999] == b'j');
        let (whole, rest) = read_up_to(body(2), 2500).await.unwrap();
        assert!(rest.is_none());
        assert_eq!(whole.len(), 2000);
    }

    #[tokio::test]
    async fn an_exchange_the_tape_has_no_room_for_is_sent_and_left_out() {
        let (port, seen) = server().await;
        let url = format!("http://127.0.0.1:{port}/v2.0/networks");
        let tape = Arc::new(Mutex::new(Tape::recording()));
        let mut p = policy(&[&format!("127.0.0.1:{port}")]);
        p.tape = Some(tape.clone());
        assert_eq!(call(&mut p, get(&url)).await.unwrap(), 200);
        tape.lock().unwrap().leave_out();
        assert_eq!(tape.lock().unwrap().room(), 0);
        assert_eq!(call(&mut p, get(&url)).await.unwrap(), 200);
        assert_eq!(seen.lock().unwrap().len(), 2);
        let (calls, left_out, _) = crate::sandbox::tape::Tapes::take_http(tape).into_calls();
        assert_eq!((calls.len(), left_out), (1, 2), "{calls:?}");
    }

    #[tokio::test]
    async fn https_goes_to_the_checked_address_with_the_name_for_tls() {
        let (port, seen) = server().await;
        let rules = [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        let mut p = policy(&rules.iter().map(String::as_str).collect::<Vec<_>>());
        // The server speaks no TLS, so the handshake fails; what it received is a ClientHello
        // (record type 0x16) naming `localhost` (SNI).
        let e = call(&mut p, get(&format!("https://localhost:{port}/")))
            .await
            .unwrap_err();
        assert!(!matches!(e, Error::DestinationIpProhibited), "{e}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].starts_with('\u{16}'), "{:?}", &seen[0][..8]);
        assert!(seen[0].contains("localhost"));
    }
}
