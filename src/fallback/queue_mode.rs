//! The fail mode of leaky-bucket keys, the [`Fallback`]'s side of the local queues (`queue.rs`): a call run in
//! this process's local queue, the charge of what it booked before the key's next store call, and the charges
//! at shutdown.

use std::sync::Arc;
use std::time::Duration;

use super::share::Busy;
use super::{Fallback, Unsettled};
use crate::algorithm::{LeakyBucket, Reply};
use crate::compiled::Compiled;
use crate::decision::to_protocol_ms;
use crate::error::{Error, FailReason, StoreError};
use crate::rule::{Algorithm, FailMode};
use crate::store::call::{Call, Op};

impl Fallback {
    /// A reservation of `acquire` (`call`, for `cost` tokens of `store_key`, whose limits are `algorithm`)
    /// decided by `compiled`'s fail mode because the store failed with `error`, as the protocol's reply: `open`
    /// grants it at once; a token bucket under `local` takes its tokens from the key's one local share, the one
    /// checks use (taken at once or refused, never paid later alone); a queue under `local` is refused for the
    /// back-off after one failed call while the breaker is closed, and otherwise booked in the key's local queue,
    /// paced at this process's share after the slots the store booked and charged when the store answers.
    ///
    /// # Errors
    /// [`Error::Store`] under `closed`; the local queue's error.
    pub(crate) fn reserve_alone(
        &self,
        compiled: &Compiled,
        algorithm: &Algorithm,
        store_key: &str,
        (call, cost): (&Call, u64),
        error: StoreError,
    ) -> Result<Reply, Error> {
        let refused = |retry_after_ms| Reply {
            granted: 0,
            remaining: 0,
            retry_after_ms,
            reset_after_ms: 0,
            stamp: 0,
        };
        let backoff = refused(to_protocol_ms(self.store.timeouts.backoff));
        let reason = FailReason::of(&error);
        match compiled.fail_mode {
            FailMode::Open => Ok(Reply {
                granted: cost,
                ..refused(0)
            }),
            FailMode::Closed => Err(Error::Store(error)),
            // The share grants all of `cost` or nothing (its retry then says when); only `granted` and
            // `retry_after_ms` of the reply are read.
            FailMode::Local if matches!(algorithm, Algorithm::TokenBucket { .. }) => {
                if !self.fail_over(compiled, reason) {
                    return Ok(refused(0));
                }
                Ok(self
                    .alone(compiled, algorithm, store_key, cost, reason)
                    .unwrap_or(backoff))
            }
            // Alone only in an outage, and only when counted in the fleet (as [`Fallback::alone`]).
            FailMode::Local if !Self::alone_after(reason) || !self.fleet.answered(&compiled.rule.name) => Ok(backoff),
            FailMode::Local => Ok(self.run_local(call)?),
        }
    }

    /// Runs a call of `acquire` or `check` on a leaky-bucket key in this process's local queue (the call carries
    /// the shared queue's parameters): a reservation ([`Queues::reserve`], refused with the back-off when the key
    /// cannot be remembered or the limiter is shutting down) or a hand-back ([`Queues::give_back`]). `None` for
    /// other calls.
    pub(super) fn run_local_queue(&self, call: &Call) -> Option<Reply> {
        let now = self.now_ms();
        let processes = self.processes(super::split_store_key(&call.key).0);
        match &call.op {
            Op::LeakyBucket {
                queue,
                cost,
                max_wait_ms,
                member,
            } => {
                let reserved = if self.background.is_closed() {
                    // Shutting down: what the local queue booked now could not be charged any more.
                    None
                } else {
                    let key = call.key.as_str();
                    self.queues
                        .reserve(key, (*queue, processes), (*cost, *max_wait_ms), member, now)
                };
                let backoff = u64::try_from(self.store.timeouts.backoff.as_millis()).unwrap_or(u64::MAX);
                Some(reserved.unwrap_or(Reply {
                    granted: 0,
                    remaining: 0,
                    retry_after_ms: crate::algorithm::ms(backoff),
                    reset_after_ms: 0,
                    stamp: 0,
                }))
            }
            Op::LeakyReturn { queue, cost, member } => {
                Some(
                    self.queues
                        .give_back(&call.key, (*queue, processes), *cost, member, now),
                )
            }
            _ => None,
        }
    }

    /// The store answered `reply` for `store_key` of a leaky-bucket rule under `local`: remembers where the
    /// shared schedule ends, where the key's local queue would start.
    pub(super) fn seen_queue(&self, store_key: &str, algorithm: &Algorithm, reply: &Reply) {
        if let Algorithm::LeakyBucket { rate, per_ms, .. } = algorithm {
            let queue = LeakyBucket {
                rate: *rate,
                per_ms: *per_ms,
            };
            self.queues.seen(store_key, queue, reply.reset_after_ms, self.now_ms());
        }
    }

    /// Before a store call for `store_key` (whose limits are now `algorithm`): charges the shared queue with the
    /// slots the key's local queue booked alone, so that the call's answer already counts them, then holds the
    /// key for the recovery spread. The charge runs as a task of its own, so a caller dropped meanwhile loses
    /// nothing. Nothing owed (the common case) costs one load. What a key that is no longer a leaky bucket owes
    /// is dropped: charging it would corrupt the new algorithm's state.
    ///
    /// # Errors
    /// [`Unsettled::Held`] while the key is held after its charge (this one's included);
    /// [`Unsettled::Busy`] while another caller's charge of the key is in flight; [`Unsettled::Failed`] with the
    /// charge's store error (the slots stay owed).
    pub(super) async fn settle_queue(
        self: &Arc<Self>,
        store_key: &str,
        algorithm: &Algorithm,
    ) -> Result<(), Unsettled> {
        if let Some(ms) = self.queues.held(store_key, self.now_ms()) {
            return Err(Unsettled::Held(Duration::from_millis(ms)));
        }
        if !self.queues.any_owed() {
            return Ok(());
        }
        let owed = self.queues.take_owed(store_key, self.now_ms());
        let Some((owed_to, until_ms)) = owed.map_err(|Busy| Unsettled::Busy)? else {
            return Ok(());
        };
        let Algorithm::LeakyBucket { rate, per_ms, .. } = algorithm else {
            tracing::warn!(key = %store_key, "slots of a key that is no longer a leaky bucket are not charged");
            self.queues.settled(store_key, until_ms, true);
            return Ok(());
        };
        let queue = LeakyBucket {
            rate: *rate,
            per_ms: *per_ms,
        };
        if queue != owed_to {
            tracing::debug!(key = %store_key, "charging local slots booked before a reload at the new rate");
        }
        let (this, key) = (self.clone(), store_key.to_owned());
        let charge = async move { this.charge_queue(&key, queue, until_ms, false).await };
        match self.background.spawn(charge).await {
            Ok(Ok(())) => {
                let hold = self.store.timeouts.recovery_spread();
                let until = self
                    .now_ms()
                    .saturating_add(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX));
                self.queues.hold(store_key, until);
                Err(Unsettled::Held(hold))
            }
            Ok(Err(error)) => Err(Unsettled::Failed(error)),
            Err(_) => Err(Unsettled::Failed(StoreError::timeout("leaky_charge", Duration::ZERO))),
        }
    }

    /// Charges the shared `queue` of `store_key` with local slots that end at `until_ms` (ms of the limiter's
    /// clock): `leaky_charge.lua` with the time left until then, measured when the call is sent.
    /// `past_breaker` sends it even while the circuit breaker is open (at shutdown, the last chance).
    pub(super) async fn charge_queue(
        &self,
        store_key: &str,
        queue: LeakyBucket,
        until_ms: u64,
        past_breaker: bool,
    ) -> Result<(), StoreError> {
        let ahead_ms = until_ms.saturating_sub(self.now_ms());
        // The store's own timeout, as a reservation's: callers wait behind it, and one timed out after Redis
        // applied it is sent again harmlessly.
        let call = Call::charge_queue(store_key, queue, ahead_ms);
        let result = self.run_charge(&call, past_breaker).await;
        match result {
            Ok(reply) => {
                tracing::debug!(key = %store_key, ahead_ms, moved = reply.granted, "charged the local queue's slots");
                self.queues.settled(store_key, until_ms, true);
                self.queues.seen(store_key, queue, reply.reset_after_ms, self.now_ms());
                Ok(())
            }
            Err(error) => {
                self.queues.settled(store_key, until_ms, false);
                Err(error)
            }
        }
    }

    /// Charges every local queue that owes, for shutdown: past the circuit breaker, again and again until
    /// nothing is owed or `patience` has passed; what is still owed then is lost with the process (logged).
    pub(crate) async fn settle_all_queues(self: &Arc<Self>, patience: Duration) {
        let deadline = tokio::time::Instant::now() + patience;
        while self.queues.any_owed() {
            let mut charges = tokio::task::JoinSet::new();
            for key in self.queues.owing_keys() {
                if let Ok(Some((queue, until_ms))) = self.queues.take_owed(&key, self.now_ms()) {
                    let this = self.clone();
                    charges.spawn(async move { this.charge_queue(&key, queue, until_ms, true).await });
                }
            }
            while charges.join_next().await.is_some() {}
            if !self.queues.any_owed() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let keys = self.queues.owing_keys().len();
                tracing::warn!(
                    keys,
                    "shut down owing slots the local queues booked alone: the store did not answer"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
