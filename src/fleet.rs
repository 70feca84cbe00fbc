//! The fleet as this process sees it: per leased rule, the live processes its roster in the store counted
//! (invariant 17 of docs/ARCHITECTURE.md; the roster is [`crate::algorithm::fleet`], `lua/fleet.lua`). A hot
//! key's fair share of the burst divides by that count.
//!
//! A rule joins when this process first leases for it: that lease waits for the rule's first beat, so a process that
//! just started knows the fleet's count before it leases. From then on the limiter beats for the rule every
//! [`Timings::BEAT`] (every [`Timings::BEAT_SOON`] while its beats fail), from a task of its own
//! (`limiter/lifecycle.rs`). Until a rule's first beat is answered, its fair share divides by the configured
//! `expected_processes`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::OnceCell;

use crate::algorithm::fleet::{Beat, Count};
use crate::clock::{millis, Clock};
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::call::{roster_key, Call};
use crate::store::guarded::Guarded;
use crate::telemetry;
use crate::timings::Timings;

/// What this process has taken of a rule's roster: the fleet's count, stepped by each answered beat
/// ([`Heard::answered`]).
///
/// ```text
///  Unanswered ──an answer──▶ Counted ──an answer counting fewer──▶ Fewer ──fewer for LIVE──▶ Counted (fewer)
///                               ▲                                    │
///                               └──an answer not lower, or after a gap of two beats: start over──┘
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// No beat answered yet: the fleet is assumed `expected_processes`.
    Unanswered,
    /// The roster counted `processes`, in the answer at `at_ms` (the limiter's clock).
    Counted { processes: u64, at_ms: u64 },
    /// Answers have counted fewer than `processes` since `since_ms`, the last at `at_ms`: the count is still
    /// `processes` until they have for [`Timings::LIVE`].
    Fewer { processes: u64, at_ms: u64, since_ms: u64 },
}

impl Heard {
    /// The state after a beat answered at `now_ms` counted `counted` live processes. More processes (or the
    /// first answer) count at once; fewer only once the answers have counted fewer for [`Timings::LIVE`]. After
    /// an outage the first process back finds the others unheard for longer than [`Timings::LIVE`] (their beats
    /// failed too) and is answered a count of one: taken at once, its first lease could take the whole burst.
    /// The others beat within a beat or two and the count is back before the lower one would be taken. A member
    /// that really left is counted [`Timings::LIVE`] longer: the others' shares are smaller meanwhile, never
    /// larger. The lower answers must follow each other: after a gap of more than two beats without an answer
    /// (an outage, a stall) they start over, so a lower answer before an outage and one after it are not taken
    /// as [`Timings::LIVE`] of fewer processes.
    pub(crate) fn answered(self, counted: u64, now_ms: u64) -> Self {
        let taken = Self::Counted {
            processes: counted,
            at_ms: now_ms,
        };
        let (processes, at_ms, since_ms) = match self {
            Self::Unanswered => return taken,
            Self::Counted { processes, .. } | Self::Fewer { processes, .. } if counted >= processes => return taken,
            Self::Counted { processes, at_ms } => (processes, at_ms, now_ms),
            Self::Fewer {
                processes,
                at_ms,
                since_ms,
            } => (processes, at_ms, since_ms),
        };
        let gap = now_ms.saturating_sub(at_ms) > millis(Timings::BEAT).saturating_mul(2);
        let since_ms = if gap { now_ms } else { since_ms };
        if now_ms.saturating_sub(since_ms) >= millis(Timings::LIVE) {
            return taken;
        }
        Self::Fewer {
            processes,
            at_ms: now_ms,
            since_ms,
        }
    }

    /// The fleet's count taken so far (`None`: no answer yet).
    pub(crate) fn processes(self) -> Option<u64> {
        match self {
            Self::Unanswered => None,
            Self::Counted { processes, .. } | Self::Fewer { processes, .. } => Some(processes),
        }
    }
}

/// How a rule's last beat went: what [`Fleet::join`] answers while none was answered, and whether the next beat
/// comes soon ([`Fleet::is_urgent`]).
///
/// ```text
///  Unsent ──answered──▶ Answered ──failed──▶ Failed ──answered──▶ Answered
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
enum LastBeat {
    /// No beat sent yet.
    Unsent,
    /// The roster answered it.
    Answered,
    /// The store failed it: its error's kind and message.
    Failed { kind: StoreErrorKind, message: String },
}

/// A rule's beats as this process has them, under one lock, stepped by [`Fleet::beat`].
#[derive(Debug)]
struct Beats {
    /// The roster's count as this process took it.
    heard: Heard,
    /// How the last beat went.
    last: LastBeat,
}

/// What this process knows of one rule's fleet.
#[derive(Debug)]
pub(crate) struct Seen {
    rule: String,
    beats: Mutex<Beats>,
    /// The first beat, which the rule's first lease waits for.
    joined: OnceCell<()>,
    gauge: metrics::Gauge,
}

impl Seen {
    fn beats(&self) -> std::sync::MutexGuard<'_, Beats> {
        self.beats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn heard(&self) -> Heard {
        self.beats().heard
    }

    /// Whether one of this process's beats of the rule was answered.
    fn is_answered(&self) -> bool {
        self.heard() != Heard::Unanswered
    }
}

/// This process's view of its rules' fleets.
#[derive(Debug)]
pub(crate) struct Fleet {
    rules: DashMap<String, Arc<Seen>, foldhash::fast::RandomState>,
    /// This limiter's member in the rosters.
    member: String,
    key_prefix: String,
    /// The count assumed before a rule's first beat is answered.
    expected_processes: u64,
    store: Arc<Guarded>,
    clock: Arc<dyn Clock>,
    /// Beats sent (each a store call).
    beats: AtomicU64,
    /// Set by [`Fleet::leave`] once no beat is in flight: a beat after it would put this process back on the
    /// rosters it left (counted for [`Timings::LIVE`] more). Beats hold it for reading while they run.
    left: tokio::sync::RwLock<bool>,
}

impl Fleet {
    /// The fleets of a limiter whose member is `member`, keeping rosters under `key_prefix`, assuming
    /// `expected_processes` processes until a rule's roster answers.
    pub(crate) fn new(
        (member, key_prefix): (String, String),
        expected_processes: u64,
        store: Arc<Guarded>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            rules: DashMap::default(),
            member,
            key_prefix,
            expected_processes: expected_processes.max(1),
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
    /// it (a lower one once shown for [`Timings::LIVE`], [`Heard::answered`]), or the assumed count before one was
    /// answered.
    pub(crate) fn processes(&self, rule: &str) -> u64 {
        let heard = self.rules.get(rule).map(|s| s.heard());
        heard.and_then(Heard::processes).unwrap_or(self.expected_processes)
    }

    /// Joins `rule`'s fleet: the first call waits for the rule's first beat (one store call, once; a failed one is
    /// not retried here, the beats go on in the background, every [`Timings::BEAT_SOON`] until one is answered).
    ///
    /// # Errors
    /// While no beat of the rule was answered, the last beat's failure (kind and message, script `fleet`): the
    /// process does not know the fleet's count, and its fair share divides by `expected_processes`.
    pub(crate) async fn join(&self, rule: &str) -> Result<(), StoreError> {
        let seen = self.seen(rule);
        seen.joined
            .get_or_init(|| async {
                let _ = self.beat(&seen).await;
            })
            .await;
        if seen.is_answered() {
            return Ok(());
        }
        let (kind, message) = match &seen.beats().last {
            LastBeat::Failed { kind, message } => (*kind, message.clone()),
            LastBeat::Unsent | LastBeat::Answered => (StoreErrorKind::Other, "no beat answered yet".into()),
        };
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
                beats: Mutex::new(Beats {
                    heard: Heard::Unanswered,
                    last: LastBeat::Unsent,
                }),
                joined: OnceCell::new(),
                gauge: telemetry::fleet_processes(rule),
            })
        });
        seen.clone()
    }

    /// The rules joined so far.
    pub(crate) fn joined(&self) -> Vec<Arc<Seen>> {
        self.rules.iter().map(|e| e.value().clone()).collect()
    }

    /// Whether the next beat for `seen`'s rule should come soon: the last one was not answered (none was sent,
    /// or it failed).
    pub(crate) fn is_urgent(&self, seen: &Seen) -> bool {
        seen.beats().last != LastBeat::Answered
    }

    /// This member's beat with the roster's timings, staying or leaving.
    fn beat_of(&self, leave: bool) -> Beat {
        Beat {
            member: self.member.clone(),
            live_ms: millis(Timings::LIVE),
            keep_ms: millis(Timings::KEEP),
            leave,
        }
    }

    /// Beats for `seen`'s rule. The answer updates the count (and the gauge `tokenlease_fleet_processes`).
    ///
    /// A beat answered late is still a beat: it waits up to its own long timeout, so a process behind a slow link
    /// is counted. It goes past the circuit breaker (one beat per rule at a time, from one task): a beat that
    /// reaches the store closes the breaker for the leases behind it, and a beat never holds the breaker's one
    /// probe for its long timeout, which would keep the callers' calls from the store that long.
    ///
    /// # Errors
    /// The store's error (the count is kept), or an error of kind `Other` once this process left the fleet.
    pub(crate) async fn beat(&self, seen: &Seen) -> Result<Count, StoreError> {
        let left = self.left.read().await;
        if *left {
            return Err(beat_error(
                StoreErrorKind::Other,
                "this process left the fleet (shut down)".into(),
            ));
        }
        let call = Call::beat(roster_key(&self.key_prefix, &seen.rule), self.beat_of(false))
            .with_timeout(self.store.timings.beat);
        self.beats.fetch_add(1, Ordering::Relaxed);
        let sent_ms = wall_ms();
        let reply = match self.store.run_past_breaker(&call).await {
            Ok(reply) => reply,
            Err(error) => {
                seen.beats().last = LastBeat::Failed {
                    kind: error.kind,
                    message: error.message.clone(),
                };
                return Err(error);
            }
        };
        let count = Count::from_reply(&reply);
        let now = self.now_ms();
        let processes = {
            let mut beats = seen.beats();
            beats.heard = beats.heard.answered(count.processes, now);
            beats.last = LastBeat::Answered;
            beats.heard.processes().unwrap_or(count.processes)
        };
        seen.gauge.set(processes as f64);
        // Redis answers on its wall clock (`TIME`); the in-process store on the limiter's monotonic one, so the
        // series exists only where it means something (registered at its first reading, once a second at most).
        if self.store.source() == Source::Redis {
            let middle_ms = sent_ms.midpoint(wall_ms());
            telemetry::store_clock_offset(&seen.rule).set((count.now_ms as f64 - middle_ms as f64) / 1000.0);
        }
        Ok(count)
    }

    /// Leaves every rule's fleet this process was answered in (at shutdown): the rosters stop counting it at
    /// once. Past the circuit breaker, each beat within `patience`. The rules leave side by side, once the beats
    /// in flight have landed; no beat is sent after.
    pub(crate) async fn leave(&self, patience: Duration) {
        let leaving = async {
            *self.left.write().await = true;
            let mut leaves = tokio::task::JoinSet::new();
            for seen in self.joined() {
                if !seen.is_answered() {
                    continue;
                }
                let call =
                    Call::beat(roster_key(&self.key_prefix, &seen.rule), self.beat_of(true)).with_timeout(patience);
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
}

/// This process's wall clock, in ms since the Unix epoch (0 before it).
fn wall_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

#[cfg(test)]
mod tests;
