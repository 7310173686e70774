//! A rate-limited work queue with client-go's guarantees:
//! - adding a key that is already queued is a no-op (duplicates collapse);
//! - a key is never handed to two workers at once;
//! - adding a key while it is being processed marks it dirty, and it is queued again on `done`;
//! - delayed adds keep the earliest time;
//! - `add_rate_limited` waits `limiter.when(key)`, `forget` clears the key's failure count.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::rate_limit::RateLimiter;

/// Observes queue activity (metrics); the default does nothing.
pub trait QueueObserver: Send + Sync {
    fn added(&self) {}
    fn depth(&self, _depth: usize) {}
    fn retried(&self) {}
    /// Time a key waited in the queue before a worker took it.
    fn queued_for(&self, _d: Duration) {}
}

struct NoObserver;
impl QueueObserver for NoObserver {}

struct State<K> {
    queue: VecDeque<K>,
    /// Keys that need processing: queued, or added again while processing.
    dirty: HashSet<K>,
    processing: HashSet<K>,
    /// When each queued key was added (for the queue-duration metric).
    added_at: HashMap<K, Instant>,
    /// Delayed adds: the earliest ready time of each key, and a heap to find the next one.
    waiting: HashMap<K, Instant>,
    heap: BinaryHeap<Reverse<(Instant, u64, K)>>,
    seq: u64,
    shutting_down: bool,
}

/// The queue. Cheap to clone; all clones are the same queue.
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    ready: Arc<Notify>,
    limiter: Arc<RateLimiter<K>>,
    observer: Arc<dyn QueueObserver>,
    delay_task: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            state: self.state.clone(),
            ready: self.ready.clone(),
            limiter: self.limiter.clone(),
            observer: self.observer.clone(),
            delay_task: self.delay_task.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> WorkQueue<K> {
    /// A queue with the given rate limiter. Must be created inside a tokio runtime: a task moves
    /// delayed keys into the queue when their time comes.
    pub fn new(limiter: RateLimiter<K>) -> Self {
        Self::with_observer(limiter, Arc::new(NoObserver))
    }

    pub fn with_observer(limiter: RateLimiter<K>, observer: Arc<dyn QueueObserver>) -> Self {
        let q = WorkQueue {
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                added_at: HashMap::new(),
                waiting: HashMap::new(),
                heap: BinaryHeap::new(),
                seq: 0,
                shutting_down: false,
            })),
            ready: Arc::new(Notify::new()),
            limiter: Arc::new(limiter),
            observer,
            delay_task: Arc::new(Notify::new()),
        };
        let weak = Arc::downgrade(&q.state);
        let this = q.clone_weak_parts();
        tokio::spawn(async move { this.run_delays(weak).await });
        q
    }

    fn clone_weak_parts(&self) -> DelayMover<K> {
        DelayMover { ready: self.ready.clone(), wake: self.delay_task.clone(), observer: self.observer.clone() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // A panic while holding the lock cannot leave the state half-changed in a way that matters
        // more than stopping the controller would; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a key now.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if add_locked(&mut s, key) {
            self.observer.added();
            self.observer.depth(s.queue.len());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Adds a key after `delay`; if it is already waiting, the earlier time wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut s = self.lock();
        if s.shutting_down {
            return;
        }
        if let Some(existing) = s.waiting.get(&key)
            && *existing <= at
        {
            return;
        }
        s.waiting.insert(key.clone(), at);
        s.seq += 1;
        let seq = s.seq;
        s.heap.push(Reverse((at, seq, key)));
        drop(s);
        self.delay_task.notify_one();
    }

    /// Adds a key after the rate limiter's delay for it (a retry).
    pub fn add_rate_limited(&self, key: K) {
        let delay = self.limiter.when(&key);
        self.observer.retried();
        self.add_after(key, delay);
    }

    /// Clears the key's failure history (call on success).
    pub fn forget(&self, key: &K) {
        self.limiter.forget(key);
    }

    /// How many times the key has failed since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.limiter.failures(key)
    }

    /// Takes the next key, waiting for one; `None` once the queue is shut down and empty.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.processing.insert(key.clone());
                    s.dirty.remove(&key);
                    if let Some(at) = s.added_at.remove(&key) {
                        self.observer.queued_for(at.elapsed());
                    }
                    self.observer.depth(s.queue.len());
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
                if s.shutting_down {
                    drop(s);
                    self.ready.notify_one();
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks the key as processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.clone());
            s.added_at.insert(key.clone(), Instant::now());
            self.observer.depth(s.queue.len());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Queued keys (not counting those being processed or waiting for a delay).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a delay to pass.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Stops handing out keys once the queue is empty; new adds are dropped.
    pub fn shut_down(&self) {
        self.lock().shutting_down = true;
        self.ready.notify_waiters();
        self.ready.notify_one();
        self.delay_task.notify_one();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }
}

fn add_locked<K: Clone + Eq + Hash>(s: &mut State<K>, key: K) -> bool {
    if s.shutting_down || s.dirty.contains(&key) {
        return false;
    }
    s.dirty.insert(key.clone());
    if s.processing.contains(&key) {
        return false;
    }
    s.added_at.insert(key.clone(), Instant::now());
    s.queue.push_back(key);
    true
}

/// The task that moves delayed keys into the queue. It holds only a weak reference to the
/// state, so it ends when the queue is dropped.
struct DelayMover<K> {
    ready: Arc<Notify>,
    wake: Arc<Notify>,
    observer: Arc<dyn QueueObserver>,
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> DelayMover<K> {
    async fn run_delays(self, state: std::sync::Weak<Mutex<State<K>>>) {
        loop {
            let next = {
                let Some(state) = state.upgrade() else { return };
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                if s.shutting_down {
                    return;
                }
                let now = Instant::now();
                let mut moved = false;
                while let Some(Reverse((at, _, _))) = s.heap.peek() {
                    if *at > now {
                        break;
                    }
                    let Some(Reverse((at, _, key))) = s.heap.pop() else { break };
                    // Skip stale heap entries: the key was re-scheduled earlier or already moved.
                    if s.waiting.get(&key) != Some(&at) {
                        continue;
                    }
                    s.waiting.remove(&key);
                    if add_locked(&mut s, key) {
                        moved = true;
                        self.observer.added();
                    }
                }
                if moved {
                    self.observer.depth(s.queue.len());
                    self.ready.notify_one();
                }
                s.heap.peek().map(|Reverse((at, _, _))| *at)
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                // Wake now and then to notice that the queue is gone.
                None => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), self.wake.notified()).await;
                }
            }
        }
    }
}
