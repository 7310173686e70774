//! Event recording (events.k8s.io/v1) for plugins, with the correlation client-go does.
//!
//! Recording is in memory and never waits for the API server: `EventSink::record` correlates the
//! event under a short lock and, when something must be written, puts it on a bounded queue that
//! one writer task drains at a bounded rate (`qps`/`burst`). So:
//! - repeats of the same event on the same object become a series: the first repeat writes
//!   `series.count = 2`, later repeats only count in memory and are written periodically
//!   (`series_flush`) and when the series ends (no repeat for `series_idle`) — a steady state
//!   makes no writes;
//! - a spam filter per (plugin, object, reason) — a token bucket — bounds new events;
//! - a full write queue drops the new event (counted), never blocks a reconcile;
//! - failed writes are retried with backoff, a bounded number of times, a few writes at once so
//!   one slow write does not hold up the others; a create answered 409 (it reached the server
//!   before a timeout) counts as written;
//! - a series is one object, type, reason, action and plugin, as client-go keys it; a repeat with
//!   another note joins the series (the API server keeps a written note as it is).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::cluster::tenure::{Cut, Tenure};
use crate::metrics::Metrics;

/// An event as a plugin records it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PluginEvent {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: Option<String>,
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// Settings of the recorder.
#[derive(Debug, Clone)]
pub struct EventSettings {
    /// Writes waiting at most; beyond it new events are dropped (and counted).
    pub queue: usize,
    /// Event writes per second to the API server, all plugins together, and the burst above it.
    pub qps: f64,
    pub burst: u32,
    /// New events per (plugin, object, reason): burst, then one per `spam_refill`.
    pub spam_burst: u32,
    pub spam_refill: Duration,
    /// A series ends when no repeat came for this long (its count is written then).
    pub series_idle: Duration,
    /// A running series' count is written at most this often.
    pub series_flush: Duration,
    pub max_retries: u32,
    /// Event writes in flight at once.
    pub concurrent_writes: usize,
    /// Series and spam-filter buckets one plugin may have at once; beyond it its new events are
    /// dropped (and counted), so a plugin cannot grow the host's memory with distinct events.
    pub max_entries_per_plugin: usize,
    /// The host instance, for `reportingInstance`.
    pub instance: String,
    /// How long one write attempt may take (`--api-timeout-seconds`); under an election it is
    /// cut earlier, at the end of this replica's tenure of the plugin's Lease.
    pub write_timeout: Duration,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            queue: 4096,
            qps: 20.0,
            burst: 50,
            spam_burst: 25,
            spam_refill: Duration::from_secs(300),
            series_idle: Duration::from_secs(360),
            series_flush: Duration::from_secs(1800),
            max_retries: 12,
            concurrent_writes: 8,
            max_entries_per_plugin: 2048,
            instance: hostname(),
            write_timeout: Duration::from_secs(30),
        }
    }
}

fn hostname() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()))
        .unwrap_or_else(|_| "wasm-controller-manager".into())
}

/// What makes two events one series (client-go's key): the object, type, reason, action and the
/// reporting controller (the plugin). The note is not part of it: a repeat updates the note.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    name: String,
    uid: Option<String>,
    warning: bool,
    reason: String,
    action: String,
}

impl EventKey {
    fn of(e: &PluginEvent) -> EventKey {
        EventKey {
            api_version: e.api_version.clone(),
            kind: e.kind.clone(),
            namespace: e.namespace.clone(),
            name: e.name.clone(),
            uid: e.uid.clone(),
            warning: e.warning,
            reason: e.reason.clone(),
            action: e.action.clone(),
        }
    }
}

type SeriesKey = (Arc<str>, EventKey);
/// The spam filter's key: plugin, kind, namespace, name, reason.
type SpamKey = (Arc<str>, String, String, String, String);

/// One event on one object and its repeats.
struct Series {
    namespace: String,
    /// Chosen when first seen, so repeats can refer to it before it is written.
    name: String,
    /// The latest note: a create still waiting carries it (a written event's note is immutable).
    note: String,
    count: i32,
    written_count: i32,
    created: bool,
    queued: bool,
    last_seen: Instant,
    last_flush: Instant,
}

#[derive(Default)]
struct State {
    series: HashMap<SeriesKey, Series>,
    buckets: HashMap<SpamKey, (f64, Instant)>,
    pending: VecDeque<SeriesKey>,
    /// Each plugin's client (its own identity) and its bookkeeping entries (series + spam
    /// buckets), bounded by `max_entries_per_plugin`.
    plugins: HashMap<Arc<str>, PluginEntry>,
}

struct PluginEntry {
    client: kube::Client,
    /// When this replica may write for the plugin: a pass is taken for every write attempt, so
    /// an event queued before a Lease moved never leaves the old holder, and one in flight is cut
    /// at the end of the tenure (the Lease is released only once it has ended).
    tenure: Arc<Tenure>,
    entries: usize,
    /// When its last rejected event was logged, and how many were rejected since: one warning
    /// a minute per plugin at most (the API server's answer quotes the plugin's own values).
    rejection_logged: Option<Instant>,
    rejected_quietly: u64,
}

/// How often a plugin's rejected events are logged at most.
const REJECTION_LOG_INTERVAL: Duration = Duration::from_secs(60);

struct Shared {
    settings: EventSettings,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    wake: Notify,
}

/// Where plugins' events go. Cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    shared: Arc<Shared>,
}

impl EventSink {
    /// Correlates an event and queues what must be written; never waits for the API server.
    pub fn record(&self, plugin: &str, event: PluginEvent) {
        let s = &self.shared;
        let now = Instant::now();
        let plugin: Arc<str> = plugin.into();
        let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
        let key = (plugin.clone(), EventKey::of(&event));
        if let Some(series) = st.series.get_mut(&key) {
            series.count += 1;
            series.last_seen = now;
            series.note = event.note;
            // The first repeat of a written event makes it a series at once; a create still
            // waiting will carry the count itself.
            let enqueue = series.created && series.written_count < 2 && !series.queued;
            if enqueue {
                series.queued = true;
                st.pending.push_back(key);
                drop(st);
                s.wake.notify_one();
            }
            return;
        }
        let max = s.settings.max_entries_per_plugin;
        let Some(entry) = st.plugins.get(&plugin) else {
            s.metrics.event_dropped(&plugin, "plugin_stopped");
            return;
        };
        // A new series may need a new spam bucket too: two entries.
        if entry.entries + 2 > max {
            s.metrics.event_dropped(&plugin, "plugin_bookkeeping_full");
            return;
        }
        // Checked before the spam filter, so a token is spent only on an event that is kept.
        if st.pending.len() >= s.settings.queue {
            s.metrics.event_dropped(&plugin, "queue_full");
            return;
        }
        let State {
            buckets, plugins, ..
        } = &mut *st;
        let (admitted, new_bucket) = admit(buckets, &s.settings, &plugin, &key.1, now);
        if let Some(e) = plugins.get_mut(&plugin) {
            e.entries += usize::from(new_bucket);
        }
        if !admitted {
            s.metrics.event_dropped(&plugin, "spam_filter");
            return;
        }
        let e = &key.1;
        let series = Series {
            namespace: e.namespace.clone().unwrap_or_else(|| "default".to_string()),
            // client-go's naming: the object's name and a unique time suffix.
            name: format!("{}.{:x}", e.name, unique_suffix()),
            note: event.note,
            count: 1,
            written_count: 0,
            created: false,
            queued: true,
            last_seen: now,
            last_flush: now,
        };
        st.series.insert(key.clone(), series);
        if let Some(e) = st.plugins.get_mut(&plugin) {
            e.entries += 1;
        }
        st.pending.push_back(key);
        drop(st);
        s.wake.notify_one();
    }
}

/// The spam filter: a token bucket per (plugin, object, reason).
fn admit(
    buckets: &mut HashMap<SpamKey, (f64, Instant)>,
    settings: &EventSettings,
    plugin: &Arc<str>,
    e: &EventKey,
    now: Instant,
) -> (bool, bool) {
    let key = (
        plugin.clone(),
        e.kind.clone(),
        e.namespace.clone().unwrap_or_default(),
        e.name.clone(),
        e.reason.clone(),
    );
    let burst = f64::from(settings.spam_burst.max(1));
    let refill = settings.spam_refill.as_secs_f64().max(0.001);
    let new = !buckets.contains_key(&key);
    let (tokens, last) = buckets.entry(key).or_insert((burst, now));
    *tokens = (*tokens + now.duration_since(*last).as_secs_f64() / refill).min(burst);
    *last = now;
    if *tokens >= 1.0 {
        *tokens -= 1.0;
        (true, new)
    } else {
        (false, new)
    }
}

/// Starts the writer task.
pub fn start(settings: EventSettings, metrics: Arc<Metrics>) -> EventSink {
    let sink = EventSink::new(settings, metrics);
    tokio::spawn(
        Writer {
            shared: sink.shared.clone(),
        }
        .run(),
    );
    sink
}

impl EventSink {
    fn new(settings: EventSettings, metrics: Arc<Metrics>) -> Self {
        EventSink {
            shared: Arc::new(Shared {
                settings,
                metrics,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// Events of `plugin` are written with `client` (the plugin's own identity) from now on,
    /// within this replica's `tenure` of the plugin's Lease.
    pub fn register(&self, plugin: &str, client: kube::Client, tenure: Arc<Tenure>) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let plugin: Arc<str> = plugin.into();
        let entries = count_entries(&st, &plugin);
        st.plugins.insert(
            plugin,
            PluginEntry {
                client,
                tenure,
                entries,
                rejection_logged: None,
                rejected_quietly: 0,
            },
        );
    }

    /// Forgets a stopped plugin: its pending writes and bookkeeping go with it.
    pub fn unregister(&self, plugin: &str) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.plugins.remove(plugin);
        st.series.retain(|k, _| &*k.0 != plugin);
        st.buckets.retain(|k, _| &*k.0 != plugin);
        st.pending.retain(|k| &*k.0 != plugin);
    }

    /// Writes waiting (for tests and metrics).
    pub fn pending(&self) -> usize {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .len()
    }
}

/// What the writer does for one queued series.
enum Job {
    Create(Box<Event>),
    Series { count: i32 },
}

struct Writer {
    shared: Arc<Shared>,
}

fn count_entries(st: &State, plugin: &str) -> usize {
    st.series.keys().filter(|k| &*k.0 == plugin).count()
        + st.buckets.keys().filter(|k| &*k.0 == plugin).count()
}

impl Writer {
    async fn run(self) {
        let s = self.shared.clone();
        let limiter = crate::engine::rate_limit::TokenBucket::new(s.settings.qps, s.settings.burst);
        // Writes in flight at once: one slow or failing write (retried for up to a minute) holds
        // one slot, and the other events keep flowing.
        let slots = Arc::new(tokio::sync::Semaphore::new(
            s.settings.concurrent_writes.max(1),
        ));
        let period = Duration::from_secs(5).min(s.settings.series_idle);
        let mut last_housekeeping = Instant::now();
        loop {
            if last_housekeeping.elapsed() >= period {
                self.housekeeping();
                last_housekeeping = Instant::now();
            }
            let Some((key, namespace, name, job)) = self.next_job() else {
                tokio::select! {
                    _ = s.wake.notified() => {}
                    _ = tokio::time::sleep(period) => {}
                }
                continue;
            };
            limiter.acquire().await;
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let writer = Writer { shared: s.clone() };
            tokio::spawn(async move {
                let count = match &job {
                    Job::Create(e) => e.series.as_ref().map_or(1, |s| s.count),
                    Job::Series { count, .. } => *count,
                };
                let ok = writer.write(&key.0, &namespace, &name, job).await;
                writer.written(&key, ok, count);
                drop(slot);
            });
        }
    }

    /// Records the outcome of a write of `key`'s series.
    fn written(&self, key: &SeriesKey, ok: bool, count: i32) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(series) = st.series.get_mut(key) {
            series.queued = false;
            if ok {
                series.created = true;
                series.written_count = count;
                series.last_flush = Instant::now();
            } else if series.created {
                // A count that could not be written is not tried again on every repeat.
                series.written_count = series.written_count.max(count);
            } else {
                // Never written: forget it, so a later occurrence starts afresh.
                st.series.remove(key);
            }
        }
    }

    /// Takes the next queued series and what to write for it.
    fn next_job(&self) -> Option<(SeriesKey, String, String, Job)> {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let key = st.pending.pop_front()?;
        let series = st.series.get(&key)?;
        let job = if series.created {
            Job::Series {
                count: series.count,
            }
        } else {
            Job::Create(Box::new(self.event(&key, series)))
        };
        Some((
            key.clone(),
            series.namespace.clone(),
            series.name.clone(),
            job,
        ))
    }

    fn event(&self, (plugin, e): &SeriesKey, series: &Series) -> Event {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let note = crate::contract::validate::truncate(&series.note, 1024).to_string();
        Event {
            metadata: ObjectMeta {
                name: Some(series.name.clone()),
                namespace: Some(series.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(now.clone()),
            series: (series.count >= 2).then_some(EventSeries {
                count: series.count,
                last_observed_time: now,
            }),
            action: Some(e.action.clone()),
            reason: Some(e.reason.clone()),
            note: Some(note),
            type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
            reporting_controller: Some(plugin.to_string()),
            reporting_instance: Some(format!("{}-{plugin}", self.shared.settings.instance)),
            regarding: Some(ObjectReference {
                api_version: Some(e.api_version.clone()),
                kind: Some(e.kind.clone()),
                namespace: e.namespace.clone(),
                name: Some(e.name.clone()),
                uid: e.uid.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Logs a rejected event, at most once a minute per plugin (the rest are counted in
    /// `wcm_events_dropped_total{reason="rejected"}` and summed in the next line).
    fn log_rejection(&self, plugin: &str, name: &str, code: u16, message: &str) {
        let now = Instant::now();
        let quiet = {
            let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(entry) = st.plugins.get_mut(plugin) else {
                return;
            };
            if entry
                .rejection_logged
                .is_some_and(|t| now.duration_since(t) < REJECTION_LOG_INTERVAL)
            {
                entry.rejected_quietly += 1;
                return;
            }
            entry.rejection_logged = Some(now);
            std::mem::take(&mut entry.rejected_quietly)
        };
        let message = crate::contract::validate::log_text(message, 512);
        let event = crate::contract::validate::log_text(name, 253);
        tracing::warn!(
            plugin,
            event = %event,
            code,
            rejected_since_last_line = quiet,
            "event rejected by the API server: {message}"
        );
    }

    async fn write(&self, plugin: &str, namespace: &str, name: &str, job: Job) -> bool {
        let metrics = &self.shared.metrics;
        let entry = {
            let st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.plugins
                .get(plugin)
                .map(|p| (p.client.clone(), p.tenure.clone()))
        };
        let Some((client, tenure)) = entry else {
            metrics.event_dropped(plugin, "plugin_stopped");
            return false;
        };
        let api: Api<Event> = Api::namespaced(client, namespace);
        for attempt in 0..=self.shared.settings.max_retries {
            // Taken at send time, every attempt: the Lease may have moved since it was queued,
            // and the attempt is cut when this replica's tenure ends.
            let Some(pass) = tenure.begin() else {
                metrics.event_dropped(plugin, "not_leader");
                return false;
            };
            let timeout = self.shared.settings.write_timeout;
            let result = match &job {
                Job::Create(event) => pass
                    .run(timeout, api.create(&PostParams::default(), event))
                    .await
                    .map(|r| r.map(|_| "create")),
                Job::Series { count } => {
                    let series = EventSeries {
                        count: *count,
                        last_observed_time: MicroTime(k8s_openapi::jiff::Timestamp::now()),
                    };
                    // The API server keeps an event's note immutable: a series carries its first
                    // note (as client-go's does), and only the count and time move.
                    let patch = serde_json::json!({ "series": series });
                    pass.run(
                        timeout,
                        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
                    )
                    .await
                    .map(|r| r.map(|_| "series"))
                }
            };
            drop(pass);
            match result {
                // The tenure ended under it: the next attempt would be refused anyway.
                Err(Cut { by_tenure: true }) => {
                    metrics.event_dropped(plugin, "not_leader");
                    return false;
                }
                Err(Cut { by_tenure: false }) => {
                    tracing::debug!(plugin, attempt, "event write timed out, retrying");
                    tokio::time::sleep(crate::engine::rate_limit::backoff(
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                        attempt,
                    ))
                    .await;
                }
                Ok(result) => {
                    if let Some(done) = self.outcome(plugin, name, &job, attempt, result).await {
                        return done;
                    }
                }
            }
        }
        metrics.event_dropped(plugin, "retries_exhausted");
        false
    }

    /// What one answered attempt means: written or given up (`Some`), or to be retried (`None`,
    /// after its backoff).
    async fn outcome(
        &self,
        plugin: &str,
        name: &str,
        job: &Job,
        attempt: u32,
        result: Result<&'static str, kube::Error>,
    ) -> Option<bool> {
        let metrics = &self.shared.metrics;
        {
            match result {
                Ok(kind) => {
                    metrics.event_written(plugin, kind);
                    Some(true)
                }
                // A create that timed out on our side but reached the server: it is written.
                Err(kube::Error::Api(s)) if s.code == 409 && matches!(job, Job::Create(_)) => {
                    metrics.event_written(plugin, "create");
                    Some(true)
                }
                // The namespace is going away, or the request is invalid: retrying cannot help.
                Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 404 | 422) => {
                    metrics.event_dropped(plugin, "rejected");
                    self.log_rejection(plugin, name, s.code, &s.message);
                    Some(false)
                }
                Err(err) => {
                    tracing::debug!(plugin, attempt, "event write failed, retrying: {err}");
                    tokio::time::sleep(crate::engine::rate_limit::backoff(
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                        attempt,
                    ))
                    .await;
                    None
                }
            }
        }
    }

    /// Queues the final count of ended series and the count of long-running ones; forgets ended
    /// series and idle spam buckets.
    fn housekeeping(&self) {
        let s = &self.shared;
        let now = Instant::now();
        let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut queue = Vec::new();
        st.series.retain(|key, series| {
            let idle = now.duration_since(series.last_seen) >= s.settings.series_idle;
            let due = now.duration_since(series.last_flush) >= s.settings.series_flush;
            let unwritten = series.created && series.count != series.written_count;
            if unwritten && (idle || due) && !series.queued {
                series.queued = true;
                queue.push(key.clone());
            }
            // An ended series stays until its last count is written.
            !idle || series.queued
        });
        st.pending.extend(queue);
        let refill = s.settings.spam_refill * s.settings.spam_burst.max(1);
        st.buckets
            .retain(|_, (_, last)| now.duration_since(*last) < refill);
        // One pass over the bookkeeping, however many plugins there are.
        let mut counts: HashMap<Arc<str>, usize> = HashMap::new();
        let owners = st
            .series
            .keys()
            .map(|k| &k.0)
            .chain(st.buckets.keys().map(|k| &k.0));
        for p in owners {
            *counts.entry(p.clone()).or_default() += 1;
        }
        for (p, e) in st.plugins.iter_mut() {
            e.entries = counts.get(p).copied().unwrap_or(0);
        }
        if !st.pending.is_empty() {
            drop(st);
            s.wake.notify_one();
        }
    }
}

/// Nanoseconds since the epoch, bumped to stay unique within this process.
fn unique_suffix() -> u128 {
    static LAST: Mutex<u128> = Mutex::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    *last = (*last + 1).max(now);
    *last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, note: &str) -> PluginEvent {
        PluginEvent {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: name.into(),
            uid: None,
            warning: false,
            reason: "SuccessCalculatePod".into(),
            action: "Count".into(),
            note: note.into(),
        }
    }

    fn sink(queue: usize) -> EventSink {
        sink_with(EventSettings {
            queue,
            ..EventSettings::default()
        })
    }

    /// A sink with plugin "p" registered; its client points nowhere (nothing is written here).
    fn sink_with(settings: EventSettings) -> EventSink {
        let s = EventSink::new(settings, Metrics::new());
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("static URL"));
        s.register(
            "p",
            kube::Client::try_from(config).expect("client"),
            Tenure::unbounded(),
        );
        s
    }

    #[tokio::test]
    async fn an_event_queued_before_the_lease_moved_never_leaves_the_old_holder() {
        let s = EventSink::new(EventSettings::default(), Metrics::new());
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("static URL"));
        let tenure = Tenure::closed();
        tenure.open_until(Instant::now() + Duration::from_secs(60));
        s.register(
            "p",
            kube::Client::try_from(config).expect("client"),
            tenure.clone(),
        );
        s.record("p", event("a", "n"));
        assert_eq!(s.pending(), 1);
        // The Lease moves while the write waits in the queue.
        tenure.close();
        let writer = Writer {
            shared: s.shared.clone(),
        };
        // A write that was sent would retry against the dead address for seconds.
        let written = tokio::time::timeout(
            Duration::from_secs(2),
            writer.write("p", "ns", "a", Job::Series { count: 2 }),
        )
        .await
        .expect("refused at once, nothing sent");
        assert!(!written);
        assert_eq!(testenv_free_metric(&s, "not_leader"), 1.0);
    }

    #[tokio::test]
    async fn one_plugin_cannot_grow_the_bookkeeping_past_its_bound() {
        let s = sink_with(EventSettings {
            queue: 100_000,
            max_entries_per_plugin: 100,
            ..EventSettings::default()
        });
        for i in 0..10_000 {
            s.record("p", event(&format!("pod-{i}"), "n"));
        }
        let st = s.shared.state.lock().expect("lock");
        let entries = st.series.len() + st.buckets.len();
        assert!(entries <= 100, "{entries} entries kept");
        drop(st);
        assert!(testenv_free_metric(&s, "plugin_bookkeeping_full") >= 9_900.0);
        s.record("unregistered", event("a", "n"));
        assert_eq!(testenv_free_metric(&s, "plugin_stopped"), 1.0);
        s.unregister("p");
        assert_eq!(s.pending(), 0, "a stopped plugin's writes go with it");
    }

    fn series(sink: &EventSink, plugin: &str, e: &PluginEvent) -> (i32, String) {
        let st = sink.shared.state.lock().expect("lock");
        st.series
            .get(&(plugin.into(), EventKey::of(e)))
            .map_or((0, String::new()), |s| (s.count, s.note.clone()))
    }

    #[tokio::test]
    async fn repeats_are_counted_in_memory_not_queued() {
        let s = sink(100);
        for _ in 0..10 {
            s.record("p", event("a", "pod count is 3"));
        }
        assert_eq!(
            s.pending(),
            1,
            "one create, whatever the repeats before it is written"
        );
        assert_eq!(series(&s, "p", &event("a", "pod count is 3")).0, 10);
        // Another note joins the series (client-go's key has no note) and becomes its note.
        s.record("p", event("a", "pod count is 4"));
        assert_eq!(s.pending(), 1);
        assert_eq!(
            series(&s, "p", &event("a", "")),
            (11, "pod count is 4".to_string())
        );
        let mut other = event("a", "pod count is 4");
        other.action = "Recount".into();
        s.record("p", other);
        assert_eq!(s.pending(), 2, "another action is another series");
    }

    #[tokio::test]
    async fn the_spam_filter_bounds_new_events_per_object_and_reason() {
        let s = sink(1000);
        for i in 0..40 {
            let mut e = event("a", "note");
            e.action = format!("action-{i}");
            s.record("p", e);
        }
        assert_eq!(s.pending(), 25, "burst of 25 per object and reason");
        s.record("p", event("b", "note 0"));
        assert_eq!(s.pending(), 26, "another object has its own bucket");
        let dropped = testenv_free_metric(&s, "spam_filter");
        assert_eq!(dropped, 15.0);
    }

    #[tokio::test]
    async fn a_full_queue_drops_new_events_without_blocking() {
        let s = sink(3);
        for i in 0..10 {
            s.record("p", event(&format!("pod-{i}"), "n"));
        }
        assert_eq!(s.pending(), 3);
        assert_eq!(testenv_free_metric(&s, "queue_full"), 7.0);
        // The dropped events spent no spam-filter tokens: their objects' buckets were never made.
        let st = s.shared.state.lock().expect("lock");
        assert_eq!(st.buckets.len(), 3, "a token was spent on a dropped event");
    }

    fn testenv_free_metric(s: &EventSink, reason: &str) -> f64 {
        let text = s.shared.metrics.encode();
        text.lines()
            .filter(|l| {
                l.starts_with("wcm_events_dropped_total")
                    && l.contains(&format!("reason=\"{reason}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
