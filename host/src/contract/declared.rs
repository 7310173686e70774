//! Checks of what contract 0.3 adds to a description: the plugin's metrics and its schedules,
//! by the rules shared with the SDK's MockHost (`wcm_rules`). A description that fails is
//! refused at load, with the first problem in words.

use super::{Metric, Schedule};

/// A schedule of the contract as the shared rules take it.
pub fn schedule(s: &Schedule) -> wcm_rules::schedules::Decl {
    wcm_rules::schedules::Decl {
        name: s.name.clone(),
        cron: s.cron.clone(),
        time_zone: s.time_zone.clone(),
        key: s
            .key
            .as_ref()
            .map(|k| (k.namespace.clone(), k.name.clone())),
        jitter_seconds: s.jitter_seconds,
        catch_up_seconds: s.catch_up_seconds,
    }
}

/// Checks a plugin's metric declarations.
pub fn metrics(metrics: &[Metric]) -> Result<(), String> {
    let decls: Vec<_> = metrics.iter().map(crate::plugin_metrics::decl).collect();
    wcm_rules::metrics::declarations(&decls)
}

/// Checks a plugin's schedules.
pub fn schedules(schedules: &[Schedule]) -> Result<(), String> {
    let decls: Vec<_> = schedules.iter().map(schedule).collect();
    wcm_rules::schedules::declarations(&decls)
}
