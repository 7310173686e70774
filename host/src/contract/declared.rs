//! Checks of what contract 0.3 adds to a description: the plugin's metrics and its schedules.
//! A description that fails is refused at load, with the first problem in words.

use std::collections::HashSet;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::validate::{self, shown};
use super::{Metric, Schedule};

/// Schedules a plugin may declare.
pub const MAX_SCHEDULES: usize = 8;
/// The most a tick may be delayed at random, seconds.
pub const MAX_JITTER_SECONDS: u32 = 3600;
/// The oldest missed tick that may still run after downtime, seconds.
pub const MAX_CATCH_UP_SECONDS: u32 = 86_400;

/// Checks a plugin's metric declarations (the shared rules, `wcm_rules::metrics`).
pub fn metrics(metrics: &[Metric]) -> Result<(), String> {
    let decls: Vec<_> = metrics.iter().map(crate::plugin_metrics::decl).collect();
    wcm_rules::metrics::declarations(&decls)
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
            assert!(
                schedules(std::slice::from_ref(&bad)).is_err(),
                "{bad:?} passed"
            );
        }
        assert!(
            schedules(&[schedule("a", "@daily", None), schedule("a", "@daily", None)]).is_err()
        );
    }
}
