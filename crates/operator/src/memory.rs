//! Handing freed memory back to the system.
//!
//! glibc's allocator returns memory to the system only from the top of a heap; what is
//! freed in the middle (the pages of a burst of LIST responses, events and reconciles
//! while a fleet is created) stays resident though nothing uses it. [`trim`] asks glibc
//! to release those pages (`malloc_trim`), so that the operator's resident memory follows
//! what it keeps rather than its peak. It runs every [`TRIM_EVERY`]; a trim walks the
//! free lists, milliseconds for a heap of a hundred MiB. Elsewhere than on glibc it does
//! nothing.

use std::time::Duration;

/// How often freed memory is handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Hands the free pages of every heap back to the system.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes glibc's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// [`trim`] every [`TRIM_EVERY`], forever.
pub async fn trim_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        trim();
    }
}
