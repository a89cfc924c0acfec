//! Polling helpers for tests: wait until something observable becomes true.

use std::future::Future;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what} (last seen: {last})")]
pub struct Timeout {
    pub what: String,
    pub timeout: Duration,
    pub last: String,
}

/// Calls `check` every 100 ms until it returns `Ok(value)`; `Err(note)` means "not yet",
/// and the last note is reported on timeout.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(note) => note,
        };
        if Instant::now() >= deadline {
            return Err(Timeout {
                what: what.to_string(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
