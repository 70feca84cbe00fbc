//! What the limiter does while the store fails: the rule's `fail_mode`.
//!
//! - `open` allows every call, `closed` refuses every call (retry after the back-off);
//! - `local` gives each process its *local share* of the rule (`1 / expected_processes` of the capacity and the
//!   rate, or of the window's limit), enforced alone in process. A token bucket's share is one continuous bucket
//!   per key that follows what the store reports and owes what it admits ([`share`]); the debt is charged to the
//!   shared bucket (a debit of `token_return.lua`) before the key's next lease or call, or at shutdown, so the
//!   return to the shared limit is not a second burst on top of the local one (invariant 12 of
//!   docs/ARCHITECTURE.md). A window rule's share is `remaining / processes` of the window the store last
//!   reported and `limit / processes` of each later one; what it admits is written back to the shared window
//!   (`window_charge.lua`) before the key's next store call or at shutdown ([`windows`], invariant 16).
//!
//! A leaky-bucket queue's local share is a local queue per key paced at `rate / expected_processes` after the slots
//! the store booked, whose slots are charged to the shared queue the same way ([`queue`]).
//!
//! Only a store error or a store call's own timeout brings a key here; a caller that merely waited long for a
//! lease in flight is refused locally by the lease engine (invariant 13).

mod presumed;
mod presumed_mode;
mod queue;
mod queue_mode;
mod settle;
mod share;
mod windows;
mod windows_mode;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Reply, TokenBucket, NEVER};
use crate::background::Background;
use crate::clock::Clock;
use crate::compiled::Compiled;
use crate::decision::{Decision, Source};
use crate::error::{FailReason, StoreError};
use crate::fleet::Fleet;
use crate::rule::{Algorithm, FailMode};
use crate::store::call::{Call, ChargedWindow, Members};
use crate::store::guarded::Guarded;
use crate::store::MemoryStore;
use presumed::Charged;
use queue::Queues;
use share::{Debit, Shares};
use windows::WindowShares;

/// Why a key's debt was not settled before its store call.
#[derive(Debug)]
pub(crate) enum Unsettled {
    /// Another caller's charge of the key is in flight.
    Busy,
    /// The key was just charged: its store calls wait this long more, so that the other processes, which come
    /// back from the outage on their own clocks, charge theirs before anyone is granted what they sold.
    Held(Duration),
    /// The charge failed with the store's error; the tokens stay owed.
    Failed(StoreError),
}

impl Unsettled {
    /// How long the caller should be refused, locally, before trying again; `None` for a failed charge.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy => Some(Duration::from_millis(1)),
            Self::Held(left) => Some(*left),
            Self::Failed(_) => None,
        }
    }
}

/// The fail modes' state: the local shares and what they owe.
#[derive(Debug)]
pub(crate) struct Fallback {
    /// The rules' fleets: the local share is `1 / processes` of a rule's limits, and after an outage its keys
    /// are held until the fleet has charged what it admitted alone.
    pub(crate) fleet: Arc<Fleet>,
    /// The token buckets' local shares and their debts.
    buckets: Shares,
    /// The window rules' local shares and what they owe.
    window_shares: WindowShares,
    /// The leaky-bucket queues' local queues and what they owe.
    queues: Queues,
    /// The keys charged what the fleet presumed after an outage.
    charged: Charged,
    /// The other algorithms' local shares, in process.
    windows: MemoryStore,
    /// Unique members of the local share's sliding-log and leaky-bucket calls.
    members: Arc<Members>,
    /// Decisions made by `fail_mode`, per [`FailReason`].
    decided: [AtomicU64; 3],
    clock: Arc<dyn Clock>,
    store: Arc<Guarded>,
    background: Arc<Background>,
}

impl Fallback {
    /// The fail modes over `store`, sharing each rule's limits among its `fleet`, remembering at most `max_keys`
    /// shares per kind; the other algorithms' shares live in `windows`.
    pub(crate) fn new(
        (store, clock): (Arc<Guarded>, Arc<dyn Clock>),
        background: Arc<Background>,
        (members, fleet): (Arc<Members>, Arc<Fleet>),
        windows: MemoryStore,
        max_keys: usize,
    ) -> Self {
        Self {
            fleet,
            buckets: Shares::new(max_keys),
            window_shares: WindowShares::new(max_keys, clock.as_ref()),
            queues: Queues::new(max_keys),
            charged: Charged::new(max_keys),
            windows,
            members,
            decided: Default::default(),
            clock,
            store,
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

    fn now_ms(&self) -> u64 {
        self.clock.now_ns() / 1_000_000
    }

    /// Counts a decision of `compiled`'s fail mode for `reason`; `false` when the limiter is shutting down:
    /// what a local share admitted now could not be charged any more, so nothing is admitted alone.
    fn fail_over(&self, compiled: &Compiled, reason: FailReason) -> bool {
        self.decided[reason as usize].fetch_add(1, Ordering::Relaxed);
        compiled.metrics.fail_mode[reason as usize].increment(1);
        !self.background.is_closed()
    }

    /// Decides a check of `cost` tokens of `store_key` by the fail mode of `compiled` (whose limits for the key
    /// are `algorithm`) because the store failed, for `reason`.
    pub(crate) fn decide(
        &self,
        compiled: &Compiled,
        algorithm: &Algorithm,
        store_key: &str,
        cost: u64,
        reason: FailReason,
    ) -> Decision {
        if !self.fail_over(compiled, reason) {
            return Decision::bare(false, Duration::ZERO, Source::Fallback);
        }
        let refused = Decision::bare(false, self.store.timeouts.backoff, Source::Fallback);
        match compiled.fail_mode {
            FailMode::Open => Decision::bare(true, Duration::ZERO, Source::Fallback),
            FailMode::Closed => refused,
            FailMode::Local => match self.alone(compiled, algorithm, store_key, cost, reason) {
                Some(reply) => Decision::from_reply(&reply, cost, Source::Fallback),
                None => refused,
            },
        }
    }

    /// What `fail_mode = "local"` answers for `cost` tokens of `store_key` (whose limits are `algorithm`),
    /// decided alone because the store failed for `reason`: the token bucket's share, the window's share, the
    /// key's local queue (a check waits for nothing). `None`: refused for the back-off (nothing may be admitted
    /// alone, or never). A process the rule's roster never answered sells nothing alone: it is not counted, so
    /// a hold would neither wait for its debt nor presume it, and it does not know its share.
    fn alone(
        &self,
        compiled: &Compiled,
        algorithm: &Algorithm,
        store_key: &str,
        cost: u64,
        reason: FailReason,
    ) -> Option<Reply> {
        if !self.fleet.answered(&compiled.rule.name) {
            return None;
        }
        let processes = self.processes(&compiled.rule.name);
        let reply = match algorithm {
            Algorithm::TokenBucket { bucket, .. } => self
                .buckets
                .take(store_key, (*bucket, processes), cost, self.now_ms())
                .ok_or(()),
            // One failed call while the breaker is closed: the other processes most likely reach the
            // store, and a slot booked or a window's token admitted alone would come beside theirs.
            Algorithm::LeakyBucket { .. }
            | Algorithm::FixedWindow { .. }
            | Algorithm::SlidingWindow { .. }
            | Algorithm::SlidingLog { .. }
                if !Self::alone_after(reason) =>
            {
                Err(())
            }
            Algorithm::LeakyBucket { .. } => {
                // The key's local queue, the one `acquire` reserves in (a check waits for nothing).
                let call = Call::check(algorithm, store_key, cost, 1, &self.members);
                self.run_local(&call).map_err(|_| ())
            }
            other => match ChargedWindow::of(other) {
                // Invariant 16: this process's share of what the window had left, written back later.
                Some(window) => {
                    let now = self.now_ms();
                    (self.window_shares.take(store_key, &window, cost, processes, now)).ok_or(())
                }
                None => {
                    let call = Call::check(algorithm, store_key, cost, processes, &self.members);
                    self.windows.run_sync(&call).map_err(|_| ())
                }
            },
        };
        reply.ok().filter(|r| r.retry_after_ms != NEVER || r.granted > 0)
    }

    /// Whether a leaky-bucket queue books slots, or a window rule admits, alone after a store failure for
    /// `reason`: only once the circuit breaker is open (the store failed repeatedly: an outage). A single error or
    /// timeout while the breaker is closed is refused instead, for a back-off: the other processes most likely still
    /// reach the store, and a slot booked alone then would run beside the shared schedule at its full rate, over
    /// `rate × W + 1`, and a window's share would be admitted beside what the store grants the others (invariant
    /// 16). Token buckets keep deciding from their share, which the store's answers keep at this process's part of
    /// what is left.
    pub(crate) fn alone_after(reason: FailReason) -> bool {
        reason == FailReason::CircuitOpen
    }

    /// Runs a reservation (of `acquire`) or its hand-back in this process's local share: a leaky bucket's in the
    /// key's local queue, which the call names with the shared queue's parameters ([`queue`]).
    ///
    /// # Errors
    /// The in-process store's error for arguments out of range.
    pub(crate) fn run_local(&self, call: &Call) -> Result<Reply, StoreError> {
        match self.run_local_queue(call) {
            Some(reply) => Ok(reply),
            None => self.windows.run_sync(call),
        }
    }

    /// The store answered for `store_key` of a `local` rule with `remaining` tokens left in its shared
    /// `bucket`: the key's local share is lowered to this process's part of that.
    fn report(&self, store_key: &str, bucket: TokenBucket, remaining: u64) {
        let processes = self.processes(split_store_key(store_key).0);
        self.buckets
            .report(store_key, (bucket, processes), remaining, self.now_ms());
    }

    /// Runs `call`, a store call for `store_key` whose limits are `algorithm` under fail mode `mode`, with the
    /// fail mode's bookkeeping around it (invariants 12, 16 and 19): under `local` the rule joins its fleet
    /// first ([`Fleet::join`]); what the key's local share owes is charged ([`Fallback::settle`],
    /// [`Fallback::settle_queue`]); a rule whose fleet is held after an outage is not called, and what the hold
    /// presumed is charged to the key first ([`Fallback::presume`]); a token bucket's
    /// answer under `local` lowers the key's share ([`Fallback::report`]) and a leaky bucket's tells where its
    /// local queue would start ([`Fallback::seen_queue`]).
    ///
    /// # Errors
    /// As [`Fallback::settle`]; [`Unsettled::Held`] while the rule's fleet is held; [`Unsettled::Failed`] with
    /// the call's own store error.
    pub(crate) async fn run(
        self: &Arc<Self>,
        (mode, algorithm): (FailMode, &Algorithm),
        store_key: &str,
        call: &Call,
    ) -> Result<Reply, Unsettled> {
        let rule = split_store_key(store_key).0;
        if mode == FailMode::Local {
            // Invariant 19: a process that just started learns the fleet's count and any hold first; one the
            // roster never answered decides by its fail mode, which sells nothing alone for it.
            self.fleet.join(rule, algorithm).await.map_err(Unsettled::Failed)?;
        }
        self.settle(store_key, algorithm).await?;
        let window = ChargedWindow::of(algorithm);
        self.settle_window(store_key, window.as_ref()).await?;
        self.settle_queue(store_key, algorithm).await?;
        if mode == FailMode::Local {
            // After an outage, no key of the rule is decided by the store until the fleet has charged what it
            // admitted alone (or the hold's bound passed): the store would grant again what the others sold.
            if let Some(ms) = self.fleet.held(rule) {
                return Err(Unsettled::Held(Duration::from_millis(ms)));
            }
            self.presume(store_key, algorithm).await?;
        }
        let reply = self.store.run(call).await.map_err(Unsettled::Failed)?;
        match (mode, algorithm, window) {
            (FailMode::Local, Algorithm::TokenBucket { bucket, .. }, _) => {
                self.report(store_key, *bucket, reply.remaining);
            }
            (FailMode::Local, Algorithm::LeakyBucket { .. }, _) => self.seen_queue(store_key, algorithm, &reply),
            (FailMode::Local, _, Some(window)) => self.window_shares.report(store_key, &window, &reply, self.now_ms()),
            _ => {}
        }
        Ok(reply)
    }

    /// Before a store call for `store_key` (whose limits are now `algorithm`): charges the shared bucket with what
    /// the key's local share admitted alone, so that the call's answer already counts it. The charge runs as a
    /// task of its own, so a caller dropped meanwhile loses nothing. Nothing owed (the common case) costs one
    /// load. A debt of a key that is no longer a token bucket (its rule was reloaded with another algorithm) is
    /// dropped: charging it would corrupt the new algorithm's state.
    ///
    /// # Errors
    /// [`Unsettled::Busy`] while another caller's charge of the key is in flight (the caller is refused briefly:
    /// an answer now would not count that charge); [`Unsettled::Failed`] with the debit's store error (the
    /// tokens stay owed; the caller's call would most likely fail too).
    async fn settle(self: &Arc<Self>, store_key: &str, algorithm: &Algorithm) -> Result<(), Unsettled> {
        if let Some(ms) = self.buckets.held(store_key, self.now_ms()) {
            return Err(Unsettled::Held(Duration::from_millis(ms)));
        }
        if !self.buckets.any_owed() {
            return Ok(());
        }
        let members = &self.members;
        let debit = self
            .buckets
            .take_owed(store_key, || members.next())
            .map_err(|_| Unsettled::Busy)?;
        let Some(debit) = debit else {
            return Ok(());
        };
        let Algorithm::TokenBucket { bucket, .. } = algorithm else {
            let tokens = self.buckets.forgive(store_key);
            tracing::warn!(key = %store_key, tokens, "a debt of a key that is no longer a token bucket is dropped");
            return Ok(());
        };
        let (this, key, bucket) = (self.clone(), store_key.to_owned(), *bucket);
        let hold = self.store.timeouts.recovery_spread();
        let charge = async move {
            let charged = this.charge(&key, bucket, &debit, false).await;
            if charged.is_ok() {
                // Charged: hold the key while the other processes come back and charge theirs.
                let until = this
                    .now_ms()
                    .saturating_add(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX));
                this.buckets.hold(&key, until);
            }
            charged
        };
        let charging = self.background.spawn(charge);
        match tokio::time::timeout(self.store.timeouts.lease, charging).await {
            Ok(Ok(Ok(()))) => Err(Unsettled::Held(hold)),
            Ok(Ok(Err(error))) => Err(Unsettled::Failed(error)),
            Ok(Err(_)) => Err(Unsettled::Failed(StoreError::timeout("token_return", Duration::ZERO))),
            // Slower than a lease (a slow link): the charge goes on, and the key's callers are refused briefly
            // meanwhile, as while any charge of it is in flight.
            Err(_) => Err(Unsettled::Busy),
        }
    }

    /// Sends `debit`, owed by `store_key`, to its shared bucket with the parameters it has now (`bucket`): a debit
    /// of `token_return.lua` with its mark, which may put the bucket in debt down to −capacity and is applied once
    /// however often it is sent; what the bucket cannot absorb yet stays owed for the next debit. A debit whose
    /// answer is lost (an error, a timeout) stays pending and is sent again as it is. `past_breaker` sends it even
    /// while the circuit breaker is open (at shutdown, the last chance).
    async fn charge(
        &self,
        store_key: &str,
        bucket: TokenBucket,
        debit: &Debit,
        past_breaker: bool,
    ) -> Result<(), StoreError> {
        // Longer than a lease: a debit is applied once however often it is sent, so it may wait for a slow link.
        // The bucket is held for the recovery spread once charged, refusing every process's takes (invariant 19):
        // the others that sold alone come back on their own clocks, and none may lease what they sold before
        // their debits land, not even a process that owed nothing and does not beat soon.
        let hold_ms = u64::try_from(self.store.timeouts.recovery_spread().as_millis()).unwrap_or(u64::MAX);
        let call =
            Call::debit(store_key, bucket, debit.tokens, &debit.id, hold_ms).with_timeout(self.store.timeouts.debit);
        match self.run_charge(&call, past_breaker).await {
            Ok(reply) => {
                let (tokens, carried) = (debit.tokens, debit.tokens.saturating_sub(reply.granted));
                tracing::debug!(key = %store_key, tokens, carried, "charged what fail_mode local admitted");
                self.buckets.settled(store_key, Some(reply.granted));
                self.report(store_key, bucket, reply.remaining);
                Ok(())
            }
            Err(error) => {
                self.buckets.settled(store_key, None);
                Err(error)
            }
        }
    }

    /// Runs `call`, a charge of what a local share admitted alone, through the circuit breaker, or past it
    /// (`past_breaker`: at shutdown, the last chance).
    ///
    /// # Errors
    /// The store's error.
    async fn run_charge(&self, call: &Call, past_breaker: bool) -> Result<Reply, StoreError> {
        if past_breaker {
            self.store.run_past_breaker(call).await
        } else {
            self.store.run(call).await
        }
    }

    /// Forgets the local shares untouched for `idle` that owe nothing (the sweeper's pass).
    pub(crate) fn sweep(&self, idle: Duration) {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        self.buckets.sweep(self.now_ms(), idle_ms);
        self.window_shares.sweep(self.now_ms(), idle_ms);
        self.queues.sweep(self.now_ms(), idle_ms);
        self.charged.sweep(self.now_ms());
    }

    /// Charges everything owed, for shutdown: past the circuit breaker (right after an outage it is still open),
    /// again and again until nothing is owed or `patience` has passed. What is still owed then is given up: each
    /// key is logged (WARN, with its rule, key and tokens) and its tokens are passed to `dropped(rule, tokens)`,
    /// which counts them in `tokenlease_debt_dropped_tokens_total`: the fleet may have admitted that many over
    /// the limit.
    pub(crate) async fn settle_all(self: &Arc<Self>, patience: Duration, dropped: impl Fn(&str, u64)) {
        let deadline = tokio::time::Instant::now() + patience;
        while self.buckets.any_owed() {
            let mut charges = tokio::task::JoinSet::new();
            for (key, _) in self.buckets.owing_keys() {
                let members = &self.members;
                if let Ok(Some(debit)) = self.buckets.take_owed(&key, || members.next()) {
                    let this = self.clone();
                    charges.spawn(async move { this.charge(&key, debit.bucket, &debit, true).await });
                }
            }
            while charges.join_next().await.is_some() {}
            if !self.buckets.any_owed() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                for (key, _) in self.buckets.owing_keys() {
                    let tokens = self.buckets.forgive(&key);
                    let (rule, user_key) = split_store_key(&key);
                    tracing::warn!(
                        rule,
                        key = user_key,
                        tokens,
                        waited = ?patience,
                        "shut down owing what fail_mode local admitted alone: the store did not take the charge, \
                         so the fleet may have admitted this many tokens over the limit"
                    );
                    dropped(rule, tokens);
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The rule and the key of a store key `{prefix}:{rule:key}` (rule names hold no `:`); the whole key as both when
/// it is not one.
fn split_store_key(store_key: &str) -> (&str, &str) {
    store_key
        .split_once('{')
        .and_then(|(_, tagged)| tagged.strip_suffix('}'))
        .and_then(|inner| inner.split_once(':'))
        .unwrap_or((store_key, store_key))
}
