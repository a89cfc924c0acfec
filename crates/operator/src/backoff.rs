//! Per-object exponential backoff for failed reconciles (kube-rs has none built in).
//!
//! Each failing object waits `base * 2^(failures-1)` capped at `max`, with up to 10%
//! jitter so that many objects failing together do not retry in lockstep. A success
//! resets its count. Other objects are unaffected.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &str) -> Duration {
        let n = {
            let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let n = map.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let exp = self
            .base
            .saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(20)));
        let delay = exp.min(self.max);
        delay + jitter(key, n, delay / 10)
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn reset(&self, key: &str) {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(key);
    }

    pub fn failures(&self, key: &str) -> u32 {
        let map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).copied().unwrap_or(0)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

/// Deterministic jitter in `[0, spread)` from the key and attempt (no RNG needed).
fn jitter(key: &str, attempt: u32, spread: Duration) -> Duration {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let nanos = spread.as_nanos() as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    attempt.hash(&mut h);
    Duration::from_nanos(h.finish() % nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_failure_up_to_the_cap_and_reset_on_success() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay("ns/a")).collect();
        let secs: Vec<u64> = d.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 10, 10]);
        assert!(d.iter().all(|d| *d < Duration::from_secs(11)));
        assert_eq!(b.failures("ns/a"), 6);
        b.reset("ns/a");
        assert_eq!(b.failures("ns/a"), 0);
        assert_eq!(b.next_delay("ns/a").as_secs(), 1);
    }

    #[test]
    fn objects_back_off_independently() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..5 {
            b.next_delay("ns/failing");
        }
        assert_eq!(b.next_delay("ns/other").as_secs(), 1);
    }
}
