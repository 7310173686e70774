//! Outbound HTTP over `wasi:http`, to the hosts the plugin declared
//! ([`Description::outbound_host`](crate::Description::outbound_host)) and the operator allowed.
//!
//! ```
//! use wcm_sdk::http::{HttpResponse, Method};
//! use wcm_sdk::serde_json::json;
//! use wcm_sdk::testing::MockHost;
//!
//! let host = MockHost::new();
//! host.on_http(|req| {
//!     assert_eq!((req.method, req.url.as_str()), (Method::Post, "http://api.example:9696/v2.0/networks"));
//!     Ok(HttpResponse::json(201, &json!({"network": {"id": "n1"}})))
//! });
//! let ctx = host.context();
//! let created: serde_json::Value = ctx
//!     .http()
//!     .post("http://api.example:9696/v2.0/networks")
//!     .header("X-Auth-Token", "t")
//!     .json(&json!({"network": {"name": "blue"}}))
//!     .send()
//!     .and_then(HttpResponse::error_for_status)
//!     .and_then(|r| r.body_json())
//!     .expect("created");
//! assert_eq!(created["network"]["id"], "n1");
//! assert_eq!(host.http_requests().len(), 1);
//! ```
//!
//! Errors say whether a retry can help ([`HttpError::is_retryable`]), and convert into the
//! reconcile [`Error`] with the same rule, so `?` does the right thing.

use std::fmt;
use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::host::Host;
use crate::reconcile::Error;

/// Most bytes of a response body read by default ([`RequestBuilder::max_body`]).
pub const DEFAULT_MAX_BODY: usize = 4 << 20;
/// The timeout when the request sets none: connect, first byte and between bytes each.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

impl Method {
    /// The method's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request, as the host (or [`MockHost`](crate::testing::MockHost)) receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method.
    pub method: Method,
    /// `http://host:port/path?query` or `https://…`.
    pub url: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (empty: none).
    pub body: Vec<u8>,
    /// Connect, first-byte and between-bytes timeout.
    pub timeout: Duration,
    /// Most response-body bytes to read; more is an error.
    pub max_body: usize,
}

impl HttpRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body parsed as JSON.
    pub fn body_json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| HttpError::new(HttpErrorKind::Decode, e))
    }

    /// The path and query of the URL (`/v2.0/networks?tags=x`), `/` when it has none.
    pub fn path_and_query(&self) -> &str {
        split_url(&self.url).map_or("/", |(_, _, p)| p)
    }
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// A response with this status and an empty body.
    pub fn new(status: u16) -> Self {
        HttpResponse {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A JSON response (for tests and fakes).
    pub fn json(status: u16, body: &impl Serialize) -> Self {
        HttpResponse {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(body).unwrap_or_default(),
        }
    }

    /// The same response with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; a body that does not parse is a terminal [`HttpErrorKind::Decode`].
    pub fn body_json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            HttpError::new(
                HttpErrorKind::Decode,
                format!(
                    "response body ({} bytes) is not the JSON expected: {e}",
                    self.body.len()
                ),
            )
        })
    }

    /// `Ok(self)` for 2xx, else an [`HttpErrorKind::Status`] error carrying the status, the start
    /// of the body and any `Retry-After`.
    pub fn error_for_status(self) -> Result<Self, HttpError> {
        if self.is_success() {
            return Ok(self);
        }
        let retry_after = self
            .header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut text = self.text();
        if text.len() > 512 {
            let mut cut = 512;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        Err(HttpError {
            kind: HttpErrorKind::Status(self.status),
            message: format!("HTTP {}: {}", self.status, text.trim()),
            retry_after,
            response: Some(Box::new(self)),
        })
    }
}

/// What went wrong with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpErrorKind {
    /// No answer in time (connect, first byte or between bytes).
    Timeout,
    /// The connection failed or broke (refused, reset, DNS, TLS).
    Connection,
    /// The host refused to send it: the destination is not declared by the plugin and allowed by
    /// the operator, or resolves to a protected address. A configuration problem: terminal.
    Denied,
    /// The request itself is malformed (bad URL, bad header).
    InvalidRequest,
    /// The response body is larger than the request allowed.
    TooLarge,
    /// The body was not what was expected.
    Decode,
    /// A non-2xx answer ([`HttpResponse::error_for_status`]).
    Status(u16),
}

/// An HTTP failure, with whether a retry can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    kind: HttpErrorKind,
    message: String,
    retry_after: Option<Duration>,
    response: Option<Box<HttpResponse>>,
}

impl HttpError {
    /// An error of this kind.
    pub fn new(kind: HttpErrorKind, message: impl fmt::Display) -> Self {
        HttpError {
            kind,
            message: message.to_string(),
            retry_after: None,
            response: None,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> HttpErrorKind {
        self.kind
    }

    /// The status code, for [`HttpErrorKind::Status`].
    pub fn status(&self) -> Option<u16> {
        match self.kind {
            HttpErrorKind::Status(s) => Some(s),
            _ => None,
        }
    }

    /// The response, for [`HttpErrorKind::Status`] (to read an API's own error body).
    pub fn response(&self) -> Option<&HttpResponse> {
        self.response.as_deref()
    }

    /// The server's `Retry-After`, in seconds form, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether trying again later can succeed: timeouts, broken connections, 408, 425, 429 and
    /// 5xx other than 501 and 505. Refusals by the host, malformed requests, other 4xx and bodies
    /// that do not decode are terminal: the same request would fail the same way.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            HttpErrorKind::Timeout | HttpErrorKind::Connection => true,
            HttpErrorKind::Status(s) => {
                matches!(s, 408 | 425 | 429) || (s >= 500 && s != 501 && s != 505)
            }
            HttpErrorKind::Denied
            | HttpErrorKind::InvalidRequest
            | HttpErrorKind::TooLarge
            | HttpErrorKind::Decode => false,
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        if e.is_retryable() {
            // A 429/503's Retry-After says when to come back: the host waits at least that long.
            let after = e.retry_after;
            let err = Error::retryable(e.message.clone()).with_source(e);
            match after {
                Some(d) => err.retry_after(d),
                None => err,
            }
        } else {
            Error::terminal(e.message.clone()).with_source(e)
        }
    }
}

/// The plugin's HTTP client ([`Context::http`](crate::Context::http)).
#[derive(Clone)]
pub struct Http {
    host: Rc<dyn Host>,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http").finish_non_exhaustive()
    }
}

impl Http {
    pub(crate) fn new(host: Rc<dyn Host>) -> Self {
        Http { host }
    }

    /// A request with `method` to `url`.
    pub fn request(&self, method: Method, url: impl Into<String>) -> RequestBuilder {
        RequestBuilder {
            host: self.host.clone(),
            req: HttpRequest {
                method,
                url: url.into(),
                headers: Vec::new(),
                body: Vec::new(),
                timeout: DEFAULT_TIMEOUT,
                max_body: DEFAULT_MAX_BODY,
            },
        }
    }

    /// A GET.
    pub fn get(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::Get, url)
    }

    /// A POST.
    pub fn post(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::Post, url)
    }

    /// A PUT.
    pub fn put(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::Put, url)
    }

    /// A PATCH.
    pub fn patch(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::Patch, url)
    }

    /// A DELETE.
    pub fn delete(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::Delete, url)
    }
}

/// A request being built; [`RequestBuilder::send`] sends it.
pub struct RequestBuilder {
    host: Rc<dyn Host>,
    req: HttpRequest,
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("method", &self.req.method)
            .field("url", &self.req.url)
            .finish_non_exhaustive()
    }
}

impl RequestBuilder {
    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.req.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// A JSON body, with `Content-Type: application/json`.
    pub fn json(mut self, body: &impl Serialize) -> Self {
        // Serializing a plain value (a serde_json::Value or a derived struct) does not fail.
        self.req.body = serde_json::to_vec(body).unwrap_or_default();
        self.header("Content-Type", "application/json")
    }

    /// A raw body.
    pub fn body(mut self, body: Vec<u8>) -> Self {
        self.req.body = body;
        self
    }

    /// Connect, first-byte and between-bytes timeout (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.req.timeout = timeout;
        self
    }

    /// Most response-body bytes to read (default [`DEFAULT_MAX_BODY`]).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.req.max_body = bytes;
        self
    }

    /// The request as built (for logging or tests).
    pub fn build(self) -> HttpRequest {
        self.req
    }

    /// Sends it and reads the whole response. Any status is `Ok`; chain
    /// [`HttpResponse::error_for_status`] to turn non-2xx into errors.
    pub fn send(self) -> Result<HttpResponse, HttpError> {
        if split_url(&self.req.url).is_none() {
            return Err(HttpError::new(
                HttpErrorKind::InvalidRequest,
                format!(
                    "not an http:// or https:// URL with a host: {:?}",
                    shorten(&self.req.url)
                ),
            ));
        }
        // Called directly, so only a plugin that sends requests imports wasi:http.
        #[cfg(target_arch = "wasm32")]
        if self.host.sends_over_wasi_http() {
            return crate::wasm_http::send(&self.req);
        }
        self.host.http(&self.req)
    }
}

/// The `host[:port]` of an absolute `http`/`https` URL: what to declare with
/// [`Description::outbound_host`](crate::Description::outbound_host) for an endpoint taken from the
/// operator's settings. `None` for anything else.
pub fn authority(url: &str) -> Option<&str> {
    split_url(url).map(|(_, authority, _)| authority)
}

/// `(scheme, authority, path-and-query)` of an absolute `http`/`https` URL.
pub(crate) fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some((scheme, authority, if path.is_empty() { "/" } else { path }))
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

pub(crate) fn shorten(s: &str) -> String {
    s.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_and_checked() {
        assert_eq!(
            split_url("http://127.0.0.1:9696/v2.0/networks?tags=a"),
            Some(("http", "127.0.0.1:9696", "/v2.0/networks?tags=a"))
        );
        assert_eq!(
            split_url("https://neutron.example"),
            Some(("https", "neutron.example", "/"))
        );
        assert_eq!(split_url("https://h?x=1"), Some(("https", "h", "?x=1")));
        assert_eq!(split_url("ftp://h/x"), None);
        assert_eq!(split_url("http:///x"), None);
        assert_eq!(split_url("http://user@h/x"), None);
        assert_eq!(split_url("/relative"), None);
    }

    #[test]
    fn retryable_follows_the_status() {
        let status = |s| HttpResponse::new(s).error_for_status().unwrap_err();
        for s in [408, 425, 429, 500, 502, 503, 504] {
            assert!(status(s).is_retryable(), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 422, 501, 505] {
            assert!(!status(s).is_retryable(), "{s}");
        }
        assert!(HttpResponse::new(204).error_for_status().is_ok());
        assert!(HttpError::new(HttpErrorKind::Timeout, "t").is_retryable());
        assert!(!HttpError::new(HttpErrorKind::Denied, "d").is_retryable());
        let e: Error = HttpError::new(HttpErrorKind::Connection, "reset").into();
        assert!(!e.is_terminal());
        let e: Error = status(404).into();
        assert!(e.is_terminal());
    }

    #[test]
    fn status_errors_keep_the_body_start_and_retry_after() {
        let e = HttpResponse::new(503)
            .with_header("Retry-After", "7")
            .with_header("x", "y")
            .error_for_status()
            .unwrap_err();
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
        let long = HttpResponse {
            status: 409,
            headers: vec![],
            body: "é".repeat(600).into_bytes(),
        };
        let e = long.error_for_status().unwrap_err();
        assert!(e.message().len() < 600, "{}", e.message().len());
        assert_eq!(e.status(), Some(409));
        assert_eq!(e.response().map(|r| r.body.len()), Some(1200));
    }
}
