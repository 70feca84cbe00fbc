//! The fleet as this process sees it: per rule, the live processes its roster in the store counted, and the
//! hold after an outage (invariants 17 and 19 of docs/ARCHITECTURE.md; the roster is
//! [`crate::algorithm::fleet`], `lua/fleet.lua`).
//!
//! A rule joins when this process first calls the store for it: that call waits for the rule's first beat, so
//! a process that just started knows the fleet's count and any hold before it leases. From then on the
//! limiter beats for the rule every [`BEAT`] (every [`BEAT_SOON`] while it is cut off or held), from a task of
//! its own (`limiter/lifecycle.rs`). Until a rule's first beat is answered, its shares divide by the configured
//! `expected_processes`.
//!
//! A hold ends when everyone it waits for has reported, or at its end: this process learns which from the next
//! answer after the end, and does not call the rule's keys before it ([`Fleet::held`]). A hold that ended
//! presuming members answers its [`Presumption`] until it is forgotten; this process keeps the latest, which
//! `fallback/presumed_mode.rs` charges to each key before the key's next store call.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::OnceCell;

use crate::algorithm::fleet::{Beat, Count, Presumption};
use crate::clock::Clock;
use crate::error::{StoreError, StoreErrorKind};
use crate::rule::Algorithm;
use crate::store::call::{roster_key, Call};
use crate::store::guarded::Guarded;
use crate::telemetry;

/// How often a member beats for each of its rules.
pub(crate) const BEAT: Duration = Duration::from_secs(1);

/// How often it beats while cut off from the store or held: it learns soon that the store is back, and that the
/// hold has ended.
pub(crate) const BEAT_SOON: Duration = Duration::from_millis(100);

/// A member heard within this is live: three beats.
const LIVE: Duration = Duration::from_secs(3);

/// A member silent this long missed a beat and a half: it may have been cut off, and a hold waits for it.
const SILENT: Duration = Duration::from_millis(1_500);

/// A member unheard this long is forgotten (it exited).
const KEEP: Duration = Duration::from_secs(60);

/// The shortest hold: a beat, for the members that were cut off to notice the store is back and report, and a
/// beat more for their charges.
const MIN_HOLD: Duration = Duration::from_secs(2);

/// What this process knows of one rule's fleet.
#[derive(Debug)]
pub(crate) struct Seen {
    rule: String,
    /// The rule's count: the live processes of the first answered beat, then of each answer that is not lower,
    /// and of a lower answer only once answers have shown it for [`LIVE`] ([`Seen::count`]); 0 before the first
    /// answer.
    processes: AtomicU64,
    /// When answers began to count fewer processes than [`Seen::processes`] (ms of the limiter's clock); 0 while
    /// they do not.
    fewer_since_ms: AtomicU64,
    /// The hold's end at the last beat, in ms of the limiter's clock: when the last answer's hold ends, or the
    /// answer's own time when it reported none.
    held_until_ms: AtomicU64,
    /// The latest presumption answered, its `at_ms` when this process first heard it (ms of the limiter's
    /// clock); epoch 0: none.
    presumed: Mutex<Presumption>,
    /// The latest presumption's epoch (0: none), read without the lock.
    presumed_epoch: AtomicU64,
    /// The store's failure count when the last beat was answered: when it moved since, this process comes back
    /// from an outage. `u64::MAX` before the first answer.
    beaten_at_failures: AtomicU64,
    /// When the last beat was answered, in ms of the limiter's clock (0 before the first).
    answered_at_ms: AtomicU64,
    /// The longest refill from empty of the rule's keys seen so far (ms), which a hold's presumed terms use;
    /// -1 while none presumes ([`refill_ms`]).
    refill_ms: AtomicI64,
    /// The first beat, which the rule's first store call waits for.
    joined: OnceCell<()>,
    /// The last failed beat's kind and message, which [`Fleet::join`] answers while none was answered.
    failed: Mutex<Option<(StoreErrorKind, String)>>,
    gauge: metrics::Gauge,
}

impl Seen {
    /// Whether one of this process's beats of the rule was answered.
    fn is_answered(&self) -> bool {
        self.answered_at_ms.load(Ordering::Acquire) > 0
    }

    /// Takes `answered`, the live count of a beat answered at `now_ms`, into the rule's count, and returns the
    /// count. More processes (or the first answer) count at once; fewer only once the answers have counted fewer
    /// for [`LIVE`]. After an outage the first process back finds the others unheard for longer than [`LIVE`]
    /// (their beats failed too) and is answered a count of one: taken at once, its local share would be the whole
    /// bucket's level while its calls still fail (a share's level is its part of the shared level, so dividing by
    /// fewer processes multiplies what it may sell alone), beside the others' shares. The others beat within
    /// a beat or two and the count is back before the lower one would be taken. A member that really left is
    /// counted [`LIVE`] longer: the others' shares are smaller meanwhile, never larger. The lower answers must
    /// follow each other: after a gap of more than two beats without an answer (an outage, a stall) they start
    /// over, so a lower answer before an outage and one after it are not taken as [`LIVE`] of fewer processes.
    /// Called before `answered_at_ms` records this answer.
    fn count(&self, answered: u64, now_ms: u64) -> u64 {
        let current = self.processes.load(Ordering::Acquire);
        if current == 0 || answered >= current {
            self.fewer_since_ms.store(0, Ordering::Release);
            self.processes.store(answered, Ordering::Release);
            return answered;
        }
        let previous = self.answered_at_ms.load(Ordering::Acquire);
        let gap = now_ms.saturating_sub(previous) > millis(BEAT).saturating_mul(2);
        let since = match self.fewer_since_ms.load(Ordering::Acquire) {
            since if since != 0 && !gap => since,
            _ => {
                self.fewer_since_ms.store(now_ms.max(1), Ordering::Release);
                now_ms
            }
        };
        if now_ms.saturating_sub(since) < millis(LIVE) {
            return current;
        }
        self.fewer_since_ms.store(0, Ordering::Release);
        self.processes.store(answered, Ordering::Release);
        answered
    }

    /// The rule's name.
    pub(crate) fn rule(&self) -> &str {
        &self.rule
    }
}

/// This process's view of its rules' fleets.
#[derive(Debug)]
pub(crate) struct Fleet {
    rules: DashMap<String, Arc<Seen>, foldhash::fast::RandomState>,
    /// This limiter's member in the rosters.
    member: String,
    key_prefix: String,
    /// The count assumed before a rule's first beat is answered (`expected_processes`).
    assumed: u64,
    store: Arc<Guarded>,
    clock: Arc<dyn Clock>,
    /// Beats sent (each a store call).
    beats: AtomicU64,
    /// Set by [`Fleet::leave`] once no beat is in flight: a beat after it would put this process back on the
    /// rosters it left (counted, and presumed by the next hold). Beats hold it for reading while they run.
    left: tokio::sync::RwLock<bool>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Fleet {
    /// The fleets of a limiter whose member is `member`, keeping rosters under `key_prefix`, assuming `assumed`
    /// processes until a rule's roster answers.
    pub(crate) fn new(
        (member, key_prefix): (String, String),
        assumed: u64,
        store: Arc<Guarded>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            rules: DashMap::default(),
            member,
            key_prefix,
            assumed: assumed.max(1),
            store,
            clock,
            beats: AtomicU64::new(0),
            left: tokio::sync::RwLock::new(false),
        }
    }

    /// Beats sent so far (store calls of their own).
    pub(crate) fn beats(&self) -> u64 {
        self.beats.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ns() / 1_000_000
    }

    /// The live processes of `rule`'s fleet (the divisor of its shares): the roster's count as the beats answered
    /// it (a lower one once shown for [`LIVE`], [`Seen::count`]), or the assumed count before one was answered.
    pub(crate) fn processes(&self, rule: &str) -> u64 {
        match self.rules.get(rule).map(|s| s.processes.load(Ordering::Acquire)) {
            Some(n) if n > 0 => n,
            _ => self.assumed,
        }
    }

    /// [`Fleet::held`] for `seen`'s rule.
    fn held_by(&self, seen: &Seen) -> Option<u64> {
        let until = seen.held_until_ms.load(Ordering::Acquire);
        let now = self.now_ms();
        if until > now {
            return Some(until - now);
        }
        let answered = seen.answered_at_ms.load(Ordering::Acquire);
        let grace = millis(self.store.timeouts.debit).saturating_add(millis(BEAT_SOON).saturating_mul(2));
        (answered < until && now < until.saturating_add(grace)).then(|| millis(BEAT_SOON))
    }

    /// Joins `rule`'s fleet, whose key is now decided by `algorithm` (its refill goes into the hold's presumed
    /// terms, [`refill_ms`]): the first call waits for the rule's first beat (one store call, once; a failed one
    /// is not retried here, the beats go on in the background, every [`BEAT_SOON`] until one is answered).
    ///
    /// # Errors
    /// While no beat of the rule was answered, the last beat's failure (kind and message, script `fleet`): the
    /// process is not in the roster, knows neither the fleet's count nor whether a hold is on, and so neither
    /// calls the store for a `local` rule nor sells alone (invariant 19).
    pub(crate) async fn join(&self, rule: &str, algorithm: &Algorithm) -> Result<(), StoreError> {
        let seen = self.seen(rule);
        if let Some(ms) = refill_ms(algorithm) {
            seen.refill_ms
                .fetch_max(i64::try_from(ms).unwrap_or(i64::MAX), Ordering::AcqRel);
        }
        seen.joined
            .get_or_init(|| async {
                // A process that just started owes nothing.
                let _ = self.beat(&seen, true).await;
            })
            .await;
        if seen.is_answered() {
            return Ok(());
        }
        let failed = seen.failed.lock().unwrap_or_else(PoisonError::into_inner);
        let (kind, message) = failed
            .clone()
            .unwrap_or((StoreErrorKind::Other, "no beat answered yet".into()));
        Err(beat_error(
            kind,
            format!("the fleet's roster has not answered this process: {message}"),
        ))
    }

    fn seen(&self, rule: &str) -> Arc<Seen> {
        if let Some(seen) = self.rules.get(rule) {
            return seen.clone();
        }
        let seen = self.rules.entry(rule.to_owned()).or_insert_with(|| {
            Arc::new(Seen {
                rule: rule.to_owned(),
                processes: AtomicU64::new(0),
                fewer_since_ms: AtomicU64::new(0),
                held_until_ms: AtomicU64::new(0),
                presumed: Mutex::new(Presumption::default()),
                presumed_epoch: AtomicU64::new(0),
                beaten_at_failures: AtomicU64::new(u64::MAX),
                answered_at_ms: AtomicU64::new(0),
                refill_ms: AtomicI64::new(-1),
                joined: OnceCell::new(),
                failed: Mutex::new(None),
                gauge: telemetry::fleet_processes(rule),
            })
        });
        seen.clone()
    }

    /// The rules joined so far.
    pub(crate) fn joined(&self) -> Vec<Arc<Seen>> {
        self.rules.iter().map(|e| e.value().clone()).collect()
    }

    /// Whether this process comes back to `seen`'s rule from an outage: its store calls failed since the rule's
    /// last answered beat, or, never answered, since it started.
    pub(crate) fn is_back(&self, seen: &Seen) -> bool {
        is_back(seen.beaten_at_failures.load(Ordering::Acquire), self.store.failures())
    }

    /// Whether the next beat should come soon: cut off, back, or held (waiting for the hold's end too).
    pub(crate) fn is_urgent(&self, seen: &Seen) -> bool {
        self.is_back(seen)
            || seen.beaten_at_failures.load(Ordering::Acquire) == u64::MAX
            || self.held_by(seen).is_some()
    }

    /// How long a hold waits for the reports: two of the store's recovery spreads (the breaker's open period and a
    /// back-off: how far apart processes notice the store is back) and a lease timeout (a charge), at least
    /// [`MIN_HOLD`].
    fn hold(&self) -> Duration {
        let timeouts = self.store.timeouts;
        (timeouts.recovery_spread().saturating_mul(2) + timeouts.lease).max(MIN_HOLD)
    }

    /// This member's beat with the roster's timings: not back, settled, presuming nothing, staying.
    fn quiet_beat(&self) -> Beat {
        Beat {
            member: self.member.clone(),
            live_ms: millis(LIVE),
            silent_ms: millis(SILENT),
            keep_ms: millis(KEEP),
            hold_ms: millis(self.hold()),
            back: false,
            settled: true,
            refill_ms: None,
            cut_ms: 0,
            leave: false,
        }
    }

    /// Beats for `seen`'s rule: `settled` says this process owes nothing of it. The answer updates the count and
    /// the hold (and the gauge `tokenlease_fleet_processes`).
    ///
    /// # Errors
    /// The store's error; nothing is updated.
    pub(crate) async fn beat(&self, seen: &Seen, settled: bool) -> Result<Count, StoreError> {
        let failures = self.store.failures();
        let beaten = seen.beaten_at_failures.load(Ordering::Acquire);
        // Never answered, a process is back only while it owes what it sold alone: a first call that timed out
        // while it connected does not hold the fleet.
        let back = is_back(beaten, failures) && (beaten != u64::MAX || !settled);
        let answered_at = seen.answered_at_ms.load(Ordering::Acquire);
        let beat = Beat {
            back,
            settled,
            refill_ms: u64::try_from(seen.refill_ms.load(Ordering::Acquire)).ok(),
            cut_ms: if back && answered_at > 0 {
                self.now_ms().saturating_sub(answered_at)
            } else {
                0
            },
            ..self.quiet_beat()
        };
        // Back and still owing: the next beat is back too, until it reports settled.
        self.send(seen, beat, settled || (beaten == u64::MAX && !back), failures)
            .await
    }

    /// Leaves every rule's fleet that `owes` says owes nothing (at shutdown, once everything owed is charged): the
    /// rosters stop counting this process at once, and no hold waits for it or presumes it sold alone. A rule that
    /// still owes stays, so the next hold presumes its debt. Past the circuit breaker, each beat within `patience`.
    /// The rules leave side by side, once the beats in flight have landed; no beat is sent after.
    pub(crate) async fn leave(&self, owes: impl Fn(&str) -> bool, patience: Duration) {
        let leaving = async {
            *self.left.write().await = true;
            let mut leaves = tokio::task::JoinSet::new();
            for seen in self.joined() {
                if owes(seen.rule()) || !seen.is_answered() {
                    continue;
                }
                let beat = Beat {
                    leave: true,
                    ..self.quiet_beat()
                };
                let call = Call::beat(roster_key(&self.key_prefix, &seen.rule), beat).with_timeout(patience);
                // A beat: counted apart from the store calls of decisions.
                self.beats.fetch_add(1, Ordering::Relaxed);
                let store = self.store.clone();
                leaves.spawn(async move {
                    if let Err(error) = store.run_past_breaker(&call).await {
                        tracing::debug!(%error, "could not leave the fleet; it forgets this process later");
                    }
                });
            }
            while leaves.join_next().await.is_some() {}
        };
        let _ = tokio::time::timeout(patience, leaving).await;
    }

    /// Sends `beat` for `seen`'s rule; `answered` says the answer marks the failures so far as seen (the beat
    /// was settled, or the first).
    async fn send(&self, seen: &Seen, beat: Beat, answered: bool, failures: u64) -> Result<Count, StoreError> {
        // A beat answered late is still a beat: it waits as a debit does, so a process behind a slow link is
        // counted. It goes past the circuit breaker (one beat per rule at a time, from one task): a beat that
        // reaches the store closes the breaker for the debits and leases behind it, and a beat never holds the
        // breaker's one probe for its long timeout, which would keep the callers' calls from the store that long.
        let left = self.left.read().await;
        if *left {
            return Err(beat_error(
                StoreErrorKind::Other,
                "this process left the fleet (shut down)".into(),
            ));
        }
        let call = Call::beat(roster_key(&self.key_prefix, &seen.rule), beat).with_timeout(self.store.timeouts.debit);
        self.beats.fetch_add(1, Ordering::Relaxed);
        let reply = match self.store.run_past_breaker(&call).await {
            Ok(reply) => reply,
            Err(error) => {
                *seen.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some((error.kind, error.message.clone()));
                return Err(error);
            }
        };
        let count = Count::from_reply(&reply);
        let now = self.now_ms();
        let processes = seen.count(count.processes, now);
        if count.presumed.epoch > seen.presumed_epoch.load(Ordering::Acquire) {
            let mut presumed = seen.presumed.lock().unwrap_or_else(PoisonError::into_inner);
            if count.presumed.epoch > presumed.epoch {
                *presumed = Presumption {
                    at_ms: now,
                    ..count.presumed
                };
                seen.presumed_epoch.store(count.presumed.epoch, Ordering::Release);
                tracing::warn!(
                    rule = %seen.rule,
                    presumed_ms = count.presumed.ms,
                    "members of the fleet did not report after an outage: each key of the rule is charged what \
                     they may have sold alone before its next store call"
                );
            }
        }
        seen.held_until_ms
            .store(now.saturating_add(count.hold_ms), Ordering::Release);
        // 0 means never answered.
        seen.answered_at_ms.store(now.max(1), Ordering::Release);
        if answered {
            seen.beaten_at_failures.store(failures, Ordering::Release);
        }
        seen.gauge.set(processes as f64);
        if count.hold_ms > 0 {
            tracing::debug!(rule = %seen.rule, hold_ms = count.hold_ms, "the fleet is held");
        }
        Ok(count)
    }
}

/// A beat's error of `kind` that the store did not give (no beat was sent, or none answered).
fn beat_error(kind: StoreErrorKind, message: String) -> StoreError {
    StoreError {
        kind,
        script: "fleet",
        message,
        source: None,
    }
}

/// Whether a member comes back from an outage: the store's failure count moved since `beaten`, the count at its
/// last answered beat; never answered (`u64::MAX`), whether any call failed at all.
fn is_back(beaten: u64, failures: u64) -> bool {
    beaten != failures && (beaten != u64::MAX || failures > 0)
}

/// How long a key decided by `algorithm` takes to refill from empty (ms), for the hold's presumed terms
/// ([`crate::algorithm::fleet::Roster::term`]): a token bucket's `capacity × per_ms / rate`, rounded up; a leaky
/// bucket's 0 (a paced queue has no burst: what a member sold alone is its pace over its silence). `None` where
/// nothing is presumed: a bucket that never refills (rate 0, a stock, sells nothing alone) and the window rules,
/// whose limit is per window (see docs/ARCHITECTURE.md, Known limits).
pub(crate) fn refill_ms(algorithm: &Algorithm) -> Option<u64> {
    match algorithm {
        Algorithm::TokenBucket { bucket, .. } if bucket.rate > 0 => {
            Some(bucket.capacity.saturating_mul(bucket.per_ms).div_ceil(bucket.rate))
        }
        Algorithm::LeakyBucket { .. } => Some(0),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
