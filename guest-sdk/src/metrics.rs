//! The plugin's own metrics (contract 0.3).
//!
//! Declare each in the description ([`Description::metric`](crate::Description::metric)), then
//! update it from a reconcile through [`Context::metrics`](crate::Context::metrics). The host
//! exports them on its `/metrics` as `wcm_plugin_<plugin>__<name>` (the plugin's instance name
//! with `-` as `_`, then two `_`; a counter with `_total`), with the declared labels, while the plugin runs.
//! An update that does not match its declaration (an unknown name, the wrong kind, a label
//! count, a label value longer than 128 bytes, a negative counter step, a value that is not
//! finite) or that would make a series past the plugin's series budget (1000 by default, the
//! operator's `max_metric_series`) is refused with the reason and counted by the host in
//! `wcm_plugin_metric_updates_refused_total`; it never fails the reconcile.
//! [`MockHost`](crate::testing::MockHost) keeps the values and refuses the same updates.
//!
//! ```
//! use wcm_sdk::{Description, Metric, Watch};
//! use wcm_sdk::k8s_openapi::api::core::v1::Pod;
//!
//! let d = Description::new("pod-counter", "1.0.0")
//!     .primary(Watch::of::<Pod>())
//!     .metric(Metric::counter("reconciles", "Reconciles by result.").labels(&["result"]))
//!     .metric(Metric::histogram("pods_seen", "Pods seen per reconcile.").buckets(&[1.0, 10.0, 100.0]));
//! assert!(d.validate().is_ok());
//! ```

pub use wcm_rules::metrics::Update;
use wcm_rules::metrics::{Decl, Kind};

use crate::host::Host;

/// The kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up ([`Metrics::add`] with a value ≥ 0); exported with `_total`.
    Counter,
    /// Goes up and down ([`Metrics::set`], [`Metrics::add`]).
    Gauge,
    /// Observations counted in buckets ([`Metrics::observe`]).
    Histogram,
}

/// A metric the plugin declares.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// 1–64 lowercase letters, digits and `_`, starting with a letter.
    pub name: String,
    /// One line, at most 200 characters.
    pub help: String,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Label names (at most 8; not `plugin` or `le`).
    pub labels: Vec<String>,
    /// Histogram bucket upper bounds, increasing (at most 32); empty: Prometheus' defaults.
    pub buckets: Vec<f64>,
}

impl Metric {
    fn new(name: &str, help: &str, kind: MetricKind) -> Self {
        Metric {
            name: name.into(),
            help: help.into(),
            kind,
            labels: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// A counter (declare the name without `_total`: the host adds it).
    pub fn counter(name: &str, help: &str) -> Self {
        Metric::new(name, help, MetricKind::Counter)
    }

    /// A gauge.
    pub fn gauge(name: &str, help: &str) -> Self {
        Metric::new(name, help, MetricKind::Gauge)
    }

    /// A histogram (buckets: [`Metric::buckets`], else Prometheus' defaults).
    pub fn histogram(name: &str, help: &str) -> Self {
        Metric::new(name, help, MetricKind::Histogram)
    }

    /// The label names; each update gives one value per name, in this order.
    pub fn labels(mut self, names: &[&str]) -> Self {
        self.labels = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// A histogram's bucket upper bounds.
    pub fn buckets(mut self, bounds: &[f64]) -> Self {
        self.buckets = bounds.to_vec();
        self
    }

    pub(crate) fn decl(&self) -> Decl {
        Decl {
            name: self.name.clone(),
            help: self.help.clone(),
            kind: match self.kind {
                MetricKind::Counter => Kind::Counter,
                MetricKind::Gauge => Kind::Gauge,
                MetricKind::Histogram => Kind::Histogram,
            },
            labels: self.labels.clone(),
            buckets: self.buckets.clone(),
        }
    }
}

/// Updates the plugin's declared metrics; from [`Context::metrics`](crate::Context::metrics).
pub struct Metrics<'a> {
    pub(crate) host: &'a dyn Host,
}

impl Metrics<'_> {
    /// Adds `value` (≥ 0 for a counter) to the series of `name` with these label values.
    pub fn add(&self, name: &str, labels: &[&str], value: f64) -> Result<(), String> {
        self.host.metric(Update::Add, name, labels, value)
    }

    /// Adds 1 to a counter's series.
    pub fn inc(&self, name: &str, labels: &[&str]) -> Result<(), String> {
        self.add(name, labels, 1.0)
    }

    /// Sets a gauge's series.
    pub fn set(&self, name: &str, labels: &[&str], value: f64) -> Result<(), String> {
        self.host.metric(Update::Set, name, labels, value)
    }

    /// Records an observation in a histogram's series.
    pub fn observe(&self, name: &str, labels: &[&str], value: f64) -> Result<(), String> {
        self.host.metric(Update::Observe, name, labels, value)
    }
}
