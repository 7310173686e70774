//! Traces of reconciles over OTLP (off unless `--otlp-endpoint` is given): a span per reconcile
//! (plugin, version, key, attempt, result) with a child span per host call (API verb and resource,
//! cache read, event, outbound HTTP host), exported to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf). Spans are `tracing` spans of the target [`TARGET`], turned into OpenTelemetry spans
//! by `tracing-opentelemetry`; the log output never shows them, and without an endpoint nothing
//! subscribes to them (their cost is a disabled callsite's).

use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

/// The `tracing` target of every span exported as a trace.
pub const TARGET: &str = "wcm_trace";

/// Where and how traces go.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// The collector's OTLP/HTTP base URL (`http://otel-collector:4318`); spans go to
    /// `/v1/traces` under it.
    pub endpoint: String,
    /// `service.name` of the resource.
    pub service_name: String,
    /// The share of reconciles traced (0–1), decided per trace.
    pub sample_ratio: f64,
}

/// The tracer provider; flushes what is buffered when shut down.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Starts the exporter; the layer to add to the subscriber.
    pub fn start<S>(
        settings: &OtlpSettings,
    ) -> Result<(
        Tracing,
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
    )>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let url = url::Url::parse(&settings.endpoint)
            .with_context(|| format!("--otlp-endpoint {:?} is not a URL", settings.endpoint))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https") && url.host_str().is_some(),
            "--otlp-endpoint {:?}: an http:// or https:// URL with a host",
            settings.endpoint
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&settings.sample_ratio),
            "--otlp-sample-ratio must be between 0 and 1"
        );
        // The exporter's HTTP client is built on rustls without a provider of its own: the
        // host's (ring), as for its other clients.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let traces = format!("{}/v1/traces", settings.endpoint.trim_end_matches('/'));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces)
            .with_timeout(Duration::from_secs(10))
            .with_headers(Default::default())
            .build()
            .context("start the OTLP exporter")?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let tracer = provider.tracer("wasm-controller-manager");
        Ok((
            Tracing { provider },
            tracing_opentelemetry::layer().with_tracer(tracer),
        ))
    }

    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("traces: the exporter did not shut down cleanly: {e}");
        }
    }
}

/// The W3C `traceparent` (and `tracestate`) of the current span, for an outbound request of a
/// plugin that asked for it; nothing when no trace is being recorded.
pub fn trace_context_headers() -> Vec<(String, String)> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = tracing::Span::current().context();
    let mut headers = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    headers.into_iter().collect()
}
