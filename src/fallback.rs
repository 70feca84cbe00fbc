//! What the limiter does while the store fails: the rule's `fail_mode`.
//!
//! - `open` allows every call;
//! - `closed` and `local` refuse every call, with the back-off as `retry_after`; under `local` a hot key first
//!   sells its reserve, tokens the store holds in escrow for it (`lease/reserve.rs`).
//!
//! Under every mode a hot key keeps spending what the store granted it before the fault (its *escrow*): its
//! leased batches, each within its TTL, and the chunks of a paced lease, each from its release on
//! (`lease/bucket.rs`). Those were taken out of the shared bucket before the fault, so nothing a process decides
//! alone is ever owed, and the bound holds whatever the outage, however long (invariant 12 of
//! docs/ARCHITECTURE.md). `local` also keeps a reserve: tokens the store holds for the key, renewed by each
//! lease, sold paced over the reserve's length while the store fails.
//!
//! Only a store error or a store call's own timeout brings a key here; a caller that merely waited long for a
//! lease in flight is refused locally by the lease engine (invariant 13).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Reply;
use crate::background::Background;
use crate::compiled::Compiled;
use crate::decision::{Decision, Source};
use crate::error::{Error, FailReason, StoreError};
use crate::fleet::Fleet;
use crate::rule::FailMode;

/// The fail modes: the decisions they made, and the rules' fleets (which size a hot key's first lease).
#[derive(Debug)]
pub(crate) struct Fallback {
    /// The rules' fleets: a leased rule's fair share of the burst is `1 / processes` of it.
    pub(crate) fleet: Arc<Fleet>,
    /// Decisions made by `fail_mode`, per [`FailReason`].
    decided: [AtomicU64; 3],
    /// The back-off a refusal asks the caller to wait.
    backoff: Duration,
    background: Arc<Background>,
}

impl Fallback {
    /// The fail modes, refusing for `backoff`, with each rule's `fleet`.
    pub(crate) fn new(backoff: Duration, background: Arc<Background>, fleet: Arc<Fleet>) -> Self {
        Self {
            fleet,
            decided: Default::default(),
            backoff,
            background,
        }
    }

    /// Processes sharing the limits of `rule`: its fleet's live count.
    pub(crate) fn processes(&self, rule: &str) -> u64 {
        self.fleet.processes(rule)
    }

    /// Decisions made by `fail_mode` so far, per [`FailReason`] (in [`FailReason::ALL`]'s order).
    pub(crate) fn decided(&self) -> [u64; 3] {
        self.decided.each_ref().map(|n| n.load(Ordering::Relaxed))
    }

    /// Decides a check of `compiled` by its fail mode because the store failed, for `reason`: `open` allows,
    /// `closed` and `local` refuse for the back-off. A limiter shutting down refuses with no `retry_after`.
    pub(crate) fn decide(&self, compiled: &Compiled, reason: FailReason) -> Decision {
        self.count(compiled, reason);
        if self.background.is_closed() {
            return Decision::bare(false, Duration::ZERO, Source::Fallback);
        }
        match compiled.fail_mode {
            FailMode::Open => Decision::bare(true, Duration::ZERO, Source::Fallback),
            FailMode::Closed | FailMode::Local => Decision::bare(false, self.backoff, Source::Fallback),
        }
    }

    /// A check of `compiled` allowed from a hot key's reserve (`fail_mode = "local"`, `lease/reserve.rs`) because
    /// the store failed, for `reason`: counted as the fail mode's decision.
    pub(crate) fn sold_from_reserve(&self, compiled: &Compiled, reason: FailReason) -> Decision {
        self.count(compiled, reason);
        Decision::bare(true, Duration::ZERO, Source::Fallback)
    }

    /// Counts a decision of `compiled` made by its fail mode, for `reason`, here and in its metric.
    fn count(&self, compiled: &Compiled, reason: FailReason) {
        self.decided[reason as usize].fetch_add(1, Ordering::Relaxed);
        compiled.metrics.fail_mode[reason as usize].increment(1);
    }

    /// Decides a reservation of `cost` tokens (of `acquire`) of `compiled` by its fail mode because the store
    /// failed with `error`: `open` grants it at once.
    ///
    /// # Errors
    /// [`Error::Store`] with the store's error under `closed` and `local`.
    pub(crate) fn reserve(&self, compiled: &Compiled, cost: u64, error: StoreError) -> Result<Reply, Error> {
        match compiled.fail_mode {
            FailMode::Open => Ok(Reply {
                granted: cost,
                ..Reply::default()
            }),
            FailMode::Closed | FailMode::Local => Err(Error::Store(error)),
        }
    }
}
