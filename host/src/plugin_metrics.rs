//! A plugin's own metrics (contract 0.3): declared in its description, updated through the
//! `metrics` host calls, exported on the host's `/metrics` as `wcm_plugin_<plugin>_<name>` while
//! the plugin runs, and gone with it.
//!
//! Everything from the plugin is checked before it reaches the exposition: names by the
//! declaration rules (`contract::declared`, at load), label values by length and count, values by kind. Each
//! plugin has a series budget (distinct label-value sets over all its metrics): an update that
//! would make a series past it is refused, counted in
//! `wcm_plugin_metric_updates_refused_total{plugin,reason}` and warned about at most once a minute.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::contract::{Metric, MetricKind, validate};

/// Bytes of one label value.
pub const MAX_LABEL_VALUE: usize = 128;
/// The series budget of a plugin unless the operator says otherwise (`--plugin-metric-series`).
pub const DEFAULT_MAX_SERIES: usize = 1000;
/// Prometheus' default buckets, for a histogram declared without any.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why an update was refused: the `reason` label of the refusal counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    UnknownMetric,
    WrongKind,
    LabelCount,
    LabelValue,
    Value,
    SeriesBudget,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::UnknownMetric => "unknown-metric",
            Refusal::WrongKind => "wrong-kind",
            Refusal::LabelCount => "label-count",
            Refusal::LabelValue => "label-value",
            Refusal::Value => "value",
            Refusal::SeriesBudget => "series-budget",
        }
    }
}

/// The update a host call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    Add,
    Set,
    Observe,
}

struct Decl {
    help: String,
    kind: MetricKind,
    labels: Vec<String>,
    buckets: Vec<f64>,
}

#[derive(Debug, Clone)]
enum Value {
    Number(f64),
    Histogram {
        /// Per bucket (not cumulative), and one more for +Inf.
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

#[derive(Default)]
struct State {
    /// metric name → label values → value.
    series: HashMap<String, BTreeMap<Vec<String>, Value>>,
    total: usize,
    refused: BTreeMap<Refusal, u64>,
    last_warning: Option<Instant>,
}

/// One plugin's metrics.
pub struct PluginMetrics {
    plugin: String,
    prefix: String,
    decls: BTreeMap<String, Decl>,
    max_series: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for PluginMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginMetrics")
            .field("plugin", &self.plugin)
            .field("metrics", &self.decls.len())
            .finish()
    }
}

impl PluginMetrics {
    /// For checked declarations (`declarations`). `plugin` is a DNS label (the instance name).
    pub fn new(plugin: &str, metrics: &[Metric], max_series: usize) -> Self {
        let decls = metrics
            .iter()
            .map(|m| {
                let buckets = if m.kind == MetricKind::Histogram && m.buckets.is_empty() {
                    DEFAULT_BUCKETS.to_vec()
                } else {
                    m.buckets.clone()
                };
                (
                    m.name.clone(),
                    Decl {
                        help: m.help.clone(),
                        kind: m.kind,
                        labels: m.labels.clone(),
                        buckets,
                    },
                )
            })
            .collect();
        PluginMetrics {
            plugin: plugin.to_string(),
            prefix: format!("wcm_plugin_{}_", plugin.replace('-', "_")),
            decls,
            max_series,
            state: Mutex::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.decls.is_empty()
    }

    /// Applies an update, or refuses it (counted; a warning at most once a minute).
    pub fn update(
        &self,
        update: Update,
        name: &str,
        labels: &[String],
        value: f64,
    ) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match self.apply(&mut state, update, name, labels, value) {
            Ok(()) => Ok(()),
            Err((refusal, why)) => {
                *state.refused.entry(refusal).or_default() += 1;
                let now = Instant::now();
                if state
                    .last_warning
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
                {
                    state.last_warning = Some(now);
                    tracing::warn!(plugin = %self.plugin, reason = refusal.reason(), "metric update refused: {why} (warned at most once a minute; all are counted in wcm_plugin_metric_updates_refused_total)");
                }
                Err(why)
            }
        }
    }

    fn apply(
        &self,
        state: &mut State,
        update: Update,
        name: &str,
        labels: &[String],
        value: f64,
    ) -> Result<(), (Refusal, String)> {
        let Some(decl) = self.decls.get(name) else {
            return Err((
                Refusal::UnknownMetric,
                format!("metric {} is not declared", validate::shown(name)),
            ));
        };
        let fits = matches!(
            (decl.kind, update),
            (MetricKind::Counter, Update::Add)
                | (MetricKind::Gauge, Update::Add | Update::Set)
                | (MetricKind::Histogram, Update::Observe)
        );
        if !fits {
            return Err((
                Refusal::WrongKind,
                format!("{update:?} does not apply to {:?} {name}", decl.kind),
            ));
        }
        if labels.len() != decl.labels.len() {
            return Err((
                Refusal::LabelCount,
                format!(
                    "{name} has {} labels; {} values given",
                    decl.labels.len(),
                    labels.len()
                ),
            ));
        }
        if let Some(v) = labels.iter().find(|v| v.len() > MAX_LABEL_VALUE) {
            return Err((
                Refusal::LabelValue,
                format!(
                    "label value {} is longer than {MAX_LABEL_VALUE} bytes",
                    validate::shown(v)
                ),
            ));
        }
        if !value.is_finite() || (decl.kind == MetricKind::Counter && value < 0.0) {
            return Err((
                Refusal::Value,
                format!("value {value} does not fit {name}"),
            ));
        }
        let total = state.total;
        let series = state.series.entry(name.to_string()).or_default();
        let slot = match series.get_mut(labels) {
            Some(slot) => slot,
            None => {
                if total >= self.max_series {
                    return Err((
                        Refusal::SeriesBudget,
                        format!(
                            "a new series of {name} would pass the plugin's budget of {} series",
                            self.max_series
                        ),
                    ));
                }
                let fresh = match decl.kind {
                    MetricKind::Histogram => Value::Histogram {
                        counts: vec![0; decl.buckets.len() + 1],
                        sum: 0.0,
                        count: 0,
                    },
                    _ => Value::Number(0.0),
                };
                state.total += 1;
                // Just inserted: the entry exists.
                let series = state.series.entry(name.to_string()).or_default();
                series.entry(labels.to_vec()).or_insert(fresh)
            }
        };
        match (slot, update) {
            (Value::Number(n), Update::Add) => *n += value,
            (Value::Number(n), Update::Set) => *n = value,
            (
                Value::Histogram { counts, sum, count },
                Update::Observe,
            ) => {
                let i = decl
                    .buckets
                    .iter()
                    .position(|b| value <= *b)
                    .unwrap_or(decl.buckets.len());
                counts[i] += 1;
                *sum += value;
                *count += 1;
            }
            _ => {
                return Err((Refusal::WrongKind, format!("{update:?} does not apply to {name}")));
            }
        }
        Ok(())
    }

    /// The number of series (for tests and `/debug`).
    pub fn series(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Refusals so far, by reason.
    pub fn refused(&self) -> BTreeMap<&'static str, u64> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .refused
            .iter()
            .map(|(r, n)| (r.reason(), *n))
            .collect()
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (name, decl) in &self.decls {
            let Some(series) = state.series.get(name) else {
                continue;
            };
            let full = format!("{}{name}", self.prefix);
            let metric_type = match decl.kind {
                MetricKind::Counter => MetricType::Counter,
                MetricKind::Gauge => MetricType::Gauge,
                MetricKind::Histogram => MetricType::Histogram,
            };
            let mut family = encoder.encode_descriptor(&full, &decl.help, None, metric_type)?;
            for (values, value) in series {
                let labels: Vec<(String, String)> = decl
                    .labels
                    .iter()
                    .cloned()
                    .zip(values.iter().cloned())
                    .collect();
                let metric = family.encode_family(&labels)?;
                match (value, decl.kind) {
                    (Value::Number(n), MetricKind::Counter) => {
                        ConstCounter::new(*n).encode(metric)?
                    }
                    (Value::Number(n), _) => ConstGauge::new(*n).encode(metric)?,
                    (Value::Histogram { counts, sum, count }, _) => {
                        let mut cumulative = 0;
                        let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(counts.len());
                        for (i, c) in counts.iter().enumerate() {
                            cumulative += c;
                            let upper = decl.buckets.get(i).copied().unwrap_or(f64::MAX);
                            buckets.push((upper, cumulative));
                        }
                        let mut metric = metric;
                        metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            *sum, *count, &buckets, None,
                        )?
                    }
                }
            }
        }
        let state_refused: Vec<(Refusal, u64)> =
            state.refused.iter().map(|(r, n)| (*r, *n)).collect();
        drop(state);
        if !state_refused.is_empty() {
            let mut family = encoder.encode_descriptor(
                "wcm_plugin_metric_updates_refused",
                "Metric updates of a plugin refused by the host, by reason.",
                None,
                MetricType::Counter,
            )?;
            for (refusal, n) in state_refused {
                let labels = vec![
                    ("plugin".to_string(), self.plugin.clone()),
                    ("reason".to_string(), refusal.reason().to_string()),
                ];
                let metric = family.encode_family(&labels)?;
                ConstCounter::new(n).encode(metric)?;
            }
        }
        Ok(())
    }
}

/// Every running plugin's metrics, encoded at each scrape.
#[derive(Debug, Default, Clone)]
pub struct PluginMetricsSet {
    plugins: Arc<Mutex<BTreeMap<String, Arc<PluginMetrics>>>>,
}

impl PluginMetricsSet {
    /// Exports `metrics` for `plugin`, in place of what it exported before (a new version).
    pub fn insert(&self, plugin: &str, metrics: Arc<PluginMetrics>) {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        plugins.insert(plugin.to_string(), metrics);
    }

    /// Stops exporting `plugin`'s metrics, if these are still the ones exported.
    pub fn remove(&self, plugin: &str, metrics: &Arc<PluginMetrics>) {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        if plugins.get(plugin).is_some_and(|m| Arc::ptr_eq(m, metrics)) {
            plugins.remove(plugin);
        }
    }

    /// Stops exporting `plugin`'s metrics.
    pub fn forget(&self, plugin: &str) {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        plugins.remove(plugin);
    }
}

impl Collector for PluginMetricsSet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let plugins: Vec<Arc<PluginMetrics>> = self
            .plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for p in plugins {
            p.encode(&mut encoder)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(name: &str, kind: MetricKind, labels: &[&str]) -> Metric {
        Metric {
            name: name.into(),
            help: "help".into(),
            kind,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            buckets: vec![],
        }
    }

    #[test]
    fn a_label_flood_stops_at_the_series_budget_and_is_counted() {
        let m = PluginMetrics::new("flood", &[decl("hits", MetricKind::Counter, &["who"])], 10);
        for i in 0..25 {
            let r = m.update(Update::Add, "hits", &[format!("user-{i}")], 1.0);
            assert_eq!(r.is_ok(), i < 10, "update {i}");
        }
        // An existing series still moves past the budget.
        assert!(m.update(Update::Add, "hits", &["user-3".into()], 1.0).is_ok());
        assert_eq!(m.series(), 10);
        assert_eq!(m.refused().get("series-budget"), Some(&15));
    }

    #[test]
    fn updates_that_do_not_match_the_declaration_are_refused() {
        let m = PluginMetrics::new(
            "p",
            &[
                decl("c", MetricKind::Counter, &["a"]),
                decl("h", MetricKind::Histogram, &[]),
            ],
            100,
        );
        assert!(m.update(Update::Add, "nope", &[], 1.0).is_err());
        assert!(m.update(Update::Set, "c", &["x".into()], 1.0).is_err());
        assert!(m.update(Update::Add, "c", &[], 1.0).is_err());
        assert!(m.update(Update::Add, "c", &["x".into()], -1.0).is_err());
        assert!(m.update(Update::Add, "c", &["x".into()], f64::NAN).is_err());
        assert!(m.update(Update::Add, "c", &["x".repeat(200)], 1.0).is_err());
        assert!(m.update(Update::Observe, "h", &[], f64::INFINITY).is_err());
        assert!(m.update(Update::Observe, "h", &[], 0.2).is_ok());
        let refused = m.refused();
        for reason in ["unknown-metric", "wrong-kind", "label-count", "value", "label-value"] {
            assert!(refused.contains_key(reason), "{reason} not counted: {refused:?}");
        }
        assert_eq!(m.series(), 1);
    }

    #[test]
    fn exposition_has_the_prefix_escaped_label_values_and_goes_with_the_plugin() {
        let set = PluginMetricsSet::default();
        let m = Arc::new(PluginMetrics::new(
            "my-plugin",
            &[
                decl("reconciles", MetricKind::Counter, &["result"]),
                Metric {
                    buckets: vec![0.1, 1.0],
                    ..decl("took", MetricKind::Histogram, &[])
                },
            ],
            100,
        ));
        set.insert("my-plugin", m.clone());
        m.update(Update::Add, "reconciles", &["o\"k\n".into()], 2.0)
            .expect("declared");
        m.update(Update::Observe, "took", &[], 0.5).expect("declared");
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(set.clone()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("wcm_plugin_my_plugin_reconciles_total{result=\"o\\\"k\\n\"} 2"),
            "{text}"
        );
        assert!(text.contains("wcm_plugin_my_plugin_took_bucket{le=\"1.0\"} 1"), "{text}");
        assert!(text.contains("wcm_plugin_my_plugin_took_bucket{le=\"0.1\"} 0"), "{text}");
        set.remove("my-plugin", &m);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(!text.contains("my_plugin"), "{text}");
    }
}
