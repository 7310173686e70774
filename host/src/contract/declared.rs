//! Checks of what contract 0.3 adds to a description: the plugin's metrics and its schedules.
//! A description that fails is refused at load, with the first problem in words.

use std::collections::HashSet;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::validate::{self, Invalid, shown};
use super::{Metric, MetricKind, Schedule};

/// Metrics a plugin may declare.
pub const MAX_METRICS: usize = 32;
/// Label names per metric.
pub const MAX_LABELS: usize = 8;
/// Bucket bounds per histogram.
pub const MAX_BUCKETS: usize = 32;
/// Schedules a plugin may declare.
pub const MAX_SCHEDULES: usize = 8;
/// The most a tick may be delayed at random, seconds.
pub const MAX_JITTER_SECONDS: u32 = 3600;
/// The oldest missed tick that may still run after downtime, seconds.
pub const MAX_CATCH_UP_SECONDS: u32 = 86_400;

/// A metric or label name: 1–64 of `[a-z0-9_]`, starting with a letter.
fn metric_word(what: &'static str, s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            what,
            s,
            "must be 1-64 lowercase letters, digits and '_', starting with a letter",
        ))
    }
}

/// Checks a plugin's metric declarations.
pub fn metrics(metrics: &[Metric]) -> Result<(), String> {
    if metrics.len() > MAX_METRICS {
        return Err(format!(
            "declares {} metrics; at most {MAX_METRICS}",
            metrics.len()
        ));
    }
    let mut seen = HashSet::new();
    for m in metrics {
        metric_word("metric name", &m.name).map_err(|e| e.to_string())?;
        let named = shown(&m.name);
        if m.kind == MetricKind::Counter && m.name.ends_with("_total") {
            return Err(format!(
                "counter {named}: the host adds `_total`; declare the name without it"
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
            metric_word("label name", l).map_err(|e| e.to_string())?;
            if l == "plugin" || l == "le" || !names.insert(l.as_str()) {
                return Err(format!(
                    "metric {named}: label {} is reserved or repeated",
                    shown(l)
                ));
            }
        }
        if m.kind != MetricKind::Histogram && !m.buckets.is_empty() {
            return Err(format!("metric {named}: only a histogram has buckets"));
        }
        if m.buckets.len() > MAX_BUCKETS {
            return Err(format!(
                "metric {named}: {} buckets; at most {MAX_BUCKETS}",
                m.buckets.len()
            ));
        }
        if m.buckets.iter().any(|b| !b.is_finite()) || m.buckets.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(format!(
                "metric {named}: buckets must be finite and increasing"
            ));
        }
    }
    Ok(())
}

/// A schedule's cron fields: five (minute hour day-of-month month day-of-week) or a shorthand;
/// no seconds, no years.
pub fn cron(pattern: &str) -> Result<Cron, String> {
    if pattern.len() > 128 {
        return Err(format!("cron {} is longer than 128 bytes", shown(pattern)));
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(pattern)
        .map_err(|e| format!("cron {}: {e}", shown(pattern)))
}

/// A schedule's time zone: an IANA name the host's bundled tz database knows; none is UTC.
pub fn time_zone(tz: Option<&str>) -> Result<jiff::tz::TimeZone, String> {
    match tz {
        None => Ok(jiff::tz::TimeZone::UTC),
        Some(name) if name.len() <= 64 => jiff::tz::TimeZone::get(name)
            .map_err(|_| format!("time zone {} is not an IANA time zone name", shown(name))),
        Some(name) => Err(format!("time zone {} is too long", shown(name))),
    }
}

/// Checks a plugin's schedules.
pub fn schedules(schedules: &[Schedule]) -> Result<(), String> {
    if schedules.len() > MAX_SCHEDULES {
        return Err(format!(
            "declares {} schedules; at most {MAX_SCHEDULES}",
            schedules.len()
        ));
    }
    let mut seen = HashSet::new();
    for s in schedules {
        validate::namespace(&s.name)
            .map_err(|_| format!("schedule name {} must be a DNS label", shown(&s.name)))?;
        if !seen.insert(s.name.as_str()) {
            return Err(format!("schedule {} declared twice", shown(&s.name)));
        }
        let named = shown(&s.name);
        cron(&s.cron).map_err(|e| format!("schedule {named}: {e}"))?;
        time_zone(s.time_zone.as_deref()).map_err(|e| format!("schedule {named}: {e}"))?;
        if let Some(k) = &s.key {
            validate::object_key(k).map_err(|e| format!("schedule {named}: a key has an {e}"))?;
        }
        if s.jitter_seconds > MAX_JITTER_SECONDS {
            return Err(format!(
                "schedule {named}: jitter of {} s; at most {MAX_JITTER_SECONDS}",
                s.jitter_seconds
            ));
        }
        if s.catch_up_seconds > MAX_CATCH_UP_SECONDS {
            return Err(format!(
                "schedule {named}: catch-up of {} s; at most {MAX_CATCH_UP_SECONDS}",
                s.catch_up_seconds
            ));
        }
    }
    Ok(())
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
    fn metric_declarations_are_refused_with_a_reason() {
        let ok = [decl("reconciles", MetricKind::Counter, &["result"])];
        assert!(metrics(&ok).is_ok());
        for bad in [
            decl("Bad", MetricKind::Gauge, &[]),
            decl("x_total", MetricKind::Counter, &[]),
            decl("x", MetricKind::Gauge, &["le"]),
            decl("x", MetricKind::Gauge, &["a", "a"]),
            decl("x", MetricKind::Gauge, &["a\nb"]),
            Metric {
                buckets: vec![1.0],
                ..decl("g", MetricKind::Gauge, &[])
            },
            Metric {
                buckets: vec![2.0, 1.0],
                ..decl("h", MetricKind::Histogram, &[])
            },
            Metric {
                help: "two\nlines".into(),
                ..decl("h", MetricKind::Histogram, &[])
            },
        ] {
            assert!(metrics(std::slice::from_ref(&bad)).is_err(), "{bad:?} passed");
        }
        let twice = [
            decl("a", MetricKind::Gauge, &[]),
            decl("a", MetricKind::Counter, &[]),
        ];
        assert!(metrics(&twice).is_err());
    }

    fn schedule(name: &str, cron: &str, tz: Option<&str>) -> Schedule {
        Schedule {
            name: name.into(),
            cron: cron.into(),
            time_zone: tz.map(str::to_string),
            key: None,
            jitter_seconds: 0,
            catch_up_seconds: 0,
        }
    }

    #[test]
    fn schedules_take_five_fields_or_a_shorthand_in_an_iana_zone() {
        let ok = [
            schedule("a", "*/1 * * * *", None),
            schedule("b", "0 3 * * mon-fri", Some("Europe/Berlin")),
            schedule("c", "@hourly", Some("UTC")),
        ];
        assert_eq!(schedules(&ok), Ok(()));
        for bad in [
            schedule("x", "* * * * * *", None),
            schedule("x", "61 * * * *", None),
            schedule("x", "nonsense", None),
            schedule("x", "* * * * *", Some("Mars/Olympus")),
            schedule("x", "* * * * *", Some("../../etc/passwd")),
            schedule("Not-A-Label", "* * * * *", None),
            Schedule {
                jitter_seconds: 3601,
                ..schedule("x", "* * * * *", None)
            },
            Schedule {
                catch_up_seconds: 86_401,
                ..schedule("x", "* * * * *", None)
            },
        ] {
            assert!(schedules(std::slice::from_ref(&bad)).is_err(), "{bad:?} passed");
        }
        assert!(schedules(&[schedule("a", "@daily", None), schedule("a", "@daily", None)]).is_err());
    }
}
