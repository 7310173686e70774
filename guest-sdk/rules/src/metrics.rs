//! A plugin's own metrics (contract 0.3): the rules of its declarations and of each update, and
//! the values with the plugin's series budget. The host exports these values on `/metrics`;
//! MockHost keeps them for a unit test to read.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::names::shown;

/// Metrics a plugin may declare.
pub const MAX_METRICS: usize = 32;
/// Label names per metric.
pub const MAX_LABELS: usize = 8;
/// Bucket bounds per histogram.
pub const MAX_BUCKETS: usize = 32;
/// Bytes of one label value.
pub const MAX_LABEL_VALUE: usize = 128;
/// The series budget of a plugin unless the operator says otherwise.
pub const DEFAULT_MAX_SERIES: usize = 1000;
/// Prometheus' default buckets, for a histogram declared without any.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A declared metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Decl {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub labels: Vec<String>,
    pub buckets: Vec<f64>,
}

/// A metric or label name: 1–64 of `[a-z0-9_]`, starting with a letter.
fn metric_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Checks a plugin's declarations; the first problem, in words.
pub fn declarations(metrics: &[Decl]) -> Result<(), String> {
    if metrics.len() > MAX_METRICS {
        return Err(format!(
            "declares {} metrics; at most {MAX_METRICS}",
            metrics.len()
        ));
    }
    let mut seen = HashSet::new();
    for m in metrics {
        let named = shown(&m.name);
        if !metric_word(&m.name) {
            return Err(format!(
                "metric name {named} must be 1-64 lowercase letters, digits and '_', starting with a letter"
            ));
        }
        if m.name.contains("__") {
            return Err(format!(
                "metric {named}: `__` separates the plugin's name from the metric's in the exported name; a metric name holds none"
            ));
        }
        if let Some(suffix) = ["_total", "_count", "_sum", "_bucket", "_created", "_info"]
            .iter()
            .find(|s| m.name.ends_with(*s))
        {
            return Err(format!(
                "metric {named}: a name ending in `{suffix}` would read as a series of another metric (the host adds the suffixes)"
            ));
        }
        if !seen.insert(m.name.as_str()) {
            return Err(format!("metric {named} declared twice"));
        }
        if m.help.len() > 200 || m.help.chars().any(char::is_control) {
            return Err(format!(
                "metric {named}: help must be one line of at most 200 characters"
            ));
        }
        if m.labels.len() > MAX_LABELS {
            return Err(format!(
                "metric {named}: {} labels; at most {MAX_LABELS}",
                m.labels.len()
            ));
        }
        let mut names = HashSet::new();
        for l in &m.labels {
            if !metric_word(l) || l == "plugin" || l == "le" || !names.insert(l.as_str()) {
                return Err(format!(
                    "metric {named}: label {} must be 1-64 lowercase letters, digits and '_', not `plugin` or `le`, and not repeated",
                    shown(l)
                ));
            }
        }
        if m.kind != Kind::Histogram && !m.buckets.is_empty() {
            return Err(format!("metric {named}: only a histogram has buckets"));
        }
        if m.buckets.len() > MAX_BUCKETS {
            return Err(format!(
                "metric {named}: {} buckets; at most {MAX_BUCKETS}",
                m.buckets.len()
            ));
        }
        if m.buckets.iter().any(|b| !b.is_finite()) || m.buckets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "metric {named}: buckets must be finite and increasing"
            ));
        }
    }
    Ok(())
}

/// Why an update was refused: the `reason` label of the host's refusal counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// One series' value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    Histogram {
        /// Per bucket (not cumulative), the last one for +Inf.
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

/// A plugin's metrics: its declarations and every series' value, within its series budget.
#[derive(Debug, Clone)]
pub struct Series {
    decls: BTreeMap<String, Decl>,
    max_series: usize,
    values: HashMap<String, BTreeMap<Vec<String>, Value>>,
    total: usize,
    refused: BTreeMap<Refusal, u64>,
}

impl Series {
    /// For checked declarations ([`declarations`]); a histogram without buckets gets
    /// [`DEFAULT_BUCKETS`].
    pub fn new(decls: &[Decl], max_series: usize) -> Self {
        let decls = decls
            .iter()
            .map(|d| {
                let mut d = d.clone();
                if d.kind == Kind::Histogram && d.buckets.is_empty() {
                    d.buckets = DEFAULT_BUCKETS.to_vec();
                }
                (d.name.clone(), d)
            })
            .collect();
        Series {
            decls,
            max_series,
            values: HashMap::new(),
            total: 0,
            refused: BTreeMap::new(),
        }
    }

    /// Applies an update, or refuses it (counted by reason).
    pub fn update(
        &mut self,
        update: Update,
        name: &str,
        labels: &[String],
        value: f64,
    ) -> Result<(), (Refusal, String)> {
        let out = self.apply(update, name, labels, value);
        if let Err((refusal, _)) = &out {
            *self.refused.entry(*refusal).or_default() += 1;
        }
        out
    }

    fn apply(
        &mut self,
        update: Update,
        name: &str,
        labels: &[String],
        value: f64,
    ) -> Result<(), (Refusal, String)> {
        let Some(decl) = self.decls.get(name) else {
            return Err((
                Refusal::UnknownMetric,
                format!("metric {} is not declared", shown(name)),
            ));
        };
        let fits = matches!(
            (decl.kind, update),
            (Kind::Counter, Update::Add)
                | (Kind::Gauge, Update::Add | Update::Set)
                | (Kind::Histogram, Update::Observe)
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
                    shown(v)
                ),
            ));
        }
        if !value.is_finite() || (decl.kind == Kind::Counter && value < 0.0) {
            return Err((Refusal::Value, format!("value {value} does not fit {name}")));
        }
        let buckets = decl.buckets.clone();
        let kind = decl.kind;
        // What a new series costs in the exposition: one line, or a histogram's buckets, +Inf,
        // sum and count.
        let cost = match kind {
            Kind::Histogram => buckets.len() + 3,
            _ => 1,
        };
        let full = self.total + cost > self.max_series;
        let series = self.values.entry(name.to_string()).or_default();
        if !series.contains_key(labels) {
            if full {
                return Err((
                    Refusal::SeriesBudget,
                    format!(
                        "a new series of {name} would pass the plugin's budget of {} series",
                        self.max_series
                    ),
                ));
            }
            let fresh = match kind {
                Kind::Histogram => Value::Histogram {
                    counts: vec![0; buckets.len() + 1],
                    sum: 0.0,
                    count: 0,
                },
                _ => Value::Number(0.0),
            };
            series.insert(labels.to_vec(), fresh);
            self.total += cost;
        }
        match (series.get_mut(labels), update) {
            (Some(Value::Number(n)), Update::Add) => *n += value,
            (Some(Value::Number(n)), Update::Set) => *n = value,
            (Some(Value::Histogram { counts, sum, count }), Update::Observe) => {
                let i = buckets
                    .iter()
                    .position(|b| value <= *b)
                    .unwrap_or(buckets.len());
                if let Some(c) = counts.get_mut(i) {
                    *c += 1;
                }
                *sum += value;
                *count += 1;
            }
            _ => {
                return Err((
                    Refusal::WrongKind,
                    format!("{update:?} does not apply to {name}"),
                ));
            }
        }
        Ok(())
    }

    /// The declarations, by name.
    pub fn decls(&self) -> impl Iterator<Item = &Decl> {
        self.decls.values()
    }

    /// The series of one metric: label values → value.
    pub fn values(&self, name: &str) -> Option<&BTreeMap<Vec<String>, Value>> {
        self.values.get(name)
    }

    /// One series' value.
    pub fn value(&self, name: &str, labels: &[&str]) -> Option<&Value> {
        let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        self.values.get(name)?.get(&labels)
    }

    /// Series in all (a histogram's count its buckets, +Inf, sum and count).
    pub fn total(&self) -> usize {
        self.total
    }

    /// Refusals so far, by reason.
    pub fn refused(&self) -> BTreeMap<&'static str, u64> {
        self.refused.iter().map(|(r, n)| (r.reason(), *n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(name: &str, kind: Kind, labels: &[&str]) -> Decl {
        Decl {
            name: name.into(),
            help: "help".into(),
            kind,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            buckets: vec![],
        }
    }

    #[test]
    fn declarations_are_refused_with_a_reason() {
        assert!(declarations(&[decl("reconciles", Kind::Counter, &["result"])]).is_ok());
        for bad in [
            decl("Bad", Kind::Gauge, &[]),
            decl("x_total", Kind::Counter, &[]),
            decl("x_count", Kind::Gauge, &[]),
            decl("x__y", Kind::Gauge, &[]),
            decl("x", Kind::Gauge, &["le"]),
            decl("x", Kind::Gauge, &["a", "a"]),
            decl("x", Kind::Gauge, &["a\nb"]),
            Decl {
                buckets: vec![1.0],
                ..decl("g", Kind::Gauge, &[])
            },
            Decl {
                buckets: vec![2.0, 1.0],
                ..decl("h", Kind::Histogram, &[])
            },
            Decl {
                help: "two\nlines".into(),
                ..decl("h", Kind::Histogram, &[])
            },
        ] {
            assert!(
                declarations(std::slice::from_ref(&bad)).is_err(),
                "{bad:?} passed"
            );
        }
        assert!(
            declarations(&[decl("a", Kind::Gauge, &[]), decl("a", Kind::Counter, &[])]).is_err()
        );
    }

    #[test]
    fn a_label_flood_stops_at_the_series_budget_and_is_counted() {
        let mut m = Series::new(&[decl("hits", Kind::Counter, &["who"])], 10);
        for i in 0..25 {
            let r = m.update(Update::Add, "hits", &[format!("user-{i}")], 1.0);
            assert_eq!(r.is_ok(), i < 10, "update {i}");
        }
        // An existing series still moves past the budget.
        assert!(
            m.update(Update::Add, "hits", &["user-3".into()], 1.0)
                .is_ok()
        );
        assert_eq!(m.value("hits", &["user-3"]), Some(&Value::Number(2.0)));
        assert_eq!(m.total(), 10);
        assert_eq!(m.refused().get("series-budget"), Some(&15));
    }

    #[test]
    fn updates_that_do_not_match_the_declaration_are_refused() {
        let mut m = Series::new(
            &[
                decl("c", Kind::Counter, &["a"]),
                decl("h", Kind::Histogram, &[]),
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
        for reason in [
            "unknown-metric",
            "wrong-kind",
            "label-count",
            "value",
            "label-value",
        ] {
            assert!(
                refused.contains_key(reason),
                "{reason} not counted: {refused:?}"
            );
        }
        // A histogram series costs its 11 default buckets, +Inf, sum and count.
        assert_eq!(m.total(), 14);
        // 0.2 falls in the default bucket 0.25 (index 5).
        match m.value("h", &[]) {
            Some(Value::Histogram { counts, count, .. }) => {
                assert_eq!(*count, 1);
                assert_eq!(counts[5], 1);
            }
            other => panic!("{other:?}"),
        }
    }
}
