//! Cron schedules a plugin declares (contract 0.3).
//!
//! Each tick enqueues a key (the one the schedule names, or every primary object in the cache)
//! on the leading replica only; the reconcile sees which schedule it was in
//! [`Request::scheduled`](crate::Request::scheduled). The fields are read in the schedule's IANA
//! time zone (UTC when none): a local time a daylight-saving change skips ticks at the first
//! instant after the gap, one it repeats ticks once. After a time when no replica led (or no
//! host ran), the latest missed tick runs once if it is at most `catch_up` old; earlier missed
//! ticks are not run.
//!
//! ```
//! use std::time::Duration;
//! use wcm_sdk::{Description, ObjectKey, Schedule, Watch};
//! use wcm_sdk::k8s_openapi::api::core::v1::ConfigMap;
//!
//! let d = Description::new("rotator", "1.0.0")
//!     .primary(Watch::of::<ConfigMap>())
//!     .schedule(
//!         Schedule::cron("nightly", "0 3 * * *")
//!             .time_zone("Europe/Berlin")
//!             .key(ObjectKey::namespaced("ops", "keys"))
//!             .jitter(Duration::from_secs(60))
//!             .catch_up(Duration::from_secs(6 * 3600)),
//!     );
//! assert!(d.validate().is_ok());
//! ```

use std::time::Duration;

use crate::types::ObjectKey;

/// A cron schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// A DNS label, unique within the plugin.
    pub name: String,
    /// Five fields (minute hour day-of-month month day-of-week) or `@hourly`, `@daily`, ….
    pub cron: String,
    /// An IANA time zone name; `None`: UTC.
    pub time_zone: Option<String>,
    /// The key each tick enqueues; `None`: every primary object in the cache.
    pub key: Option<ObjectKey>,
    /// Each tick is delayed by a random 0..=this many seconds (at most 3600).
    pub jitter_seconds: u32,
    /// The latest tick missed while nothing ran runs once if at most this old (at most 86400);
    /// 0: missed ticks are skipped.
    pub catch_up_seconds: u32,
}

impl Schedule {
    /// A schedule named `name` (a DNS label) on `cron`.
    pub fn cron(name: &str, cron: &str) -> Self {
        Schedule {
            name: name.into(),
            cron: cron.into(),
            time_zone: None,
            key: None,
            jitter_seconds: 0,
            catch_up_seconds: 0,
        }
    }

    /// Reads the fields in this IANA time zone ("Europe/Berlin").
    pub fn time_zone(mut self, tz: &str) -> Self {
        self.time_zone = Some(tz.into());
        self
    }

    /// Enqueues this key at each tick (instead of every primary object).
    pub fn key(mut self, key: ObjectKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Delays each tick by a random time up to `max` (whole seconds).
    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter_seconds = u32::try_from(max.as_secs()).unwrap_or(u32::MAX);
        self
    }

    /// Runs the latest missed tick once after downtime if it is at most `window` old.
    pub fn catch_up(mut self, window: Duration) -> Self {
        self.catch_up_seconds = u32::try_from(window.as_secs()).unwrap_or(u32::MAX);
        self
    }

    /// What the host checks at load time: the cron fields and time zone are parsed natively (in
    /// unit tests); a plugin's wasm build checks the rest and leaves those to the host.
    pub(crate) fn check(schedules: &[Schedule]) -> Result<(), String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let decls: Vec<_> = schedules
                .iter()
                .map(|s| wcm_rules::schedules::Decl {
                    name: s.name.clone(),
                    cron: s.cron.clone(),
                    time_zone: s.time_zone.clone(),
                    key: s
                        .key
                        .as_ref()
                        .map(|k| (k.namespace.clone(), k.name.clone())),
                    jitter_seconds: s.jitter_seconds,
                    catch_up_seconds: s.catch_up_seconds,
                })
                .collect();
            wcm_rules::schedules::declarations(&decls)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = schedules;
            Ok(())
        }
    }
}
