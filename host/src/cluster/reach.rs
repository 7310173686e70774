//! Whether the API server answers this replica: `/readyz` is 503 while it does not, so a Pod that
//! cannot reach the API server (its network cut, the Service's address unreachable) is taken out
//! of the Ready set by the kubelet's own probe, as the issue of a real node showed it must be.
//!
//! A background task asks `GET /version` (readable by any authenticated identity) every
//! [`CHECK_EVERY`], each attempt bounded by [`ATTEMPT_TIMEOUT`]; the probe only reads the time of
//! the last answer, so it answers at once whatever the network does. Any HTTP answer counts, an
//! error status included (429 or 5xx from a loaded API server is an API server that answers; its
//! replicas must not all leave the Ready set for it). Not ready once no answer came for
//! [`UNREACHABLE_AFTER`]: at least two attempts in a row without one, not one slow answer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the API server is asked.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long one attempt may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long without an answer before the replica is not ready.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(15);

/// The checking task; stopped when dropped.
pub struct ReachTask(tokio::task::JoinHandle<()>);

impl Drop for ReachTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The latest answer of the API server, as the probes read it.
pub struct ApiReach {
    start: Instant,
    /// Milliseconds from `start` to the last answer.
    last_ok_ms: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Failed attempts in a row (the log says the first, then one in twelve: about once a minute).
    failures: AtomicU64,
}

/// What `/readyz` says of the API server.
#[derive(Debug, PartialEq, Eq)]
pub enum Reach {
    Answers,
    /// No answer for this long; the last error.
    Silent(Duration, Option<String>),
}

impl ApiReach {
    /// Starts as reachable (the caller has just talked to the API server) and asks again every
    /// [`CHECK_EVERY`] on `client` until the returned task is aborted.
    pub fn start(client: kube::Client) -> (std::sync::Arc<ApiReach>, ReachTask) {
        let reach = std::sync::Arc::new(ApiReach::new());
        let r = reach.clone();
        let task = tokio::spawn(async move {
            // An attempt every CHECK_EVERY, however long the last one took.
            let mut tick = tokio::time::interval(CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match tokio::time::timeout(ATTEMPT_TIMEOUT, client.apiserver_version()).await {
                    Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => r.answered(),
                    Ok(Err(e)) => r.failed(e.to_string()),
                    Err(_) => r.failed(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
                }
            }
        });
        (reach, ReachTask(task))
    }

    fn new() -> ApiReach {
        ApiReach {
            start: Instant::now(),
            last_ok_ms: AtomicU64::new(0),
            last_error: Mutex::new(None),
            failures: AtomicU64::new(0),
        }
    }

    fn answered(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ok_ms.store(ms, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        if let Ok(mut e) = self.last_error.lock()
            && e.take().is_some()
        {
            tracing::info!("the API server answers again");
        }
    }

    fn failed(&self, error: String) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(12) {
            tracing::warn!(
                failed_in_a_row = n + 1,
                "the API server did not answer: {error}"
            );
        }
        if let Ok(mut e) = self.last_error.lock() {
            // The error text comes from the network stack or the API server: bounded.
            *e = Some(error.chars().take(300).collect());
        }
    }

    /// Whether the API server answered within [`UNREACHABLE_AFTER`].
    pub fn now(&self) -> Reach {
        self.at(self.start.elapsed())
    }

    fn at(&self, elapsed: Duration) -> Reach {
        let last = Duration::from_millis(self.last_ok_ms.load(Ordering::Relaxed));
        let silent = elapsed.saturating_sub(last);
        if silent <= UNREACHABLE_AFTER {
            return Reach::Answers;
        }
        let error = self.last_error.lock().ok().and_then(|e| e.clone());
        Reach::Silent(silent, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_only_past_the_threshold_and_answers_again_after_one_answer() {
        let r = ApiReach::new();
        assert_eq!(r.at(UNREACHABLE_AFTER), Reach::Answers);
        r.failed("connection refused".into());
        match r.at(UNREACHABLE_AFTER + Duration::from_secs(1)) {
            Reach::Silent(d, Some(e)) => {
                assert_eq!(d, UNREACHABLE_AFTER + Duration::from_secs(1));
                assert_eq!(e, "connection refused");
            }
            other => panic!("expected silent, got {other:?}"),
        }
        r.answered();
        assert_eq!(r.now(), Reach::Answers);
        assert!(r.last_error.lock().is_ok_and(|e| e.is_none()));
    }

    #[test]
    fn a_long_error_is_cut() {
        let r = ApiReach::new();
        r.failed("x".repeat(10_000));
        match r.at(UNREACHABLE_AFTER * 2) {
            Reach::Silent(_, Some(e)) => assert_eq!(e.len(), 300),
            other => panic!("expected silent, got {other:?}"),
        }
    }
}
