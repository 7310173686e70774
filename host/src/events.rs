//! Event recording (events.k8s.io/v1) for plugins, with the correlation client-go does:
//! - a bounded queue: recording never blocks a reconcile (a full queue drops, and counts it);
//! - repeats of the same event on the same object become a series: the first repeat writes
//!   `series.count = 2`, later repeats only count in memory and are flushed periodically and when
//!   the series ends (no repeat for `series_idle`), so a steady state makes no writes;
//! - a spam filter per (plugin, object, reason): a token bucket bounds new events;
//! - failed writes are retried with backoff, a bounded number of times.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;

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
    pub queue: usize,
    /// New events per (plugin, object, reason): burst, then one per `spam_refill`.
    pub spam_burst: u32,
    pub spam_refill: Duration,
    /// A series ends when no repeat came for this long (its count is written then).
    pub series_idle: Duration,
    /// A running series' count is written at most this often.
    pub series_flush: Duration,
    pub max_retries: u32,
    /// The host instance, for `reportingInstance`.
    pub instance: String,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            queue: 4096,
            spam_burst: 25,
            spam_refill: Duration::from_secs(300),
            series_idle: Duration::from_secs(360),
            series_flush: Duration::from_secs(1800),
            max_retries: 12,
            instance: hostname(),
        }
    }
}

fn hostname() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()))
        .unwrap_or_else(|_| "wasm-controller-manager".into())
}

/// Where plugins' events go. Cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<(Arc<str>, PluginEvent)>,
    metrics: Arc<Metrics>,
}

impl EventSink {
    /// Queues an event; never waits. A full queue drops it (counted in metrics).
    pub fn record(&self, plugin: &str, event: PluginEvent) {
        if self.tx.try_send((plugin.into(), event)).is_err() {
            self.metrics.event_dropped(plugin, "queue_full");
        }
    }
}

/// Starts the recorder task.
pub fn start(client: kube::Client, settings: EventSettings, metrics: Arc<Metrics>) -> EventSink {
    let (tx, rx) = mpsc::channel(settings.queue);
    let recorder = Recorder {
        client,
        settings,
        metrics: metrics.clone(),
        series: HashMap::new(),
        buckets: HashMap::new(),
    };
    tokio::spawn(recorder.run(rx));
    EventSink { tx, metrics }
}

struct Series {
    namespace: String,
    name: String,
    count: i32,
    written_count: i32,
    last_seen: Instant,
    last_flush: Instant,
}

/// The spam filter's key: plugin, kind, namespace, name, reason.
type SpamKey = (Arc<str>, String, String, String, String);

struct Recorder {
    client: kube::Client,
    settings: EventSettings,
    metrics: Arc<Metrics>,
    series: HashMap<(Arc<str>, PluginEvent), Series>,
    buckets: HashMap<SpamKey, (f64, Instant)>,
}

impl Recorder {
    async fn run(mut self, mut rx: mpsc::Receiver<(Arc<str>, PluginEvent)>) {
        let mut tick = tokio::time::interval(Duration::from_secs(5).min(self.settings.series_idle));
        loop {
            tokio::select! {
                got = rx.recv() => match got {
                    Some((plugin, event)) => self.handle(plugin, event).await,
                    None => { self.flush_all().await; return; }
                },
                _ = tick.tick() => self.housekeeping().await,
            }
        }
    }

    async fn handle(&mut self, plugin: Arc<str>, event: PluginEvent) {
        let now = Instant::now();
        let key = (plugin.clone(), event.clone());
        if let Some(s) = self.series.get_mut(&key) {
            s.count += 1;
            s.last_seen = now;
            if s.written_count < 2 {
                // The first repeat turns the event into a series right away.
                let (ns, name, count) = (s.namespace.clone(), s.name.clone(), s.count);
                if self.write_series(&plugin, &ns, &name, count).await
                    && let Some(s) = self.series.get_mut(&key)
                {
                    s.written_count = count;
                    s.last_flush = now;
                }
            }
            return;
        }
        if !self.admit(&plugin, &event, now) {
            self.metrics.event_dropped(&plugin, "spam_filter");
            return;
        }
        if let Some((namespace, name)) = self.create(&plugin, &event).await {
            self.series.insert(
                key,
                Series {
                    namespace,
                    name,
                    count: 1,
                    written_count: 1,
                    last_seen: now,
                    last_flush: now,
                },
            );
        }
    }

    /// The spam filter: a token bucket per (plugin, object, reason).
    fn admit(&mut self, plugin: &Arc<str>, e: &PluginEvent, now: Instant) -> bool {
        let key = (
            plugin.clone(),
            e.kind.clone(),
            e.namespace.clone().unwrap_or_default(),
            e.name.clone(),
            e.reason.clone(),
        );
        let burst = f64::from(self.settings.spam_burst.max(1));
        let refill = self.settings.spam_refill.as_secs_f64().max(0.001);
        let (tokens, last) = self.buckets.entry(key).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() / refill).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    async fn create(&self, plugin: &str, e: &PluginEvent) -> Option<(String, String)> {
        let namespace = e.namespace.clone().unwrap_or_else(|| "default".to_string());
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut note = e.note.clone();
        truncate(&mut note, 1024);
        let event = Event {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and a unique time suffix.
                name: Some(format!("{}.{:x}", e.name, unique_suffix())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(now),
            action: Some(e.action.clone()),
            reason: Some(e.reason.clone()),
            note: Some(note),
            type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
            reporting_controller: Some(plugin.to_string()),
            reporting_instance: Some(format!("{}-{plugin}", self.settings.instance)),
            regarding: Some(ObjectReference {
                api_version: Some(e.api_version.clone()),
                kind: Some(e.kind.clone()),
                namespace: e.namespace.clone(),
                name: Some(e.name.clone()),
                uid: e.uid.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        for attempt in 0..=self.settings.max_retries {
            match api.create(&PostParams::default(), &event).await {
                Ok(created) => {
                    self.metrics.event_written(plugin, "create");
                    return created.metadata.name.map(|n| (namespace, n));
                }
                // The namespace is going away, or the request is invalid: retrying cannot help.
                Err(kube::Error::Api(s))
                    if s.code == 403 || s.code == 404 || s.code == 422 || s.code == 400 =>
                {
                    tracing::warn!(plugin, reason = %e.reason, "event rejected: {}", s.message);
                    self.metrics.event_dropped(plugin, "rejected");
                    return None;
                }
                Err(err) => {
                    tracing::debug!(plugin, attempt, "event write failed, retrying: {err}");
                    tokio::time::sleep(crate::rate_limit::backoff(
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                        attempt,
                    ))
                    .await;
                }
            }
        }
        self.metrics.event_dropped(plugin, "retries_exhausted");
        None
    }

    async fn write_series(&self, plugin: &str, namespace: &str, name: &str, count: i32) -> bool {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(k8s_openapi::jiff::Timestamp::now()),
        };
        let patch = serde_json::json!({ "series": series });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.metrics.event_written(plugin, "series");
                true
            }
            Err(err) => {
                tracing::debug!(plugin, name, "event series write failed: {err}");
                false
            }
        }
    }

    /// Ends idle series (writing their final count) and flushes long-running ones.
    async fn housekeeping(&mut self) {
        let now = Instant::now();
        let mut to_write = Vec::new();
        let mut ended = Vec::new();
        for (key, s) in &self.series {
            let idle = now.duration_since(s.last_seen) >= self.settings.series_idle;
            let due = now.duration_since(s.last_flush) >= self.settings.series_flush;
            if s.count != s.written_count && (idle || due) {
                to_write.push((key.clone(), s.namespace.clone(), s.name.clone(), s.count));
            }
            if idle {
                ended.push(key.clone());
            }
        }
        for (key, ns, name, count) in to_write {
            if self.write_series(&key.0, &ns, &name, count).await
                && let Some(s) = self.series.get_mut(&key)
            {
                s.written_count = count;
                s.last_flush = now;
            }
        }
        for key in ended {
            self.series.remove(&key);
        }
        let refill = self.settings.spam_refill * self.settings.spam_burst.max(1);
        self.buckets
            .retain(|_, (_, last)| now.duration_since(*last) < refill);
    }

    async fn flush_all(&mut self) {
        let pending: Vec<_> = self
            .series
            .iter()
            .filter(|(_, s)| s.count != s.written_count)
            .map(|(k, s)| (k.0.clone(), s.namespace.clone(), s.name.clone(), s.count))
            .collect();
        for (plugin, ns, name, count) in pending {
            self.write_series(&plugin, &ns, &name, count).await;
        }
    }
}

/// Nanoseconds since the epoch, bumped to stay unique within this process.
fn unique_suffix() -> u128 {
    static LAST: std::sync::Mutex<u128> = std::sync::Mutex::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    *last = (*last + 1).max(now);
    *last
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}
