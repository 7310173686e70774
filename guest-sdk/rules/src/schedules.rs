//! A plugin's cron schedules (contract 0.3): the rules of their declaration, and their ticks.
//!
//! Time zone rules: the fields are read in the schedule's IANA time zone (UTC when none), from
//! the tz database bundled into the host (no file of the image is read). A local time that a
//! daylight-saving change skips ticks at the first instant after the gap (03:00 when clocks jump
//! from 02:00 to 03:00); one it repeats ticks once, at its first instant (as the Open Cron
//! Pattern Specification that `croner` follows says).

use std::collections::HashSet;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use crate::names::{self, shown};

/// Schedules a plugin may declare.
pub const MAX_SCHEDULES: usize = 8;
/// The most a tick may be delayed at random, seconds.
pub const MAX_JITTER_SECONDS: u32 = 3600;
/// The oldest missed tick that may still run after downtime, seconds.
pub const MAX_CATCH_UP_SECONDS: u32 = 86_400;

/// A declared schedule, as the rules take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decl {
    pub name: String,
    pub cron: String,
    pub time_zone: Option<String>,
    /// The key's namespace and name, when the schedule names one.
    pub key: Option<(Option<String>, String)>,
    pub jitter_seconds: u32,
    pub catch_up_seconds: u32,
}

/// A schedule's cron fields: five (minute hour day-of-month month day-of-week) or a shorthand
/// (`@hourly`, …); no seconds, no years.
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

/// A schedule's time zone: an IANA name of the bundled tz database; none is UTC.
pub fn time_zone(tz: Option<&str>) -> Result<TimeZone, String> {
    match tz {
        None => Ok(TimeZone::UTC),
        Some(name) if name.len() <= 64 => TimeZone::get(name)
            .map_err(|_| format!("time zone {} is not an IANA time zone name", shown(name))),
        Some(name) => Err(format!("time zone {} is too long", shown(name))),
    }
}

/// Checks a plugin's schedules; the first problem, in words.
pub fn declarations(schedules: &[Decl]) -> Result<(), String> {
    if schedules.len() > MAX_SCHEDULES {
        return Err(format!(
            "declares {} schedules; at most {MAX_SCHEDULES}",
            schedules.len()
        ));
    }
    let mut seen = HashSet::new();
    for s in schedules {
        let named = shown(&s.name);
        if !names::dns_label(&s.name) {
            return Err(format!("schedule name {named} must be a DNS label"));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(format!("schedule {named} declared twice"));
        }
        cron(&s.cron).map_err(|e| format!("schedule {named}: {e}"))?;
        time_zone(s.time_zone.as_deref()).map_err(|e| format!("schedule {named}: {e}"))?;
        if let Some((ns, name)) = &s.key {
            let ok = names::object_name(name) && ns.as_deref().is_none_or(names::dns_label);
            if !ok {
                return Err(format!(
                    "schedule {named}: its key is not a valid object key"
                ));
            }
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

/// A checked schedule, ready to say when it ticks.
#[derive(Debug, Clone)]
pub struct Ticks {
    cron: Cron,
    tz: TimeZone,
}

impl Ticks {
    pub fn new(decl: &Decl) -> Result<Ticks, String> {
        Ok(Ticks {
            cron: cron(&decl.cron)?,
            tz: time_zone(decl.time_zone.as_deref())?,
        })
    }

    /// The first tick strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let z: Zoned = after.to_zoned(self.tz.clone());
        self.cron
            .find_next_occurrence(&z, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The latest tick at or before `at`.
    pub fn latest_at_or_before(&self, at: Timestamp) -> Option<Timestamp> {
        let z: Zoned = at.to_zoned(self.tz.clone());
        self.cron
            .find_previous_occurrence(&z, true)
            .ok()
            .map(|z| z.timestamp())
    }
}

/// The catch-up rule: after a time when no tick ran (no leading replica, no host), the latest
/// tick missed — the latest at or before `now` and after `last_run` — runs once if it is at
/// most `catch_up_seconds` old. Ticks before it are not run. With no record of a run (a schedule
/// never run), nothing is caught up.
pub fn catch_up(
    ticks: &Ticks,
    last_run: Option<Timestamp>,
    now: Timestamp,
    catch_up_seconds: u32,
) -> Option<Timestamp> {
    let last_run = last_run?;
    if catch_up_seconds == 0 {
        return None;
    }
    let missed = ticks.latest_at_or_before(now)?;
    let age = now.duration_since(missed);
    (missed > last_run && age.as_secs() <= i64::from(catch_up_seconds)).then_some(missed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(name: &str, cron: &str, tz: Option<&str>) -> Decl {
        Decl {
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
            decl("a", "*/1 * * * *", None),
            decl("b", "0 3 * * mon-fri", Some("Europe/Berlin")),
            decl("c", "@hourly", Some("UTC")),
        ];
        assert_eq!(declarations(&ok), Ok(()));
        for bad in [
            decl("x", "* * * * * *", None),
            decl("x", "61 * * * *", None),
            decl("x", "nonsense", None),
            decl("x", "* * * * *", Some("Mars/Olympus")),
            decl("x", "* * * * *", Some("../../etc/passwd")),
            decl("Not-A-Label", "* * * * *", None),
            Decl {
                jitter_seconds: 3601,
                ..decl("x", "* * * * *", None)
            },
            Decl {
                catch_up_seconds: 86_401,
                ..decl("x", "* * * * *", None)
            },
            Decl {
                key: Some((Some("Bad NS".into()), "x".into())),
                ..decl("x", "* * * * *", None)
            },
        ] {
            assert!(
                declarations(std::slice::from_ref(&bad)).is_err(),
                "{bad:?} passed"
            );
        }
        assert!(declarations(&[decl("a", "@daily", None), decl("a", "@daily", None)]).is_err());
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn ticks_follow_the_time_zone_across_daylight_saving() {
        // 02:30 every day in Berlin: on 2026-03-29 the clocks jump from 02:00 to 03:00, so that
        // day has no 02:30: it ticks at 03:00 local (01:00 UTC), once.
        let t = Ticks::new(&decl("x", "30 2 * * *", Some("Europe/Berlin"))).expect("valid");
        let next = t.next_after(ts("2026-03-28T02:00:00Z")).expect("a tick");
        assert_eq!(next, ts("2026-03-29T01:00:00Z"));
        assert_eq!(t.next_after(next), Some(ts("2026-03-30T00:30:00Z")));
        // 02:30 in Berlin on the day the clocks go back (2026-10-25) happens twice: one tick.
        let first = t.next_after(ts("2026-10-24T23:00:00Z")).expect("a tick");
        assert_eq!(first, ts("2026-10-25T00:30:00Z"));
        let again = t.next_after(first).expect("a tick");
        assert_eq!(again, ts("2026-10-26T01:30:00Z"));
        let every = Ticks::new(&decl("x", "*/1 * * * *", None)).expect("valid");
        assert_eq!(
            every.next_after(ts("2026-01-01T00:00:00Z")),
            Some(ts("2026-01-01T00:01:00Z"))
        );
    }

    #[test]
    fn only_the_latest_missed_tick_is_caught_up_and_only_within_the_window() {
        let t = Ticks::new(&decl("x", "*/10 * * * *", None)).expect("valid");
        let now = ts("2026-01-01T01:05:00Z");
        // Down since 00:12: missed 00:20 … 01:00; the latest, 01:00, is 5 min old.
        let last = Some(ts("2026-01-01T00:10:00Z"));
        assert_eq!(
            catch_up(&t, last, now, 600),
            Some(ts("2026-01-01T01:00:00Z"))
        );
        assert_eq!(catch_up(&t, last, now, 120), None, "older than the window");
        assert_eq!(catch_up(&t, last, now, 0), None, "no catch-up asked for");
        assert_eq!(catch_up(&t, None, now, 600), None, "never ran");
        // The 01:00 tick ran already: nothing to catch up.
        assert_eq!(
            catch_up(&t, Some(ts("2026-01-01T01:00:00Z")), now, 600),
            None
        );
    }
}
