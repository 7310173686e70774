//! [`MockHost::run_controller`]: the host's controller loop over the mock's two stores, so a unit
//! test sees what the plugin does as the host would drive it — which changes wake which keys,
//! retries, requeues, and the event a terminal error leaves.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::Value;

use super::{GroupKind, MockHost, RecordedEvent, meta_str};
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

/// A write that changed nothing but bookkeeping sends no watch event.
fn content(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

fn covers(w: &Watch, obj: &Value) -> bool {
    let namespace_ok =
        w.namespace.is_none() || w.namespace.as_deref() == meta_str(obj, "namespace");
    let metadata = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let labels_ok = w.label_selector.as_deref().is_none_or(|s| {
        super::selector::Selector::parse(s).is_ok_and(|sel| sel.matches(&metadata))
    });
    namespace_ok && labels_ok
}

/// The owner references of `obj` that point at `primary` (only the controller one, or all).
fn owners(obj: &Value, primary: &KindRef, controller_only: bool) -> Vec<ObjectKey> {
    let namespace = meta_str(obj, "namespace");
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|o| !controller_only || o.get("controller") == Some(&Value::Bool(true)))
        .filter(|o| {
            o.get("kind").and_then(Value::as_str) == Some(primary.kind.as_str())
                && o.get("apiVersion").and_then(Value::as_str)
                    == Some(primary.api_version().as_str())
        })
        .filter_map(|o| o.get("name").and_then(Value::as_str))
        .map(|name| ObjectKey::new(namespace, name))
        .collect()
}

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
        let mut queue: VecDeque<ObjectKey> = {
            let st = self.state.borrow();
            st.cache
                .get(&primary_gk)
                .into_iter()
                .flatten()
                .filter(|(_, obj)| covers(&primary, obj))
                .map(|(key, _)| key.clone())
                .collect()
        };
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
                Err(e) => match e.retry_after_delay() {
                    Some(d) => {
                        *failures.entry(key.clone()).or_default() += 1;
                        run.requeued.push((key.clone(), d));
                    }
                    None => retry = true,
                },
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
                    run.gave_up.push(key.clone());
                } else if !queue.contains(&key) {
                    queue.push_back(key.clone());
                }
            }
            self.sync_cache();
            for woken in self.woken_keys(&declared.secondaries, &primary, &before) {
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

    /// The keys the changes between `before` and the cache now wake, as the host maps them.
    fn woken_keys(
        &self,
        secondaries: &[crate::describe::Secondary],
        primary: &Watch,
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
                let Some(obj) = is.or(was) else { continue };
                let wakes = |w: &Watch| {
                    (w.kind.group.as_str(), w.kind.kind.as_str()) == (gk.0.as_str(), gk.1.as_str())
                        && covers(w, obj)
                        && match (was, is) {
                            (Some(a), Some(b)) => w.changes.wakes(a, b),
                            _ => true,
                        }
                };
                if wakes(primary) {
                    woken.insert(key.clone());
                }
                for s in secondaries.iter().filter(|s| wakes(&s.watch)) {
                    match &s.mapping {
                        Mapping::SameKey => {
                            woken.insert(key.clone());
                        }
                        Mapping::FixedKey(k) => {
                            woken.insert(k.clone());
                        }
                        Mapping::ControllerOwner => woken.extend(owners(obj, &primary.kind, true)),
                        Mapping::AnyOwner => woken.extend(owners(obj, &primary.kind, false)),
                        Mapping::Label(label) => {
                            if let Some(v) = obj
                                .pointer("/metadata/labels")
                                .and_then(|l| l.get(label))
                                .and_then(Value::as_str)
                            {
                                woken.insert(ObjectKey::new(meta_str(obj, "namespace"), v));
                            }
                        }
                    }
                }
            }
        }
        woken
    }
}
