//! What the limiter does while the store fails: the rule's `fail_mode`.
//!
//! - `open` allows every call, `closed` refuses every call (retry after the back-off);
//! - `local` gives each process its *local share* of the rule (`1 / expected_processes` of the capacity and the
//!   rate, or of the window's limit), enforced alone in process by the in-process store;
//! - what a token bucket's local share admitted alone is written in the *debit ledger*, and charged to the shared
//!   bucket (a debit of `token_return.lua`) once the store answers for the key again, before its next lease or
//!   call, or at shutdown: so the return to the shared limit is not a second burst on top of the local one.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::algorithm::{TokenBucket, NEVER};
use crate::background::Background;
use crate::decision::{Decision, Source};
use crate::error::StoreError;
use crate::rule::{Algorithm, FailMode};
use crate::store::call::{Call, Members};
use crate::store::guarded::Guarded;
use crate::store::MemoryStore;

/// The fail modes' state: the local shares and the debit ledger.
#[derive(Debug)]
pub(crate) struct Fallback {
    /// Processes sharing the limits: the local share is `1 / processes` of them.
    processes: u64,
    /// The local shares, in process.
    shares: MemoryStore,
    /// Token-bucket keys whose local share granted tokens while the store failed, with their shared bucket.
    ledger: DashMap<String, TokenBucket, foldhash::fast::RandomState>,
    /// At most this many keys in the ledger.
    max_keys: usize,
    /// Unique members of the local share's sliding-log and leaky-bucket calls.
    members: Arc<Members>,
    store: Arc<Guarded>,
    background: Arc<Background>,
}

impl Fallback {
    /// The fail modes over `store`, for `processes` processes, remembering at most `max_keys` keys to debit.
    pub(crate) fn new(
        store: Arc<Guarded>,
        background: Arc<Background>,
        members: Arc<Members>,
        shares: MemoryStore,
        (processes, max_keys): (u64, usize),
    ) -> Self {
        Self {
            processes: processes.max(1),
            shares,
            ledger: DashMap::default(),
            max_keys,
            members,
            store,
            background,
        }
    }

    /// Processes sharing the limits.
    pub(crate) fn processes(&self) -> u64 {
        self.processes
    }

    /// Decides a check of `cost` tokens of `store_key` by `mode` (the fail mode of `rule`, whose limits for the
    /// key are `algorithm`) after the store failed with `error`.
    pub(crate) fn decide(
        &self,
        (mode, rule): (FailMode, &str),
        algorithm: &Algorithm,
        store_key: &str,
        cost: u64,
        error: &StoreError,
    ) -> Decision {
        tracing::debug!(%rule, %error, "store failed; deciding by fail_mode");
        let backoff = self.store.timeouts.backoff;
        match mode {
            FailMode::Open => Decision::bare(true, Duration::ZERO, Source::Fallback),
            FailMode::Closed => Decision::bare(false, backoff, Source::Fallback),
            FailMode::Local => {
                let call = Call::check(algorithm, store_key, cost, self.processes, &self.members);
                match self.shares.run_sync(&call) {
                    Ok(reply) if reply.retry_after_ms != NEVER || reply.granted > 0 => {
                        if reply.granted > 0 {
                            self.owe(algorithm, store_key);
                        }
                        Decision::from_reply(&reply, cost, Source::Fallback)
                    }
                    _ => Decision::bare(false, backoff, Source::Fallback),
                }
            }
        }
    }

    /// Runs a reservation (of `acquire`) in this process's local share.
    ///
    /// # Errors
    /// The in-process store's error for arguments out of range.
    pub(crate) fn run_local(&self, call: &Call) -> Result<crate::algorithm::Reply, StoreError> {
        self.shares.run_sync(call)
    }

    /// Remembers that the local share granted tokens of `store_key` alone (token buckets only), at most
    /// `max_keys` keys; the sweeper forgets those whose local share has refilled.
    fn owe(&self, algorithm: &Algorithm, store_key: &str) {
        if let Algorithm::TokenBucket { bucket, .. } = algorithm {
            if !self.ledger.contains_key(store_key) && self.ledger.len() < self.max_keys {
                self.ledger.insert(store_key.to_owned(), *bucket);
            }
        }
    }

    /// After the store answered for `store_key`: when the local share decided for it alone, charges that to the
    /// shared bucket ([`Fallback::settle`]) before the key's next lease or call. The debit runs as a task of its
    /// own, so a caller dropped meanwhile loses nothing; the caller waits for it, so no second burst is admitted
    /// before it lands. Nothing to do (the common case) costs one emptiness check.
    pub(crate) async fn settle_after_answer(self: &Arc<Self>, store_key: &str) {
        if self.ledger.is_empty() {
            return;
        }
        if let Some((store_key, bucket)) = self.ledger.remove(store_key) {
            let this = self.clone();
            let _ = self
                .background
                .spawn(async move { this.settle(store_key, bucket).await })
                .await;
        }
    }

    /// Tokens the local share admitted for `store_key` alone that it has not refilled yet.
    fn unsettled(&self, store_key: &str, bucket: &TokenBucket) -> u64 {
        let share = bucket.share(self.processes);
        let probe = Call::give_back(store_key, share, 0);
        self.shares
            .run_sync(&probe)
            .map_or(0, |now| share.capacity.saturating_sub(now.remaining))
    }

    /// Charges the shared bucket of `store_key` with the tokens the local share admitted alone and has not
    /// refilled yet (a debit of `token_return.lua`; it may put the bucket in debt, so it may come after the key's
    /// first grant). The tokens leave the ledger (the local share is refilled) before the debit is sent, so a
    /// concurrent settle of the same key cannot charge them again; a debit that fails puts them back and the key
    /// is settled after the store's next answer.
    pub(crate) async fn settle(&self, store_key: String, bucket: TokenBucket) {
        let spent = self.unsettled(&store_key, &bucket);
        if spent == 0 {
            return;
        }
        let tokens = i64::try_from(spent).unwrap_or(i64::MAX);
        let share = bucket.share(self.processes);
        let _ = self.shares.run_sync(&Call::give_back(&store_key, share, tokens));
        // As a lease: a debit timed out after Redis applied it would be applied again.
        let debit = Call::give_back(&store_key, bucket, -tokens).with_timeout(self.store.timeouts.lease);
        match self.store.run(&debit).await {
            Ok(_) => tracing::debug!(key = %store_key, tokens, "charged what fail_mode local admitted"),
            Err(_) => {
                let _ = self.shares.run_sync(&Call::give_back(&store_key, share, -tokens));
                self.ledger.insert(store_key, bucket);
            }
        }
    }

    /// Forgets the keys whose local share has refilled (the sweeper's pass).
    pub(crate) fn sweep(&self) {
        if !self.ledger.is_empty() {
            self.ledger
                .retain(|store_key, bucket| self.unsettled(store_key, bucket) > 0);
        }
    }

    /// Takes every key of the ledger, to settle at shutdown (key by key: a key added meanwhile is not lost).
    pub(crate) fn drain(&self) -> Vec<(String, TokenBucket)> {
        let keys: Vec<String> = self.ledger.iter().map(|e| e.key().clone()).collect();
        keys.into_iter().filter_map(|k| self.ledger.remove(&k)).collect()
    }
}
