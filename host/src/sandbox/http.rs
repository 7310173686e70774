//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), only to the hosts the plugin declared
//! and the operator allowed. Anything else gets `HTTP-request-denied` inside the guest, a warning and
//! a metric; the request never leaves the host.

use std::sync::Arc;

use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::metrics::Metrics;

/// The allow-list of one plugin: entries are `host` (any port) or `host:port`.
#[derive(Clone, Default)]
pub struct HttpPolicy {
    pub plugin: Arc<str>,
    pub allowed: Arc<[String]>,
    pub metrics: Option<Arc<Metrics>>,
}

impl HttpPolicy {
    /// Whether `authority` (`host` or `host:port`) may be reached.
    pub fn allows(&self, authority: &str) -> bool {
        let host = authority.rsplit_once(':').map_or(authority, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                authority
            }
        });
        self.allowed
            .iter()
            .any(|a| a.eq_ignore_ascii_case(authority) || a.eq_ignore_ascii_case(host))
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
        let authority = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        if !self.allows(&authority) {
            tracing::warn!(plugin = %self.plugin, authority, "outbound HTTP refused: host not declared and allowed");
            if let Some(m) = &self.metrics {
                m.forbidden_call(&self.plugin, "http", &authority);
            }
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        _ = fut;
        Box::new(async move {
            use http_body_util::BodyExt;
            let (res, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                res.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_entries_match_any_port_host_port_entries_only_theirs() {
        let p = HttpPolicy {
            allowed: vec!["neutron.example".to_string(), "127.0.0.1:9696".to_string()].into(),
            ..Default::default()
        };
        assert!(p.allows("neutron.example"));
        assert!(p.allows("neutron.example:443"));
        assert!(p.allows("127.0.0.1:9696"));
        assert!(!p.allows("127.0.0.1:9697"));
        assert!(!p.allows("127.0.0.1"));
        assert!(!p.allows("evil.example"));
        assert!(!p.allows(""));
    }
}
