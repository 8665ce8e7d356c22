//! The coordinator's time authority.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The coordinator's clock, in milliseconds. Leases expire on this clock
/// only; clients never compare their own time with it.
pub trait Clock: Send + Sync {
    /// Now, in milliseconds.
    fn now_ms(&self) -> u64;
}

/// Wall-clock milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told: tests make expiry happen exactly where
/// they want it, with no sleeps.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock showing `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(AtomicU64::new(start_ms))
    }

    /// Move forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Jump to `ms` (tests may also move a clock backwards to model a
    /// misbehaving time source).
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Milliseconds since this clock was created, from the monotonic system
/// clock: what a client measures its local validity deadline with (wall-clock
/// jumps must not extend a lease).
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock(std::time::Instant);

impl MonotonicClock {
    /// A clock starting at 0 now.
    pub fn new() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
