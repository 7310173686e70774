//! A plugin's cron schedules (contract 0.3): each tick enqueues a key (the one the schedule
//! names, or every primary object in the cache) on the replica that leads the plugin, and only
//! there.
//!
//! The catch-up rule (`wcm_rules::schedules::catch_up`): the last tick run of each schedule is
//! recorded on a Lease of the host's (`wcm-schedules-PLUGIN` in the namespace of its leader
//! election Leases, else the plugins' identity namespace; annotation `schedules.wcm.dev/NAME`). A replica that starts leading the plugin (after a
//! restart, a hand-over, or a time when nothing ran) runs the latest tick missed since that record
//! once, if it is at most the schedule's `catch-up-seconds` old; earlier missed ticks are not run,
//! and a schedule never run before catches nothing up. A tick is recorded as it is enqueued, so a
//! new leader does not run again a tick its predecessor enqueued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::watch;
use wcm_rules::schedules::{self, Ticks};

use crate::contract::{Schedule, declared};
use crate::engine::cache::{Key, ObjectStore};
use crate::engine::queue::WorkQueue;
use crate::metrics::Metrics;

/// Where the last tick run of each schedule is kept.
#[derive(Clone)]
pub struct ScheduleRecords {
    client: kube::Client,
    namespace: String,
}

const ANNOTATION_PREFIX: &str = "schedules.wcm.dev/";
/// The field manager of the host's writes of the records.
const MANAGER: &str = "wasm-controller-manager:schedules";

impl ScheduleRecords {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        ScheduleRecords {
            client,
            namespace: namespace.to_string(),
        }
    }

    fn lease_name(plugin: &str) -> String {
        format!("wcm-schedules-{plugin}")
    }

    /// The last tick run of each schedule, by name (nothing when there is no record yet).
    async fn read(&self, plugin: &str) -> Result<HashMap<String, Timestamp>, kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(lease) = leases.get_opt(&Self::lease_name(plugin)).await? else {
            return Ok(HashMap::new());
        };
        Ok(lease
            .metadata
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix(ANNOTATION_PREFIX)?.to_string();
                Some((name, v.parse().ok()?))
            })
            .collect())
    }

    /// Records `tick` as the last run of `schedule`, and drops the records of schedules the plugin
    /// no longer declares: get, then replace at that resourceVersion (or create), the verbs the
    /// host's leader-election Role grants on Leases.
    async fn write(
        &self,
        plugin: &str,
        schedule: &str,
        tick: Timestamp,
        declared: &[String],
    ) -> Result<(), kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = Self::lease_name(plugin);
        let pp = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        let key = format!("{ANNOTATION_PREFIX}{schedule}");
        match leases.get_opt(&name).await? {
            Some(mut lease) => {
                let annotations = lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default);
                annotations.retain(|k, _| {
                    k.strip_prefix(ANNOTATION_PREFIX)
                        .is_none_or(|s| declared.iter().any(|d| d == s))
                });
                annotations.insert(key, tick.to_string());
                leases.replace(&name, &pp, &lease).await.map(|_| ())
            }
            None => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "wasm-controller-manager"},
                        "annotations": {key: tick.to_string()}},
                    "spec": {},
                }))
                .map_err(kube::Error::SerdeError)?;
                leases.create(&pp, &lease).await.map(|_| ())
            }
        }
    }
}

/// What `/debug/controllers` shows of a schedule.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleDebug {
    pub name: String,
    pub cron: String,
    pub time_zone: String,
    /// The key each tick enqueues ("namespace/name"), or "every primary object".
    pub enqueues: String,
    /// RFC 3339; none when this replica does not lead the plugin.
    pub next_tick: Option<String>,
    pub last_tick: Option<String>,
}

pub type ScheduleView = Arc<Mutex<Vec<ScheduleDebug>>>;

/// Keys a tick enqueued, with the schedule's name, until their reconcile takes it.
pub type Scheduled = Arc<Mutex<HashMap<Key, String>>>;

struct Entry {
    decl: Schedule,
    ticks: Ticks,
    last: Option<Timestamp>,
}

/// The running schedules of one controller.
pub struct Scheduler {
    pub plugin: String,
    pub schedules: Vec<Schedule>,
    pub records: Option<ScheduleRecords>,
    pub queue: WorkQueue<Key>,
    pub primary: Arc<ObjectStore>,
    pub scheduled: Scheduled,
    pub taking: watch::Receiver<bool>,
    pub metrics: Arc<Metrics>,
    pub view: ScheduleView,
}

fn key_text(s: &Schedule) -> String {
    match &s.key {
        Some(k) => match &k.namespace {
            Some(ns) => format!("{ns}/{}", k.name),
            None => k.name.clone(),
        },
        None => "every primary object".into(),
    }
}

impl Scheduler {
    /// Runs until the controller stops (its task is aborted).
    pub async fn run(mut self) {
        let mut entries: Vec<Entry> = self
            .schedules
            .iter()
            // Checked at load: none is left out.
            .filter_map(|s| {
                Some(Entry {
                    ticks: Ticks::new(&declared::schedule(s)).ok()?,
                    decl: s.clone(),
                    last: None,
                })
            })
            .collect();
        if entries.is_empty() {
            return;
        }
        loop {
            self.show(&entries, false);
            if !*self.taking.borrow() && self.taking.wait_for(|t| *t).await.is_err() {
                return;
            }
            // Leading from here: what ran before, and a catch-up.
            let records = match &self.records {
                Some(r) => match r.read(&self.plugin).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(plugin = %self.plugin, error = %e, "cannot read the schedules' last ticks: no catch-up this time");
                        HashMap::new()
                    }
                },
                None => HashMap::new(),
            };
            let now = Timestamp::now();
            for e in &mut entries {
                // A record from the future (a clock ahead, or a hand's edit) would hold every
                // tick back until then: not trusted past a minute ahead.
                e.last = records
                    .get(&e.decl.name)
                    .copied()
                    .filter(|t| t.duration_since(now).as_secs() <= 60);
                if let Some(missed) =
                    schedules::catch_up(&e.ticks, e.last, now, e.decl.catch_up_seconds)
                {
                    tracing::info!(plugin = %self.plugin, schedule = %e.decl.name, tick = %missed, "catching up the latest tick missed");
                    self.fire(e, missed, "catch-up").await;
                }
            }
            self.ticking(&mut entries).await;
        }
    }

    /// Fires ticks while this replica leads; returns when it stops leading.
    async fn ticking(&mut self, entries: &mut [Entry]) {
        loop {
            self.show(entries, true);
            let now = Timestamp::now();
            // The next tick of each schedule after both now and its last run.
            let next = entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| {
                    let from = e.last.map_or(now, |l| l.max(now));
                    Some((i, e.ticks.next_after(from)?))
                })
                .min_by_key(|(_, t)| *t);
            let Some((i, tick)) = next else {
                // No schedule ticks again: wait for leadership to end.
                let _ = self.taking.wait_for(|t| !*t).await;
                return;
            };
            let jitter = match entries[i].decl.jitter_seconds {
                0 => Duration::ZERO,
                j => Duration::from_millis(fastrand::u64(0..=u64::from(j) * 1000)),
            };
            let wait = Duration::try_from(tick.duration_since(now)).unwrap_or_default() + jitter;
            let lost = self.taking.wait_for(|t| !*t);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = lost => return,
            }
            if !*self.taking.borrow() {
                return;
            }
            // A clock that went back: not yet.
            if Timestamp::now() < tick {
                continue;
            }
            self.fire(&mut entries[i], tick, "tick").await;
        }
    }

    /// Enqueues the schedule's key(s) for `tick` and records it.
    async fn fire(&self, e: &mut Entry, tick: Timestamp, kind: &str) {
        let keys: Vec<Key> = match &e.decl.key {
            Some(k) => vec![Key {
                namespace: k.namespace.clone().filter(|n| !n.is_empty()),
                name: k.name.clone(),
            }],
            None => self
                .primary
                .all()
                .into_iter()
                .map(|o| o.key.clone())
                .collect(),
        };
        {
            let mut scheduled = self.scheduled.lock().unwrap_or_else(|p| p.into_inner());
            for k in &keys {
                scheduled.insert(k.clone(), e.decl.name.clone());
            }
        }
        for k in keys {
            self.queue.add(k);
        }
        e.last = Some(tick);
        self.metrics.schedule_tick(&self.plugin, &e.decl.name, kind);
        let declared: Vec<String> = self.schedules.iter().map(|s| s.name.clone()).collect();
        if let Some(r) = &self.records
            && let Err(err) = r.write(&self.plugin, &e.decl.name, tick, &declared).await
        {
            tracing::warn!(plugin = %self.plugin, schedule = %e.decl.name, error = %err, "cannot record the tick run: a new leader may catch it up again");
        }
    }

    fn show(&self, entries: &[Entry], leading: bool) {
        let now = Timestamp::now();
        let view = entries
            .iter()
            .map(|e| ScheduleDebug {
                name: e.decl.name.clone(),
                cron: e.decl.cron.clone(),
                time_zone: e.decl.time_zone.clone().unwrap_or_else(|| "UTC".into()),
                enqueues: key_text(&e.decl),
                next_tick: leading
                    .then(|| e.ticks.next_after(e.last.map_or(now, |l| l.max(now))))
                    .flatten()
                    .map(|t| t.to_string()),
                last_tick: e.last.map(|t| t.to_string()),
            })
            .collect();
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = view;
    }
}
