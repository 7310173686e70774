//! client-go's default controller rate limiter: the larger of a per-key exponential backoff and a
//! global token bucket.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::shrink::ShrinkWhenSparse;

/// Settings of [`RateLimiter`]. Defaults are client-go's: 5 ms doubling up to 1000 s per key,
/// and 10 retries per second with a burst of 100 overall.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimits {
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Token refill rate (retries per second); 0 turns the bucket off.
    pub qps: f64,
    pub burst: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

/// How long `tokens` take to come at `qps` (> 0); a rate so small that the wait cannot be told
/// is as good as never.
fn wait_for(tokens: f64, qps: f64) -> Duration {
    Duration::try_from_secs_f64(tokens / qps).unwrap_or(Duration::MAX)
}

/// A token bucket that reserves: each call takes a token and returns how long to wait until that
/// token exists (golang.org/x/time/rate's `Reserve`). `qps <= 0` means no limit.
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token; the delay before it may be used.
    pub fn reserve(&self) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
        s.1 = now;
        s.0 -= 1.0;
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            wait_for(-s.0, self.qps)
        }
    }

    /// Takes one token if it exists within `max_wait`: the delay before it may be used, or `None`
    /// (nothing taken) when it would come later. Debt is so bounded by `max_wait` × qps, and a
    /// caller refused here owes nothing.
    pub fn reserve_within(&self, max_wait: Duration) -> Option<Duration> {
        if self.qps <= 0.0 {
            return Some(Duration::ZERO);
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
        s.1 = now;
        let after = s.0 - 1.0;
        let wait = if after >= 0.0 {
            Duration::ZERO
        } else {
            wait_for(-after, self.qps)
        };
        if wait > max_wait {
            return None;
        }
        s.0 = after;
        Some(wait)
    }

    /// Takes one token if one is there now; never waits and never goes into debt (for budgets that
    /// drop what is over them, such as log lines).
    pub fn try_take(&self) -> bool {
        if self.qps <= 0.0 {
            return true;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes one token and waits until it may be used.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

pub struct RateLimiter<K> {
    limits: RateLimits,
    failures: Mutex<HashMap<K, u32>>,
    bucket: TokenBucket,
}

impl<K: Eq + Hash + Clone> RateLimiter<K> {
    pub fn new(limits: RateLimits) -> Self {
        RateLimiter {
            limits,
            failures: Mutex::new(HashMap::new()),
            bucket: TokenBucket::new(limits.qps, limits.burst),
        }
    }

    /// The delay before the next retry of `key`; counts one more failure.
    pub fn when(&self, key: &K) -> Duration {
        let per_key = {
            let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            let n = f.entry(key.clone()).or_insert(0);
            let exp = *n;
            *n = n.saturating_add(1);
            backoff(self.limits.base_delay, self.limits.max_delay, exp)
        };
        per_key.max(self.bucket.reserve())
    }

    /// The delay the overall bucket gives one more requeue (a token is taken).
    pub fn overall(&self) -> Duration {
        self.bucket.reserve()
    }

    /// Failures of `key` since it was last forgotten.
    pub fn failures(&self, key: &K) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn forget(&self, key: &K) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.remove(key).is_some() {
            f.shrink_when_sparse();
        }
    }
}

/// base · 2^exp, capped at max (and never overflowing).
pub fn backoff(base: Duration, max: Duration, exp: u32) -> Duration {
    if exp >= 63 {
        return max;
    }
    let factor = 1u128 << exp;
    let nanos = base.as_nanos().saturating_mul(factor);
    if nanos > max.as_nanos() {
        max
    } else {
        Duration::from_nanos(nanos as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_too_small_to_wait_for_refuses_and_never_panics() {
        // A plugin's settings may ask for any positive rate: 1e-300 tokens a second.
        let b = TokenBucket::new(1e-300, 1);
        assert_eq!(
            b.reserve_within(Duration::from_secs(1)),
            Some(Duration::ZERO)
        );
        assert_eq!(b.reserve_within(Duration::from_secs(1)), None);
        assert_eq!(b.reserve(), Duration::MAX);
        let b = TokenBucket::new(2.0, 1);
        assert_eq!(b.reserve(), Duration::ZERO);
        let wait = b
            .reserve_within(Duration::from_secs(1))
            .expect("within a second");
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500));
    }
}
