//! Prometheus metrics, with the names dashboards already use for controllers:
//! `workqueue_*` (label `name`) and `controller_runtime_*` (label `controller`), both set to the
//! plugin's name; plus `wcm_*` for what is particular to wasm plugins.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::engine::informer::{InformerKey, InformerObserver};
use crate::engine::queue::QueueObserver;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Name {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Ctrl {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CtrlResult {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginReason {
    plugin: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Forbidden {
    plugin: String,
    verb: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginCall {
    plugin: String,
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScheduleTick {
    plugin: String,
    schedule: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InformerLabels {
    resource: String,
    event: String,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 20))
}

/// Finer buckets (10 µs to ~2 min, ×1.5) for the time a key waits in the queue: from the watch event
/// (or resync, or retry) that added it to a worker taking it, i.e. event-to-reconcile latency.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 1.5, 40))
}

type Hist = Family<Name, Histogram, fn() -> Histogram>;
type CtrlHist = Family<Ctrl, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: std::sync::Mutex<Registry>,
    /// The plugins' own metrics (contract 0.3), encoded at each scrape.
    plugin_metrics: crate::plugin_metrics::PluginMetricsSet,
    queue_depth: Family<Name, Gauge>,
    unfinished_work: Family<Name, Gauge<f64, AtomicU64>>,
    longest_running: Family<Name, Gauge<f64, AtomicU64>>,
    queue_adds: Family<Name, Counter>,
    queue_retries: Family<Name, Counter>,
    queue_duration: Hist,
    work_duration: Hist,
    reconcile_total: Family<CtrlResult, Counter>,
    reconcile_errors: Family<Ctrl, Counter>,
    reconcile_time: CtrlHist,
    max_concurrent: Family<Ctrl, Gauge>,
    active_workers: Family<Ctrl, Gauge>,
    terminal_errors: Family<Ctrl, Counter>,
    schedule_ticks: Family<ScheduleTick, Counter>,
    changes_filtered: Family<Ctrl, Counter>,
    mapped_keys_dropped: Family<Ctrl, Counter>,
    worker_panics: Family<Ctrl, Counter>,
    instances: Family<Name, Counter>,
    plugin_failures: Family<PluginReason, Counter>,
    forbidden: Family<Forbidden, Counter>,
    invalid: Family<PluginCall, Counter>,
    waiting: Family<PluginReason, Gauge>,
    events_dropped: Family<PluginReason, Counter>,
    events_written: Family<PluginReason, Counter>,
    informer_events: Family<InformerLabels, Counter>,
    plugins_loaded: Gauge<i64, AtomicI64>,
    refused: Family<Reason, Counter>,
    leader: Family<Name, Gauge>,
    /// The label sets beyond its name each plugin's series carry, noted when a series is made, so
    /// [`Metrics::forget_plugin`] can remove every series of a removed plugin.
    extra_labels: Mutex<HashMap<String, HashSet<Extra>>>,
}

/// A series' labels besides the plugin's name; each value is one of a fixed set of words, or a
/// verb and resource the plugin declared.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Extra {
    Result(String),
    Failure(String),
    Forbidden(String, String),
    Invalid(String),
    Waiting(String),
    Dropped(String),
    Written(String),
    Tick(String, String),
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut r = Registry::default();
        let m = Metrics {
            queue_depth: Family::default(),
            unfinished_work: Family::default(),
            longest_running: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            queue_duration: Family::new_with_constructor(latency_histogram),
            work_duration: Family::new_with_constructor(seconds_histogram),
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(seconds_histogram),
            max_concurrent: Family::default(),
            active_workers: Family::default(),
            terminal_errors: Family::default(),
            schedule_ticks: Family::default(),
            changes_filtered: Family::default(),
            mapped_keys_dropped: Family::default(),
            worker_panics: Family::default(),
            instances: Family::default(),
            plugin_failures: Family::default(),
            forbidden: Family::default(),
            invalid: Family::default(),
            waiting: Family::default(),
            events_dropped: Family::default(),
            events_written: Family::default(),
            informer_events: Family::default(),
            plugins_loaded: Gauge::default(),
            refused: Family::default(),
            leader: Family::default(),
            extra_labels: Mutex::default(),
            registry: std::sync::Mutex::new(Registry::default()),
            plugin_metrics: Default::default(),
        };
        r.register_collector(Box::new(m.plugin_metrics.clone()));
        r.register(
            "workqueue_depth",
            "Current depth of the work queue",
            m.queue_depth.clone(),
        );
        r.register(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress not yet observed by work_duration (large values: stuck workers)",
            m.unfinished_work.clone(),
        );
        r.register(
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest-running processor of the queue has been running",
            m.longest_running.clone(),
        );
        r.register(
            "workqueue_adds",
            "Total adds handled by the work queue",
            m.queue_adds.clone(),
        );
        r.register(
            "workqueue_retries",
            "Total retries handled by the work queue",
            m.queue_retries.clone(),
        );
        r.register(
            "workqueue_queue_duration_seconds",
            "How long an item stays in the queue before it is taken",
            m.queue_duration.clone(),
        );
        r.register(
            "workqueue_work_duration_seconds",
            "How long processing an item takes",
            m.work_duration.clone(),
        );
        r.register(
            "controller_runtime_reconcile",
            "Total reconciliations per controller and result",
            m.reconcile_total.clone(),
        );
        r.register(
            "controller_runtime_reconcile_errors",
            "Total reconciliation errors per controller",
            m.reconcile_errors.clone(),
        );
        r.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            m.reconcile_time.clone(),
        );
        r.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            m.max_concurrent.clone(),
        );
        r.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            m.active_workers.clone(),
        );
        r.register(
            "wcm_plugin_instances",
            "Instances made of a plugin (one per call by default; once per worker with isolation = \"worker\")",
            m.instances.clone(),
        );
        r.register(
            "wcm_worker_panics",
            "Reconciles during which the host panicked; the key was retried and the worker went on",
            m.worker_panics.clone(),
        );
        r.register(
            "wcm_mapped_keys_dropped",
            "Primary keys a change mapped to past the cap of 32 per change (any-owner and label mappings): not queued",
            m.mapped_keys_dropped.clone(),
        );
        r.register(
            "wcm_changes_filtered",
            "Updates skipped by the plugin's change filters: reconciles saved",
            m.changes_filtered.clone(),
        );
        r.register(
            "wcm_schedule_ticks",
            "Ticks of a plugin's schedules that enqueued keys, by kind (tick, catch-up)",
            m.schedule_ticks.clone(),
        );
        r.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total terminal reconciliation errors per controller",
            m.terminal_errors.clone(),
        );
        r.register(
            "wcm_plugin_call_failures",
            "Calls into a plugin that trapped or broke a limit, by reason",
            m.plugin_failures.clone(),
        );
        r.register(
            "wcm_forbidden_host_calls",
            "API calls a plugin made without declaring the permission",
            m.forbidden.clone(),
        );
        r.register(
            "wcm_invalid_host_calls",
            "Host calls refused because a value from the plugin was invalid (name, namespace, kind, selector, event field)",
            m.invalid.clone(),
        );
        r.register(
            "wcm_plugin_waiting",
            "1 while a plugin waits to start, by reason (e.g. its identity may not list and watch what it declared)",
            m.waiting.clone(),
        );
        r.register(
            "wcm_events_dropped",
            "Events not written, by reason",
            m.events_dropped.clone(),
        );
        r.register(
            "wcm_events_written",
            "Event writes to the API server (create or series update)",
            m.events_written.clone(),
        );
        r.register(
            "wcm_informer_events",
            "Watch events seen by informers",
            m.informer_events.clone(),
        );
        r.register(
            "wcm_plugins_loaded",
            "Plugins currently running",
            m.plugins_loaded.clone(),
        );
        r.register(
            "wcm_plugins_refused",
            "Plugin files refused, by reason, once per content (`watch_budget`: the plugin needs more list+watch streams than its budget)",
            m.refused.clone(),
        );
        r.register(
            "leader_election_master_status",
            "1 while this replica holds the Lease `name` and may reconcile, else 0",
            m.leader.clone(),
        );
        *m.registry.lock().unwrap_or_else(|p| p.into_inner()) = r;
        Arc::new(m)
    }

    /// Where running plugins' own metrics are exported.
    pub fn plugin_metrics(&self) -> &crate::plugin_metrics::PluginMetricsSet {
        &self.plugin_metrics
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
            out.clear();
        }
        out
    }

    pub fn queue_observer(self: &Arc<Self>, plugin: &str) -> Arc<dyn QueueObserver> {
        Arc::new(PluginQueue {
            m: self.clone(),
            name: Name {
                name: plugin.to_string(),
            },
        })
    }

    pub fn workers(&self, plugin: &str, max: u32) {
        self.max_concurrent
            .get_or_create(&ctrl(plugin))
            .set(i64::from(max));
    }

    /// Keys one change mapped to past the cap, not queued.
    pub fn mapped_keys_dropped(&self, plugin: &str, n: usize) {
        self.mapped_keys_dropped
            .get_or_create(&ctrl(plugin))
            .inc_by(n as u64);
    }

    pub fn change_filtered(&self, plugin: &str) {
        self.changes_filtered.get_or_create(&ctrl(plugin)).inc();
    }

    /// The queue's work in progress (refreshed every half second, as client-go does).
    pub fn unfinished_work(&self, plugin: &str, (sum, longest): (f64, f64)) {
        let name = Name {
            name: plugin.to_string(),
        };
        self.unfinished_work.get_or_create(&name).set(sum);
        self.longest_running.get_or_create(&name).set(longest);
    }

    pub fn instantiated(&self, plugin: &str) {
        self.instances
            .get_or_create(&Name {
                name: plugin.to_string(),
            })
            .inc();
    }

    pub fn worker_panic(&self, plugin: &str) {
        self.worker_panics.get_or_create(&ctrl(plugin)).inc();
    }

    pub fn reset_active_workers(&self, plugin: &str) {
        self.active_workers.get_or_create(&ctrl(plugin)).set(0);
    }

    pub fn active_workers(&self, plugin: &str, delta: i64) {
        self.active_workers
            .get_or_create(&ctrl(plugin))
            .inc_by(delta);
    }

    pub fn reconciled(&self, plugin: &str, result: &str, took: Duration) {
        let labels = CtrlResult {
            controller: plugin.into(),
            result: result.into(),
        };
        self.noted(&self.reconcile_total, &labels, plugin, || {
            Extra::Result(result.into())
        })
        .inc();
        if result == "error" {
            self.reconcile_errors.get_or_create(&ctrl(plugin)).inc();
        }
        self.reconcile_time
            .get_or_create(&ctrl(plugin))
            .observe(took.as_secs_f64());
        self.work_duration
            .get_or_create(&Name {
                name: plugin.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// A schedule's tick (`kind`: "tick" or "catch-up") enqueued its keys.
    pub fn schedule_tick(&self, plugin: &str, schedule: &str, kind: &str) {
        let labels = ScheduleTick {
            plugin: plugin.into(),
            schedule: schedule.into(),
            kind: kind.into(),
        };
        self.noted(&self.schedule_ticks, &labels, plugin, || {
            Extra::Tick(schedule.into(), kind.into())
        })
        .inc();
    }

    pub fn terminal_error(&self, plugin: &str) {
        self.terminal_errors.get_or_create(&ctrl(plugin)).inc();
    }

    pub fn plugin_failure(&self, plugin: &str, reason: &str) {
        let labels = PluginReason {
            plugin: plugin.into(),
            reason: reason.into(),
        };
        self.noted(&self.plugin_failures, &labels, plugin, || {
            Extra::Failure(reason.into())
        })
        .inc();
    }

    pub fn forbidden_call(&self, plugin: &str, verb: &str, resource: &str) {
        let labels = Forbidden {
            plugin: plugin.into(),
            verb: verb.into(),
            resource: resource.into(),
        };
        self.noted(&self.forbidden, &labels, plugin, || {
            Extra::Forbidden(verb.into(), resource.into())
        })
        .inc();
    }

    /// `call` is one of a fixed set (an RBAC verb, "cache.get", "event", ...), never a guest string.
    pub fn invalid_call(&self, plugin: &str, call: &str) {
        let labels = PluginCall {
            plugin: plugin.into(),
            call: call.into(),
        };
        self.noted(&self.invalid, &labels, plugin, || {
            Extra::Invalid(call.into())
        })
        .inc();
    }

    /// Marks `plugin` as waiting for `reason`, one of `reasons` (fixed words), or not waiting when
    /// `reason` is None: every reason's series is set, so the one that ended goes to 0.
    pub fn plugin_waiting<'a>(
        &self,
        plugin: &str,
        reasons: impl IntoIterator<Item = &'a str>,
        reason: Option<&str>,
    ) {
        for r in reasons {
            let labels = PluginReason {
                plugin: plugin.into(),
                reason: r.into(),
            };
            self.noted(&self.waiting, &labels, plugin, || Extra::Waiting(r.into()))
                .set(i64::from(reason == Some(r)));
        }
    }

    pub fn event_dropped(&self, plugin: &str, reason: &str) {
        let labels = PluginReason {
            plugin: plugin.into(),
            reason: reason.into(),
        };
        self.noted(&self.events_dropped, &labels, plugin, || {
            Extra::Dropped(reason.into())
        })
        .inc();
    }

    pub fn event_written(&self, plugin: &str, kind: &str) {
        let labels = PluginReason {
            plugin: plugin.into(),
            reason: kind.into(),
        };
        self.noted(&self.events_written, &labels, plugin, || {
            Extra::Written(kind.into())
        })
        .inc();
    }

    pub fn plugins_loaded(&self, n: usize) {
        self.plugins_loaded.set(n as i64);
    }

    /// A plugin file refused for `reason` (a fixed word, never the plugin's text).
    pub fn plugin_refused(&self, reason: &'static str) {
        self.refused
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }

    /// Whether this replica leads on Lease `lease` (client-go's `leader_election_master_status`).
    pub fn leader(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&Name {
                name: lease.to_string(),
            })
            .set(i64::from(leading));
    }

    /// Removes the series of Lease `lease`, once its election is gone for good (a plugin that
    /// stopped), so `/metrics` does not keep a series per plugin that ever ran.
    pub fn forget_leader(&self, lease: &str) {
        self.leader.remove(&Name {
            name: lease.to_string(),
        });
    }

    /// The series of `labels` in `family`; made on first use, and then noted against `plugin`
    /// (its labels beyond the name, `extra`) so [`Metrics::forget_plugin`] can remove it.
    fn noted<'f, S, M, C>(
        &self,
        family: &'f Family<S, M, C>,
        labels: &S,
        plugin: &str,
        extra: impl FnOnce() -> Extra,
    ) -> impl std::ops::Deref<Target = M> + 'f
    where
        S: Clone + std::hash::Hash + Eq,
        C: MetricConstructor<M>,
    {
        if family.get(labels).is_none() {
            self.extra_labels
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(plugin.to_string())
                .or_default()
                .insert(extra());
        }
        family.get_or_create(labels)
    }

    /// Removes every series of `plugin` (it was removed): a dashboard no longer shows it, and the
    /// host's memory does not keep the series of every plugin that ever ran.
    pub fn forget_plugin(&self, plugin: &str) {
        self.plugin_metrics.forget(plugin);
        let name = Name {
            name: plugin.to_string(),
        };
        self.queue_depth.remove(&name);
        self.unfinished_work.remove(&name);
        self.longest_running.remove(&name);
        self.queue_adds.remove(&name);
        self.queue_retries.remove(&name);
        self.queue_duration.remove(&name);
        self.work_duration.remove(&name);
        self.instances.remove(&name);
        let c = ctrl(plugin);
        for family in [
            &self.reconcile_errors,
            &self.terminal_errors,
            &self.changes_filtered,
            &self.mapped_keys_dropped,
            &self.worker_panics,
        ] {
            family.remove(&c);
        }
        self.max_concurrent.remove(&c);
        self.active_workers.remove(&c);
        self.reconcile_time.remove(&c);
        let extras = self
            .extra_labels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(plugin)
            .unwrap_or_default();
        let reason = |r: &str| PluginReason {
            plugin: plugin.into(),
            reason: r.into(),
        };
        for extra in extras {
            match extra {
                Extra::Result(r) => {
                    self.reconcile_total.remove(&CtrlResult {
                        controller: plugin.into(),
                        result: r,
                    });
                }
                Extra::Failure(r) => {
                    self.plugin_failures.remove(&reason(&r));
                }
                Extra::Forbidden(verb, resource) => {
                    self.forbidden.remove(&Forbidden {
                        plugin: plugin.into(),
                        verb,
                        resource,
                    });
                }
                Extra::Invalid(call) => {
                    self.invalid.remove(&PluginCall {
                        plugin: plugin.into(),
                        call,
                    });
                }
                Extra::Waiting(r) => {
                    self.waiting.remove(&reason(&r));
                }
                Extra::Dropped(r) => {
                    self.events_dropped.remove(&reason(&r));
                }
                Extra::Written(r) => {
                    self.events_written.remove(&reason(&r));
                }
                Extra::Tick(schedule, kind) => {
                    self.schedule_ticks.remove(&ScheduleTick {
                        plugin: plugin.into(),
                        schedule,
                        kind,
                    });
                }
            }
        }
    }
}

fn ctrl(plugin: &str) -> Ctrl {
    Ctrl {
        controller: plugin.to_string(),
    }
}

struct PluginQueue {
    m: Arc<Metrics>,
    name: Name,
}

impl QueueObserver for PluginQueue {
    fn added(&self) {
        self.m.queue_adds.get_or_create(&self.name).inc();
    }
    fn depth(&self, depth: usize) {
        self.m
            .queue_depth
            .get_or_create(&self.name)
            .set(depth as i64);
    }
    fn retried(&self) {
        self.m.queue_retries.get_or_create(&self.name).inc();
    }
    fn queued_for(&self, d: Duration) {
        self.m
            .queue_duration
            .get_or_create(&self.name)
            .observe(d.as_secs_f64());
    }
}

impl InformerObserver for Metrics {
    fn event(&self, informer: &InformerKey, kind: &'static str) {
        self.informer_events
            .get_or_create(&InformerLabels {
                resource: informer.plural.clone(),
                event: kind.into(),
            })
            .inc();
    }
    fn watch_error(&self, informer: &InformerKey) {
        self.informer_events
            .get_or_create(&InformerLabels {
                resource: informer.plural.clone(),
                event: "error".into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series_of(m: &Metrics, plugin: &str) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.contains(&format!("=\"{plugin}\"")))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_forgotten_plugin_leaves_no_series_and_the_others_keep_theirs() {
        let m = Metrics::new();
        for p in ["gone", "kept"] {
            m.reconciled(p, "success", Duration::from_millis(1));
            m.reconciled(p, "error", Duration::from_millis(1));
            m.workers(p, 2);
            m.active_workers(p, 1);
            m.unfinished_work(p, (0.5, 0.5));
            m.plugin_failure(p, "trap");
            m.forbidden_call(p, "get", "secrets");
            m.invalid_call(p, "event");
            m.plugin_waiting(p, ["forbidden", "not_served"], Some("forbidden"));
            m.event_dropped(p, "spam_filter");
            m.event_written(p, "create");
            m.change_filtered(p);
            m.mapped_keys_dropped(p, 3);
            m.worker_panic(p);
            m.terminal_error(p);
            m.instantiated(p);
            let q = m.queue_observer(p);
            q.added();
            q.depth(1);
            q.retried();
            q.queued_for(Duration::from_millis(1));
        }
        let before = series_of(&m, "gone").len();
        assert!(before > 20, "only {before} series recorded");
        m.forget_plugin("gone");
        assert_eq!(series_of(&m, "gone"), Vec::<String>::new());
        assert_eq!(series_of(&m, "kept").len(), before);
    }
}
