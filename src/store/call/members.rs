//! Unique members of sliding-log and leaky-bucket calls, and a limiter's name in its rules' rosters.

use std::sync::atomic::{AtomicU64, Ordering};

/// Unique members of sliding-log and leaky-bucket calls: `{prefix}-{n}`, the prefix telling apart processes
/// and limiters of one process.
#[derive(Debug)]
pub(crate) struct Members {
    prefix: String,
    next: AtomicU64,
}

impl Members {
    /// Members for one limiter of this process: the prefix is the process id, the wall clock's nanoseconds now
    /// (a restarted process with the same id gets another) and the limiter's number in the process (two
    /// limiters built in the same nanosecond get two).
    pub(crate) fn new() -> Self {
        static LIMITERS: AtomicU64 = AtomicU64::new(0);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = LIMITERS.fetch_add(1, Ordering::Relaxed);
        Self {
            prefix: format!("{:x}.{seed:x}.{n:x}", std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    /// Members named `{name}-{n}`, the limiter itself `name` (see [`crate::LimiterBuilder::member`]).
    pub(crate) fn named(name: String) -> Self {
        Self {
            prefix: name,
            next: AtomicU64::new(0),
        }
    }

    /// The limiter's own name: its member in the rules' rosters (`fleet.lua`).
    pub(crate) fn name(&self) -> &str {
        &self.prefix
    }

    /// The next member.
    pub(crate) fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.prefix)
    }
}
