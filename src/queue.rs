//! Waiting for a slot: [`crate::Limiter::acquire`]. A leaky-bucket rule keeps one schedule for all processes
//! (`lua/leaky_bucket.lua`, GCRA's theoretical arrival time); a token-bucket rule takes its tokens now and lets
//! the next caller wait for the debt (Guava's SmoothBursty "consume now, pay later", `lua/token_acquire.lua`).
//! Callers of one process reserve in the order they came; a caller that gives up hands its slot back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::compiled::{Abandoned, Compiled, Line};
use crate::decision::{from_protocol_ms, Permit, Source};
use crate::error::Error;
use crate::fallback::Fallback;
use crate::refusals::Refusals;
use crate::rule::Algorithm;
use crate::store::call::{store_key, Call, Members};
use crate::store::guarded::Guarded;

/// What queueing needs: the store, the fail modes, unique members, background tasks.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    pub(crate) store: Arc<Guarded>,
    pub(crate) fallback: Arc<Fallback>,
    pub(crate) members: Arc<Members>,
    pub(crate) background: Arc<Background>,
    pub(crate) key_prefix: String,
    /// The refusals this process remembers: a key this process reserves on, or hands a slot back to, is asked
    /// again at its next check.
    pub(crate) refusals: Arc<Refusals>,
}

/// Counts a caller in its rule's queue depth while it lives.
struct Waiting<'a>(&'a Compiled);

impl<'a> Waiting<'a> {
    fn new(compiled: &'a Compiled) -> Self {
        let n = compiled.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        compiled.metrics.queue_depth.set(n as f64);
        Self(compiled)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let n = self.0.waiting.fetch_sub(1, Ordering::Relaxed) - 1;
        self.0.metrics.queue_depth.set(n as f64);
    }
}

/// A slot reserved in the store whose caller may still give up; dropped unfinished, it hands the slot back
/// (`leaky_return.lua`: only while nobody is queued behind it), and a leaky-bucket slot the store keeps is offered
/// to this process's next callers of the key ([`Line`]).
struct Reserved<'a> {
    queue: &'a Queue,
    call: &'a Call,
    /// The rule's generation and the caller's key, whose remembered refusal a slot handed back makes stale.
    key: (u64, &'a str),
    line: Arc<Line>,
    /// The slot, when it may be taken over (leaky buckets).
    slot: Option<Abandoned>,
    done: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some(back) = self.call.undo() else { return };
        // A token bucket's tokens go back once, however often the call is sent.
        let back = back.once(self.queue.members.next(), self.queue.store.timings.mark);
        let store = self.queue.store.clone();
        let (line, slot) = (self.line.clone(), self.slot);
        let (refusals, rule, key) = (self.queue.refusals.clone(), self.key.0, self.key.1.to_owned());
        if tokio::runtime::Handle::try_current().is_ok() {
            self.queue.background.spawn(async move {
                match (store.run(&back).await, slot) {
                    // Someone is queued behind it: the slot stays reserved; a later caller of this process takes
                    // it over rather than queueing behind it.
                    (Ok(reply), Some(slot)) if reply.granted == 0 => line.abandon(slot),
                    (Ok(_), _) => refusals.forget(rule, &key),
                    // No answer: the store may have taken the slot back (a reply lost after the script ran), and
                    // another process may book it; used here too, it would run twice. It is given up.
                    (Err(error), _) => tracing::debug!(%error, "could not hand a queue slot back"),
                }
            });
        }
    }
}

/// A slot taken over from a caller who gave it up; dropped unfinished, it is offered again.
struct Resumed<'a> {
    line: &'a Line,
    slot: Abandoned,
    done: bool,
}

impl Drop for Resumed<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.line.abandon(self.slot);
        }
    }
}

impl Queue {
    /// Waits for `cost` tokens of `key` under `compiled`, at most `max` (and at most the rule's bound). The
    /// caller has validated the key and the cost.
    ///
    /// # Errors
    /// [`Error::QueueFull`] when the wait would exceed the bound; [`Error::InvalidArgument`] for a rule that is
    /// neither a leaky nor a token bucket; [`Error::Store`] when the store fails under `fail_mode = "closed"` or `"local"`.
    pub(crate) async fn acquire(
        &self,
        compiled: &Compiled,
        key: &str,
        cost: u64,
        max: Option<Duration>,
    ) -> Result<Permit, Error> {
        let rule = &compiled.rule.name;
        let algorithm = compiled.rule.algorithm_for(key).clone();
        // The rule's bound on the wait: a leaky bucket's max_wait; for a token bucket, the time to refill its
        // whole capacity (a caller never waits behind more than one full burst of debt).
        let rule_max_ms = match &algorithm {
            Algorithm::LeakyBucket { max_wait_ms, .. } => *max_wait_ms,
            Algorithm::TokenBucket { bucket, .. } if bucket.rate > 0 => {
                bucket.capacity.saturating_mul(bucket.per_ms).div_ceil(bucket.rate)
            }
            _ => 0, // refused below: there is no reservation for it
        };
        let max_wait_ms = max.map_or(rule_max_ms, |m| {
            u64::try_from(m.as_millis()).unwrap_or(u64::MAX).min(rule_max_ms)
        });
        let store_key = store_key(&self.key_prefix, rule, key);
        let members = &self.members;
        let call = Call::reservation(&algorithm, &store_key, cost, max_wait_ms, members)
            .ok_or_else(|| Error::InvalidArgument {
                name: "rule",
                reason: format!(
                    "acquire needs a leaky_bucket or token_bucket rule; `{rule}` is {}",
                    algorithm.name()
                ),
            })?
            .adopted(compiled.adopted_ms);
        let started = tokio::time::Instant::now();
        let line = compiled.queues.entry(key.to_owned()).or_default().clone();
        let waiting = Waiting::new(compiled);
        // First in, first out: reservations of this process's callers are made in the order they came.
        let turn = line.turn.lock().await;
        let recyclable = matches!(algorithm, Algorithm::LeakyBucket { .. });
        if recyclable {
            // A slot another caller of this process gave up, still ahead and within this caller's bound: taken
            // over instead of a new one behind it.
            if let Some(slot) = line.take_over(cost, Duration::from_millis(max_wait_ms)) {
                drop(turn);
                let mut resumed = Resumed {
                    line: &line,
                    slot,
                    done: false,
                };
                tokio::time::sleep_until(slot.at).await;
                resumed.done = true;
                drop(waiting);
                return Ok(self.granted(compiled, started, cost, slot.source));
            }
        }
        let result = self.store.run(&call).await;
        let (reply, source) = match result {
            Ok(reply) => {
                // The key's schedule moved: a check refused before asks the store again.
                self.refusals.forget(compiled.generation, key);
                (reply, self.store.source())
            }
            Err(error) => {
                let reply = self.fallback.reserve(compiled, cost, error)?;
                (reply, Source::Fallback)
            }
        };
        drop(turn);
        if reply.granted < cost {
            // A full queue is a refusal: counted as a rejected decision (a 429 at the sidecar).
            compiled.metrics.decision(false, source);
            return Err(Error::QueueFull {
                rule: rule.to_owned(),
                max_wait: Duration::from_millis(max_wait_ms),
                retry_after: from_protocol_ms(reply.retry_after_ms),
            });
        }
        let wait = from_protocol_ms(reply.retry_after_ms);
        if !wait.is_zero() {
            // Dropped while sleeping: hand the slot back if nobody queued behind it, else offer it to this
            // process's next callers.
            let at = tokio::time::Instant::now() + wait;
            let mut reserved = Reserved {
                queue: self,
                call: &call,
                key: (compiled.generation, key),
                line: line.clone(),
                slot: recyclable.then_some(Abandoned { at, cost, source }),
                done: false,
            };
            tokio::time::sleep_until(at).await;
            reserved.done = true;
        }
        drop(line);
        compiled
            .queues
            .remove_if(key, |_, q| Arc::strong_count(q) == 1 && q.is_idle());
        drop(waiting);
        Ok(self.granted(compiled, started, cost, source))
    }

    /// The permit of a caller that waited since `started`, counted in the rule's metrics.
    fn granted(&self, compiled: &Compiled, started: tokio::time::Instant, cost: u64, source: Source) -> Permit {
        let waited = started.elapsed();
        compiled.metrics.queue_wait.record(waited.as_secs_f64());
        compiled.metrics.decision(true, source);
        Permit { waited, cost, source }
    }
}
