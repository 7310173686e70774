//! A plugin's own metrics (contract 0.3): declared in its description, updated through the
//! `metrics` host calls, exported on the host's `/metrics` as `wcm_plugin_<plugin>__<name>` while
//! the plugin runs, and gone with it.
//!
//! The rules of declarations and updates, and the series budget, are `wcm_rules::metrics`
//! (shared with the SDK's MockHost). An update refused is counted in
//! `wcm_plugin_metric_updates_refused_total{plugin,reason}` and warned about at most once a
//! minute per plugin.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use wcm_rules::metrics::{Decl, Kind, Series, Value};

pub use wcm_rules::metrics::{DEFAULT_MAX_SERIES, Update};

use crate::contract::{Metric, MetricKind};

/// A declaration of the contract as the shared rules take it.
pub fn decl(m: &Metric) -> Decl {
    Decl {
        name: m.name.clone(),
        help: m.help.clone(),
        kind: match m.kind {
            MetricKind::Counter => Kind::Counter,
            MetricKind::Gauge => Kind::Gauge,
            MetricKind::Histogram => Kind::Histogram,
        },
        labels: m.labels.clone(),
        buckets: m.buckets.clone(),
    }
}

struct State {
    series: Series,
    last_warning: Option<Instant>,
}

/// One plugin's metrics.
pub struct PluginMetrics {
    plugin: String,
    prefix: String,
    state: Mutex<State>,
}

impl std::fmt::Debug for PluginMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginMetrics")
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

impl PluginMetrics {
    /// For checked declarations (`contract::declared`). `plugin` is a DNS label (the instance
    /// name).
    pub fn new(plugin: &str, metrics: &[Metric], max_series: usize) -> Self {
        let decls: Vec<Decl> = metrics.iter().map(decl).collect();
        PluginMetrics {
            plugin: plugin.to_string(),
            prefix: format!("wcm_plugin_{}__", plugin.replace('-', "_")),
            state: Mutex::new(State {
                series: Series::new(&decls, max_series),
                last_warning: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies an update, or refuses it (counted; a warning at most once a minute).
    pub fn update(
        &self,
        update: Update,
        name: &str,
        labels: &[String],
        value: f64,
    ) -> Result<(), String> {
        let mut state = self.state();
        match state.series.update(update, name, labels, value) {
            Ok(()) => Ok(()),
            Err((refusal, why)) => {
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

    /// The number of series.
    pub fn series(&self) -> usize {
        self.state().series.total()
    }

    /// Refusals so far, by reason.
    pub fn refused(&self) -> BTreeMap<&'static str, u64> {
        self.state().series.refused()
    }

    /// Encodes a copy of the plugin's series (its lock is held only for the copy: its metric
    /// calls never wait for a scrape).
    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series = self.state().series.clone();
        for decl in series.decls() {
            let Some(values) = series.values(&decl.name) else {
                continue;
            };
            let full = format!("{}{}", self.prefix, decl.name);
            let metric_type = match decl.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut family = encoder.encode_descriptor(&full, &decl.help, None, metric_type)?;
            for (labels, value) in values {
                let labels: Vec<(String, String)> = decl
                    .labels
                    .iter()
                    .cloned()
                    .zip(labels.iter().cloned())
                    .collect();
                let metric = family.encode_family(&labels)?;
                match (value, decl.kind) {
                    (Value::Number(n), Kind::Counter) => ConstCounter::new(*n).encode(metric)?,
                    (Value::Number(n), _) => ConstGauge::new(*n).encode(metric)?,
                    (Value::Histogram { counts, sum, count }, _) => {
                        // Per bucket (the encoder sums them up); the last one is +Inf.
                        let buckets: Vec<(f64, u64)> = counts
                            .iter()
                            .enumerate()
                            .map(|(i, c)| {
                                (decl.buckets.get(i).copied().unwrap_or(f64::INFINITY), *c)
                            })
                            .collect();
                        let mut metric = metric;
                        metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            *sum, *count, &buckets, None,
                        )?
                    }
                }
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
    fn plugins(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<PluginMetrics>>> {
        self.plugins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Exports `metrics` for `plugin`, in place of what it exported before (a new version).
    pub fn insert(&self, plugin: &str, metrics: Arc<PluginMetrics>) {
        self.plugins().insert(plugin.to_string(), metrics);
    }

    /// Stops exporting `plugin`'s metrics.
    pub fn forget(&self, plugin: &str) {
        self.plugins().remove(plugin);
    }
}

impl Collector for PluginMetricsSet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let plugins: Vec<Arc<PluginMetrics>> = self.plugins().values().cloned().collect();
        for p in &plugins {
            p.encode(&mut encoder)?;
        }
        // One family for every plugin's refusals (a family twice is an invalid page).
        let refused: Vec<(String, &'static str, u64)> = plugins
            .iter()
            .flat_map(|p| {
                p.refused()
                    .into_iter()
                    .map(|(reason, n)| (p.plugin.clone(), reason, n))
                    .collect::<Vec<_>>()
            })
            .collect();
        if !refused.is_empty() {
            let mut family = encoder.encode_descriptor(
                "wcm_plugin_metric_updates_refused",
                "Metric updates of a plugin refused by the host, by reason.",
                None,
                MetricType::Counter,
            )?;
            for (plugin, reason, n) in refused {
                let labels = vec![
                    ("plugin".to_string(), plugin),
                    ("reason".to_string(), reason.to_string()),
                ];
                let metric = family.encode_family(&labels)?;
                ConstCounter::new(n).encode(metric)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(name: &str, kind: MetricKind, labels: &[&str], buckets: &[f64]) -> Metric {
        Metric {
            name: name.into(),
            help: "help".into(),
            kind,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            buckets: buckets.to_vec(),
        }
    }

    #[test]
    fn exposition_has_the_prefix_escaped_label_values_and_goes_with_the_plugin() {
        let set = PluginMetricsSet::default();
        let m = Arc::new(PluginMetrics::new(
            "my-plugin",
            &[
                metric("reconciles", MetricKind::Counter, &["result"], &[]),
                metric("took", MetricKind::Histogram, &[], &[0.1, 1.0]),
            ],
            100,
        ));
        set.insert("my-plugin", m.clone());
        m.update(Update::Add, "reconciles", &["o\"k\n".into()], 2.0)
            .expect("declared");
        m.update(Update::Observe, "took", &[], 0.5)
            .expect("declared");
        assert!(
            m.update(Update::Set, "reconciles", &["x".into()], 1.0)
                .is_err()
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(set.clone()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("wcm_plugin_my_plugin__reconciles_total{result=\"o\\\"k\\n\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("wcm_plugin_my_plugin__took_bucket{le=\"1.0\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("wcm_plugin_my_plugin__took_bucket{le=\"0.1\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("wcm_plugin_my_plugin__took_bucket{le=\"+Inf\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("wcm_plugin_metric_updates_refused_total{plugin=\"my-plugin\",reason=\"wrong-kind\"} 1"),
            "{text}"
        );
        set.forget("my-plugin");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(!text.contains("my_plugin"), "{text}");
    }
}
