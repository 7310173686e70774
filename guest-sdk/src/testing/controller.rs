//! [`MockHost::run_controller`]: the host's controller loop over the mock's two stores, so a unit
//! test sees what the plugin does as the host would drive it — which changes wake which keys,
//! retries, requeues, and the event a terminal error leaves.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::Value;

use super::{GroupKind, MockHost, RecordedEvent, content, covers, meta_str};
use crate::describe::{Mapping, Watch};
use crate::reconcile::{Action, Error, Reconciler, Request};
use crate::types::{EventType, KindRef, ObjectKey, ObjectRef};

/// Retries of one key in a row before [`MockHost::run_controller`] stops retrying it (the host
/// keeps retrying with a growing backoff; a test wants an answer).
pub const MAX_MOCK_RETRIES: u32 = 5;

/// One reconcile made by [`MockHost::run_controller`].
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerStep {
    /// The key reconciled.
    pub key: ObjectKey,
    /// Failed attempts in a row before this one ([`Request::attempt`]).
    pub attempt: u32,
    /// What the plugin returned.
    pub result: Result<Action, Error>,
}

/// What [`MockHost::run_controller`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControllerRun {
    /// Every reconcile, in order.
    pub steps: Vec<ControllerStep>,
    /// Keys the plugin asked to see again later (`Action::requeue(d)`, a retry delay), with the
    /// delay: noted, not waited for.
    pub requeued: Vec<(ObjectKey, Duration)>,
    /// Keys still failing after [`MAX_MOCK_RETRIES`] retries.
    pub gave_up: Vec<ObjectKey>,
    /// The run stopped at its limit with keys still queued: the plugin keeps waking itself.
    pub hit_limit: bool,
}

impl ControllerRun {
    /// The keys reconciled, in order (with repeats).
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.steps.iter().map(|s| s.key.clone()).collect()
    }
}

/// The primary key in `obj`'s namespace, or cluster-scoped, as the primary kind is.
fn primary_key(obj: &Value, primary_namespaced: bool, name: &str) -> ObjectKey {
    let namespace = if primary_namespaced {
        meta_str(obj, "namespace")
    } else {
        None
    };
    ObjectKey::new(namespace, name)
}

/// The owner references of `obj` that point at `primary` (only the controller one, or all),
/// matched by group and kind as the host matches them.
fn owners(
    obj: &Value,
    primary: &KindRef,
    namespaced: bool,
    controller_only: bool,
) -> Vec<ObjectKey> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|o| !controller_only || o.get("controller") == Some(&Value::Bool(true)))
        .filter(|o| {
            let api_version = o.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            let group = api_version.split_once('/').map_or("", |(g, _)| g);
            o.get("kind").and_then(Value::as_str) == Some(primary.kind.as_str())
                && group == primary.group
        })
        .filter_map(|o| o.get("name").and_then(Value::as_str))
        .map(|name| primary_key(obj, namespaced, name))
        .collect()
}

/// A label value the host takes as a name (it ignores others).
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The primary keys `obj` maps to through `mapping`.
fn mapped(
    obj: &Value,
    own: &ObjectKey,
    mapping: &Mapping,
    primary: &KindRef,
    ns: bool,
) -> Vec<ObjectKey> {
    match mapping {
        Mapping::SameKey => vec![own.clone()],
        Mapping::FixedKey(k) => vec![k.clone()],
        Mapping::ControllerOwner => owners(obj, primary, ns, true),
        Mapping::AnyOwner => owners(obj, primary, ns, false),
        Mapping::Label(label) => obj
            .pointer("/metadata/labels")
            .and_then(|l| l.get(label))
            .and_then(Value::as_str)
            .filter(|v| is_name(v))
            .map(|v| vec![primary_key(obj, ns, v)])
            .unwrap_or_default(),
    }
}

/// Kinds of the API server that are cluster-scoped (a custom kind is taken as namespaced unless
/// its seeded objects say otherwise).
const CLUSTER_SCOPED: &[&str] = &[
    "Node",
    "Namespace",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "CustomResourceDefinition",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "CSIDriver",
    "CSINode",
    "RuntimeClass",
    "IngressClass",
    "VolumeAttachment",
];

impl MockHost {
    /// Runs plugin `R` as the host's controller does, until nothing is left to do or
    /// `max_reconciles` reconciles were made:
    ///
    /// - the queue starts with the key of every cached primary object the primary watch covers (as
    ///   after the host's first list), in order;
    /// - after each reconcile the API server's changes reach the cache ([`MockHost::sync_cache`]),
    ///   and each changed object wakes keys as the host maps them: a primary object its own key
    ///   (through the watch's change filter), a secondary one through its [`Mapping`];
    /// - `Action::requeue_now` and retryable errors retry the key at once with the attempt
    ///   counted (the backoff is not waited for; at most [`MAX_MOCK_RETRIES`] in a row);
    ///   `Action::requeue(d)` and an error's retry delay are noted in
    ///   [`ControllerRun::requeued`];
    /// - a terminal error is not retried and leaves the host's Warning event `ReconcileFailed` on
    ///   the object.
    ///
    /// # Panics
    /// Without a declared description ([`MockHost::for_reconciler`]).
    pub fn run_controller<R: Reconciler>(&self, max_reconciles: usize) -> ControllerRun {
        let Some(declared) = self.state.borrow().declared.clone() else {
            panic!("run_controller needs a declared plugin: use MockHost::for_reconciler");
        };
        let Some(primary) = declared.primary.clone() else {
            panic!("run_controller needs a primary watch");
        };
        let primary_gk: GroupKind = (primary.kind.group.clone(), primary.kind.kind.clone());
        let namespaced = self.namespaced(&primary.kind);
        // As after the host's first lists: every cached primary, then what every cached secondary
        // maps to.
        let mut queue: VecDeque<ObjectKey> = VecDeque::new();
        {
            let st = self.state.borrow();
            let mut push = |k: ObjectKey| {
                if !queue.contains(&k) {
                    queue.push_back(k);
                }
            };
            for (key, obj) in st.cache.get(&primary_gk).into_iter().flatten() {
                if covers(&primary, obj) {
                    push(key.clone());
                }
            }
            for s in &declared.secondaries {
                let gk = (s.watch.kind.group.clone(), s.watch.kind.kind.clone());
                for (key, obj) in st.cache.get(&gk).into_iter().flatten() {
                    if covers(&s.watch, obj) {
                        mapped(obj, key, &s.mapping, &primary.kind, namespaced)
                            .into_iter()
                            .for_each(&mut push);
                    }
                }
            }
        }
        let mut failures: std::collections::BTreeMap<ObjectKey, u32> = Default::default();
        let mut run = ControllerRun::default();
        while let Some(key) = queue.pop_front() {
            if run.steps.len() >= max_reconciles {
                queue.push_front(key);
                run.hit_limit = true;
                break;
            }
            let attempt = failures.get(&key).copied().unwrap_or(0);
            let object = self.cache_object(&primary.kind, &key);
            let request = Request {
                key: key.clone(),
                object: object.as_ref().map(Value::to_string),
                attempt,
                scheduled: None,
            };
            let before = self.state.borrow().cache.clone();
            let result = self.run_request::<R>(request);
            let mut retry = false;
            match &result {
                Ok(a) if a.requeue_after() == Some(Duration::ZERO) => retry = true,
                Ok(a) => {
                    failures.remove(&key);
                    if let Some(d) = a.requeue_after() {
                        run.requeued.push((key.clone(), d));
                    }
                }
                Err(e) if e.is_terminal() => {
                    failures.remove(&key);
                    if let Some(obj) = &object {
                        let regarding = ObjectRef {
                            kind: primary.kind.clone(),
                            key: key.clone(),
                            uid: meta_str(obj, "uid").map(str::to_string),
                        };
                        self.state.borrow_mut().events.push(RecordedEvent {
                            regarding,
                            event_type: EventType::Warning,
                            reason: "ReconcileFailed".into(),
                            action: "Reconcile".into(),
                            note: e.message().chars().take(1024).collect(),
                        });
                    }
                }
                Err(e) => {
                    // Retried (the host waits the later of the delay and the backoff).
                    if let Some(d) = e.retry_after_delay() {
                        run.requeued.push((key.clone(), d));
                    }
                    retry = true;
                }
            }
            run.steps.push(ControllerStep {
                key: key.clone(),
                attempt,
                result,
            });
            if retry {
                let n = failures.entry(key.clone()).or_default();
                *n += 1;
                if *n > MAX_MOCK_RETRIES {
                    if !run.gave_up.contains(&key) {
                        run.gave_up.push(key.clone());
                    }
                } else if !queue.contains(&key) {
                    queue.push_back(key.clone());
                }
            }
            self.sync_cache();
            for woken in self.woken_keys(&declared.secondaries, &primary, namespaced, &before) {
                if !queue.contains(&woken) {
                    queue.push_back(woken);
                }
            }
        }
        run
    }

    /// The cached primary object as the plugin would get it.
    fn cache_object(&self, kind: &KindRef, key: &ObjectKey) -> Option<Value> {
        let st = self.state.borrow();
        let obj = st
            .cache
            .get(&(kind.group.clone(), kind.kind.clone()))?
            .get(key)?;
        st.cached_view(kind, obj)
    }

    /// Whether the primary kind is namespaced: as its seeded objects say, else by the API
    /// server's cluster-scoped kinds.
    fn namespaced(&self, kind: &KindRef) -> bool {
        let st = self.state.borrow();
        let gk = (kind.group.clone(), kind.kind.clone());
        let seen = st
            .cache
            .get(&gk)
            .into_iter()
            .chain(st.api.get(&gk))
            .flatten()
            .next();
        match seen {
            Some((key, _)) => key.namespace.is_some(),
            None => !(super::is_built_in(kind) && CLUSTER_SCOPED.contains(&kind.kind.as_str())),
        }
    }

    /// The keys the changes between `before` and the cache now wake, as the host maps them: the
    /// old and the new object both map; an object that enters or leaves a watch (its selector,
    /// its namespace) is an add or a delete there, never held back by a change filter.
    fn woken_keys(
        &self,
        secondaries: &[crate::describe::Secondary],
        primary: &Watch,
        namespaced: bool,
        before: &super::Store,
    ) -> BTreeSet<ObjectKey> {
        let st = self.state.borrow();
        let mut woken = BTreeSet::new();
        let kinds: BTreeSet<&GroupKind> = before.keys().chain(st.cache.keys()).collect();
        for gk in kinds {
            let old = before.get(gk);
            let new = st.cache.get(gk);
            let keys: BTreeSet<&ObjectKey> = old
                .into_iter()
                .flatten()
                .chain(new.into_iter().flatten())
                .map(|(k, _)| k)
                .collect();
            for key in keys {
                let was = old.and_then(|o| o.get(key));
                let is = new.and_then(|o| o.get(key));
                if was.map(content) == is.map(content) {
                    continue;
                }
                let same_kind = |w: &Watch| {
                    (w.kind.group.as_str(), w.kind.kind.as_str()) == (gk.0.as_str(), gk.1.as_str())
                };
                // What the watch delivers: both sides it sees (an add, an update, a delete).
                let seen = |w: &Watch| -> Vec<&Value> {
                    if !same_kind(w) {
                        return Vec::new();
                    }
                    let before = was.filter(|o| covers(w, o));
                    let after = is.filter(|o| covers(w, o));
                    match (before, after) {
                        (Some(a), Some(b)) if !w.changes.wakes(a, b) => Vec::new(),
                        (a, b) => a.into_iter().chain(b).collect(),
                    }
                };
                if !seen(primary).is_empty() {
                    woken.insert(key.clone());
                }
                for s in secondaries {
                    for obj in seen(&s.watch) {
                        woken.extend(mapped(obj, key, &s.mapping, &primary.kind, namespaced));
                    }
                }
            }
        }
        woken
    }
}
