//! A rate-limited work queue with client-go's guarantees:
//! - adding a key that is already queued is a no-op (duplicates collapse);
//! - a key is never handed to two workers at once;
//! - adding a key while it is being processed marks it dirty, and it is queued again on `done`;
//! - delayed adds keep the earliest time;
//! - `add_rate_limited` waits `limiter.when(key)`, `forget` clears the key's failure count.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use super::shrink::ShrinkWhenSparse;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::engine::rate_limit::RateLimiter;

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
    /// Keys being processed, and since when (for the unfinished-work metrics).
    processing: HashMap<K, Instant>,
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
                processing: HashMap::new(),
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
        DelayMover {
            ready: self.ready.clone(),
            wake: self.delay_task.clone(),
            observer: self.observer.clone(),
            _key: std::marker::PhantomData,
        }
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

    /// A retry no sooner than `delay` (the plugin said when to come back), counted as a failure
    /// as with [`Self::add_rate_limited`]: the later of `delay` and the key's backoff, so a delay
    /// of zero cannot make a key spin.
    pub fn add_failed_after(&self, key: K, delay: Duration) {
        let backoff = self.limiter.when(&key);
        self.observer.retried();
        self.add_after(key, backoff.max(delay));
    }

    /// A requeue the plugin asked for after `delay` (its `requeue-after`), never sooner than
    /// `floor`. One asked for sooner than the floor is raised to it and also takes a token of the
    /// overall bucket, so neither one key nor many keys at once loop faster than the floor and
    /// the bucket allow. Delays at or above the floor are kept as asked (controller-runtime's
    /// `RequeueAfter`).
    pub fn add_requeue_after(&self, key: K, delay: Duration, floor: Duration) {
        let delay = if delay < floor {
            floor.max(self.limiter.overall())
        } else {
            delay
        };
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
                    s.processing.insert(key.clone(), Instant::now());
                    s.dirty.remove(&key);
                    if let Some(at) = s.added_at.remove(&key) {
                        self.observer.queued_for(at.elapsed());
                    }
                    s.queue.shrink_when_sparse();
                    s.dirty.shrink_when_sparse();
                    s.added_at.shrink_when_sparse();
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
        s.processing.shrink_when_sparse();
        if s.dirty.contains(key) {
            s.queue.push_back(key.clone());
            s.added_at.insert(key.clone(), Instant::now());
            self.observer.depth(s.queue.len());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Seconds of work in progress summed over the keys being processed, and the longest of them
    /// (client-go's `unfinished_work_seconds` and `longest_running_processor_seconds`).
    pub fn unfinished_work(&self) -> (f64, f64) {
        let s = self.lock();
        s.processing
            .values()
            .map(|t| t.elapsed().as_secs_f64())
            .fold((0.0, 0.0), |(sum, max), d| (sum + d, f64::max(max, d)))
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
    if s.processing.contains_key(&key) {
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
    _key: std::marker::PhantomData<fn() -> K>,
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
                    let Some(Reverse((at, _, key))) = s.heap.pop() else {
                        break;
                    };
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
                s.heap.shrink_when_sparse();
                s.waiting.shrink_when_sparse();
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
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), self.wake.notified()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! client-go's workqueue behaviour, case by case (time is paused and advanced by hand).
    use super::*;
    use crate::engine::rate_limit::RateLimits;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(RateLimiter::new(RateLimits::default()))
    }

    async fn try_get(q: &WorkQueue<&'static str>) -> Option<&'static str> {
        tokio::time::timeout(Duration::from_millis(1), q.get())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_after_below_the_floor_waits_the_floor_and_many_keys_the_bucket() {
        let floor = Duration::from_secs(1);
        // A bucket of 2 per second, burst 2, shared by every key of the queue.
        let q = WorkQueue::new(RateLimiter::new(RateLimits {
            qps: 2.0,
            burst: 2,
            ..RateLimits::default()
        }));
        q.add_requeue_after("k", Duration::from_millis(1), floor);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(try_get(&q).await, None, "1 ms asked: the floor applies");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(q.get().await, Some("k"));
        q.done(&"k");
        // At or above the floor: as asked, and no token taken.
        q.add_requeue_after("k", Duration::from_millis(1500), floor);
        tokio::time::advance(Duration::from_millis(1499)).await;
        assert_eq!(try_get(&q).await, None);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(q.get().await, Some("k"));
        q.done(&"k");
        // Six keys at once below the floor: the burst lets the first go at the floor, the bucket
        // spaces the rest half a second apart.
        let keys = ["a", "b", "c", "d", "e", "f"];
        for k in keys {
            q.add_requeue_after(k, Duration::ZERO, floor);
        }
        let mut seen = Vec::new();
        for step in 0..40 {
            tokio::time::advance(Duration::from_millis(100)).await;
            while let Some(k) = try_get(&q).await {
                seen.push((k, step + 1));
                q.done(&k);
            }
        }
        let at: Vec<u32> = seen.iter().map(|(_, t)| *t).collect();
        // In tenths of a second since the adds.
        assert_eq!(at.len(), 6, "{seen:?}");
        assert!(
            at.iter().all(|t| *t >= 10),
            "none before the floor: {seen:?}"
        );
        assert!(at[5] >= 20, "the bucket spaces them: {seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_delay_counts_as_a_failure_and_never_undercuts_the_backoff() {
        let q = queue();
        // Failures so far: the backoff is now well above zero.
        for _ in 0..6 {
            let _ = q.limiter.when(&"k");
        }
        let backoff_now = q.limiter.when(&"probe");
        assert!(backoff_now > Duration::ZERO);
        q.add_failed_after("k", Duration::ZERO);
        assert_eq!(q.num_requeues(&"k"), 7);
        // Zero asked: the backoff (5 ms doubled six times) still applies.
        assert_eq!(try_get(&q).await, None);
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(q.get().await, Some("k"));
        q.done(&"k");
        // A delay longer than the backoff is honoured.
        q.forget(&"k");
        q.add_failed_after("k", Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(try_get(&q).await, None);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.get().await, Some("k"));
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_adds_collapse() {
        let q = queue();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
        assert_eq!(try_get(&q).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_flight_is_not_handed_out_again_and_is_requeued_on_done() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add("a"); // while processing: dirty, not queued
        q.add("a");
        assert_eq!(q.len(), 0);
        assert_eq!(
            try_get(&q).await,
            None,
            "a second worker must not get the key in flight"
        );
        q.done(&"a");
        assert_eq!(q.len(), 1, "re-added once when the reconcile ends");
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert_eq!(q.len(), 0, "no re-add without a new add");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_adds_keep_the_earliest_time() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(1));
        q.add_after("b", Duration::from_secs(1));
        q.add_after("b", Duration::from_secs(10));
        assert_eq!(q.waiting(), 2);
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(q.len(), 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        tokio::task::yield_now().await;
        assert_eq!(q.len(), 2, "both keys are ready after 1 s");
        assert_eq!(q.waiting(), 0);
        // Processed and done: a second firing at 10 s would queue them again (dedup cannot hide it).
        for _ in 0..2 {
            let k = try_get(&q).await.expect("a key");
            q.done(&k);
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
        assert_eq!(q.len(), 0, "the later times were dropped, not added again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_add_is_not_delayed_by_a_pending_delayed_add() {
        let q = queue();
        q.add_after("a", Duration::from_secs(5));
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        tokio::time::sleep(Duration::from_secs(6)).await;
        tokio::task::yield_now().await;
        assert_eq!(q.len(), 1, "the delayed add still fires");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially_and_forget_resets() {
        let q = queue();
        let delays: Vec<Duration> = (0..5).map(|_| q.limiter.when(&"a")).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![5, 10, 20, 40, 80]);
        assert_eq!(q.num_requeues(&"a"), 5);
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
        assert_eq!(q.limiter.when(&"a"), Duration::from_millis(5));

        q.add_rate_limited("b"); // 5 ms
        tokio::time::sleep(Duration::from_millis(4)).await;
        assert_eq!(q.len(), 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        tokio::task::yield_now().await;
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn per_key_backoff_is_capped() {
        let l: RateLimiter<&str> = RateLimiter::new(RateLimits {
            qps: 0.0,
            ..RateLimits::default()
        });
        let mut last = Duration::ZERO;
        for _ in 0..40 {
            last = l.when(&"k");
        }
        assert_eq!(last, Duration::from_secs(1000));
        // 5 ms · 2^17 = 655 s < 1000 s; 2^18 would pass the cap.
        let l: RateLimiter<&str> = RateLimiter::new(RateLimits {
            qps: 0.0,
            ..RateLimits::default()
        });
        let seq: Vec<Duration> = (0..19).map(|_| l.when(&"k")).collect();
        assert_eq!(seq[17], Duration::from_millis(5 << 17));
        assert_eq!(seq[18], Duration::from_secs(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_bucket_bounds_retries_across_keys() {
        let l: RateLimiter<u32> = RateLimiter::new(RateLimits::default());
        // The first 100 retries (the burst) wait only their per-key 5 ms.
        for k in 0..100 {
            assert_eq!(l.when(&k), Duration::from_millis(5));
        }
        // Then 10 per second: the 101st waits 100 ms, the 102nd 200 ms.
        assert_eq!(l.when(&100).as_millis(), 100);
        assert_eq!(l.when(&101).as_millis(), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_drains_then_ends() {
        let q = queue();
        q.add("a");
        q.shut_down();
        q.add("b");
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, None);
    }
}
