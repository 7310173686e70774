//! What an informer hands each subscriber: its changes, coalesced per object.
//!
//! A subscriber that falls behind does not make the informer queue every change for it: a change
//! to an object that still has one waiting merges into it (first `old`, last `new`), so what waits
//! is at most one change per object, whatever the rate of changes or the size of a relist. A change
//! filter or a mapping then sees the net change. A dropped subscription is noticed by the informer
//! at its next change and removed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::engine::cache::Key;
use crate::engine::informer::Change;
use crate::engine::shrink::ShrinkWhenSparse;

#[derive(Default)]
struct Mailbox {
    /// Keys in the order their first waiting change arrived.
    order: VecDeque<Key>,
    waiting: HashMap<Key, Change>,
}

struct Inner {
    mailbox: Mutex<Mailbox>,
    ready: Notify,
    /// The receiver was dropped: the informer stops delivering to it.
    receiver_gone: AtomicBool,
    /// The informer was dropped: nothing more will come.
    sender_gone: AtomicBool,
}

/// The informer's side.
pub struct Sender {
    inner: Arc<Inner>,
}

/// The subscriber's side.
pub struct Subscription {
    inner: Arc<Inner>,
}

pub fn channel() -> (Sender, Subscription) {
    let inner = Arc::new(Inner {
        mailbox: Mutex::new(Mailbox::default()),
        ready: Notify::new(),
        receiver_gone: AtomicBool::new(false),
        sender_gone: AtomicBool::new(false),
    });
    (
        Sender {
            inner: inner.clone(),
        },
        Subscription { inner },
    )
}

fn key_of(c: &Change) -> &Key {
    match c {
        Change::Applied { new, .. } => &new.key,
        Change::Deleted { old } => &old.key,
    }
}

/// One change standing for `first` followed by `next` (of the same object).
fn merge(first: Change, next: Change) -> Change {
    let first_old = match first {
        Change::Applied { old, .. } => old,
        Change::Deleted { old } => Some(old),
    };
    match next {
        Change::Applied { new, .. } => Change::Applied {
            old: first_old,
            new,
        },
        Change::Deleted { old } => Change::Deleted { old },
    }
}

impl Sender {
    /// Delivers a change; false once the subscription is gone (the informer then drops this).
    pub fn send(&self, change: Change) -> bool {
        if self.inner.receiver_gone.load(Ordering::Acquire) {
            return false;
        }
        let mut m = self.inner.mailbox.lock().unwrap_or_else(|p| p.into_inner());
        let key = key_of(&change).clone();
        match m.waiting.remove(&key) {
            Some(first) => {
                m.waiting.insert(key, merge(first, change));
            }
            None => {
                m.order.push_back(key.clone());
                m.waiting.insert(key, change);
            }
        }
        drop(m);
        self.inner.ready.notify_one();
        true
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.inner.sender_gone.store(true, Ordering::Release);
        self.inner.ready.notify_one();
    }
}

impl Subscription {
    /// The next change; `None` once the informer is gone and nothing waits.
    pub async fn recv(&mut self) -> Option<Change> {
        loop {
            let notified = self.inner.ready.notified();
            {
                let mut m = self.inner.mailbox.lock().unwrap_or_else(|p| p.into_inner());
                while let Some(key) = m.order.pop_front() {
                    if let Some(change) = m.waiting.remove(&key) {
                        m.order.shrink_when_sparse();
                        m.waiting.shrink_when_sparse();
                        return Some(change);
                    }
                }
                if self.inner.sender_gone.load(Ordering::Acquire) {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Changes waiting (at most one per object).
    pub fn waiting(&self) -> usize {
        self.inner
            .mailbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiting
            .len()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.inner.receiver_gone.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cache::CachedObject;
    use serde_json::json;

    fn obj(name: &str, rv: &str) -> Arc<CachedObject> {
        Arc::new(
            CachedObject::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": rv}
            }))
            .expect("an object"),
        )
    }

    fn applied(old: Option<Arc<CachedObject>>, new: Arc<CachedObject>) -> Change {
        Change::Applied { old, new }
    }

    #[tokio::test]
    async fn changes_of_one_object_coalesce_into_the_net_change() {
        let (tx, mut rx) = channel();
        let (a1, a2, a3) = (obj("a", "1"), obj("a", "2"), obj("a", "3"));
        assert!(tx.send(applied(None, a1.clone())));
        assert!(tx.send(applied(Some(a1.clone()), a2.clone())));
        assert!(tx.send(applied(Some(obj("b", "1")), obj("b", "2"))));
        assert!(tx.send(applied(Some(a2), a3.clone())));
        assert_eq!(rx.waiting(), 2, "one waiting change per object");
        match rx.recv().await {
            Some(Change::Applied { old: None, new }) => assert_eq!(new.resource_version, "3"),
            other => panic!("a's first old and last new: {other:?}"),
        }
        match rx.recv().await {
            Some(Change::Applied { new, .. }) => assert_eq!(&*new.key.name, "b"),
            other => panic!("then b: {other:?}"),
        }
        // Deleted then created again: an update from the deleted object to the new one.
        assert!(tx.send(Change::Deleted { old: a3.clone() }));
        assert!(tx.send(applied(None, obj("a", "9"))));
        match rx.recv().await {
            Some(Change::Applied { old: Some(o), new }) => {
                assert_eq!(
                    (o.resource_version.as_str(), new.resource_version.as_str()),
                    ("3", "9")
                )
            }
            other => panic!("{other:?}"),
        }
        // Applied then deleted: a deletion.
        assert!(tx.send(applied(None, obj("c", "1"))));
        assert!(tx.send(Change::Deleted { old: obj("c", "2") }));
        assert!(matches!(rx.recv().await, Some(Change::Deleted { .. })));
        drop(tx);
        assert!(rx.recv().await.is_none(), "the informer is gone");
    }

    #[tokio::test]
    async fn a_dropped_subscription_refuses_deliveries() {
        let (tx, rx) = channel();
        drop(rx);
        assert!(!tx.send(applied(None, obj("a", "1"))));
    }

    #[tokio::test]
    async fn a_burst_waits_as_one_change_per_object() {
        let (tx, rx) = channel();
        for rv in 0..10_000 {
            tx.send(applied(
                None,
                obj(&format!("o{}", rv % 10), &rv.to_string()),
            ));
        }
        assert_eq!(rx.waiting(), 10);
    }
}
