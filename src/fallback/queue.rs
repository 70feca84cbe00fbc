//! The local queues of leaky-bucket keys under `fail_mode = "local"`, and the charges they owe (invariant 16 of
//! docs/ARCHITECTURE.md: a queue releases at most `rate × W + 1` in any window W, through an outage too).
//!
//! While the store answers, every reply on a key tells this process where the shared schedule ends (its TAT:
//! `now + reset_after_ms`), its own booked slots included. When the store fails, the key's local queue paces at
//! this process's share, a little under `rate / processes` ([`local_pace`]: what the processes' unaligned phases
//! could add in a short window is given up), and its schedule starts after that end: the slots booked in the store keep running through the outage, at the whole rate until then, and the
//! local slots come after them. What the local queue booked is *owed*: when the store answers again, before this
//! process's next call on the key (and at shutdown), `leaky_charge.lua` moves the shared schedule to at least the
//! end of the local one, so no slot reserved afterwards runs beside the local slots. The key is then held for the
//! recovery spread, so that the other processes, which come back on their own clocks, charge theirs before this
//! one books behind it.
//!
//! The charge sets the shared TAT to a time rather than adding a count of slots: a local slot is `processes / rate`
//! of one process's share but only `1 / rate` of the shared schedule, so adding counts would end the shared
//! schedule before a busy process's local one whenever the processes were unevenly loaded; and a time set twice
//! is set once, so a charge that timed out after Redis applied it is simply sent again. Local slots already
//! released when the store answers need no charge: the shared schedule's TAT is already behind them.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::algorithm::{LeakyBucket, Reply, Tat};

use super::share::Busy;

/// The shortest window the bound is promised for (invariant 16), in ms.
const MIN_WINDOW_MS: u64 = 200;

/// This process's local pace while the store fails: `(rate − (processes − 1) / 0.2 s) / processes`.
///
/// The local queues of the processes cannot agree on their phases without the store, so in a window each may
/// release one more than its pace allows, at the moment the others do: `processes − 1` more than `rate × W + 1`
/// in all. Giving those up from the rate over the shortest window (0.2 s) keeps every window of 0.2 s or more at
/// `rate × W + 1` (invariant 16): at 100 /s and 4 processes, 21.25 /s each, 85 /s in all. `None` when nothing is
/// left (a rate below `(processes − 1) / 0.2 s`): the queue releases nothing alone.
pub(crate) fn local_pace(queue: LeakyBucket, processes: u64) -> Option<LeakyBucket> {
    let n = processes.max(1);
    let spare = (n - 1).checked_mul(queue.per_ms)?;
    let rate = queue.rate.checked_mul(MIN_WINDOW_MS)?.checked_sub(spare)?;
    let per_ms = queue.per_ms.checked_mul(MIN_WINDOW_MS)?.checked_mul(n)?;
    (rate > 0).then_some(LeakyBucket { rate, per_ms })
}

/// When a schedule ends: the TAT rounded up to a whole ms (0 for none).
fn end_ms(tat: Option<&Tat>) -> u64 {
    tat.map_or(0, |t| t.ms + u64::from(t.frac > 0))
}

/// One key's local queue.
#[derive(Debug)]
struct Local {
    /// The shared queue's parameters (the local queue's are [`local_pace`]).
    queue: LeakyBucket,
    /// Where the shared schedule ended when the store last answered for the key (ms of the limiter's clock).
    seen_until_ms: u64,
    /// The local schedule (ms of the limiter's clock, fraction in units of `1 / rate` ms).
    tat: Option<Tat>,
    /// The end of the local slots not charged yet (ms); 0 when nothing is owed.
    owed_until_ms: u64,
    /// A charge of this key is in flight.
    charging: bool,
    /// After a charge, the key's store calls wait until then (ms), so the other processes' charges land first.
    held_until_ms: u64,
    /// When the key was last used (ms).
    touched_ms: u64,
}

impl Local {
    fn new(queue: LeakyBucket, now_ms: u64) -> Self {
        Self {
            queue,
            seen_until_ms: 0,
            tat: None,
            owed_until_ms: 0,
            charging: false,
            held_until_ms: 0,
            touched_ms: now_ms,
        }
    }
}

/// The local queues of this process's leaky-bucket keys, at most `max_keys` of them.
#[derive(Debug)]
pub(crate) struct Queues {
    map: DashMap<String, Local, foldhash::fast::RandomState>,
    max_keys: usize,
    /// Keys that owe a charge: zero (the common case) costs callers one load.
    owing: AtomicU64,
    /// The latest hold of any key (ms): past it (the common case), no key is held.
    held_until_ms: AtomicU64,
}

impl Queues {
    /// Local queues for at most `max_keys` keys.
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: DashMap::default(),
            max_keys,
            owing: AtomicU64::new(0),
            held_until_ms: AtomicU64::new(0),
        }
    }

    /// Sets what `local` owes, keeping the count of owing keys.
    fn owe(&self, local: &mut Local, until_ms: u64) {
        match (local.owed_until_ms > 0, until_ms > 0) {
            (false, true) => {
                self.owing.fetch_add(1, Ordering::AcqRel);
            }
            (true, false) => {
                self.owing.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        local.owed_until_ms = until_ms;
    }

    /// The store answered for `key` at `now_ms`: the shared schedule `queue` ends `reset_after_ms` later (a
    /// negative value says nothing). A key not yet known is remembered while there is room.
    pub(crate) fn seen(&self, key: &str, queue: LeakyBucket, reset_after_ms: i64, now_ms: u64) {
        let Ok(ahead) = u64::try_from(reset_after_ms) else {
            return;
        };
        let until = now_ms.saturating_add(ahead);
        if let Some(mut local) = self.map.get_mut(key) {
            local.seen_until_ms = local.seen_until_ms.max(until);
            local.touched_ms = now_ms;
        } else if ahead > 0 && self.map.len() < self.max_keys {
            let mut local = Local::new(queue, now_ms);
            local.seen_until_ms = until;
            self.map.insert(key.to_owned(), local);
        }
    }

    /// Reserves `cost` tokens of `key`'s local queue at `now_ms` while the store fails: paced at
    /// [`local_pace`], starting no earlier than `processes` slots of the shared queue after where its schedule was
    /// last seen to end (the processes saw ends a few slots apart), within `max_wait_ms`. What is granted is owed.
    /// A rate too low for a local pace is refused. `None` when the key is not known and there is no room for it:
    /// what it booked could not be remembered, so nothing is booked.
    pub(crate) fn reserve(
        &self,
        key: &str,
        (queue, processes): (LeakyBucket, u64),
        (cost, max_wait_ms): (u64, u64),
        member: &str,
        now_ms: u64,
    ) -> Option<Reply> {
        let mut local = match self.map.get_mut(key) {
            Some(local) => local,
            None if self.map.len() < self.max_keys => self
                .map
                .entry(key.to_owned())
                .or_insert_with(|| Local::new(queue, now_ms)),
            None => return None,
        };
        if local.queue != queue {
            // Reloaded: the local slots booked at the old parameters still run; the new schedule starts after them.
            local.seen_until_ms = local.seen_until_ms.max(end_ms(local.tat.as_ref()));
            local.tat = None;
            local.queue = queue;
        }
        let Some(share) = local_pace(queue, processes) else {
            // Too slow a queue to pace alone within the bound: wait for the store.
            let step = processes.saturating_mul(queue.per_ms).div_ceil(queue.rate.max(1));
            return Some(Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: i64::try_from(step.max(1)).unwrap_or(i64::MAX),
                reset_after_ms: 0,
                stamp: 0,
            });
        };
        let mut tat = local.tat.take();
        if end_ms(tat.as_ref()) < local.seen_until_ms && local.seen_until_ms > now_ms {
            // The slots the store booked run first (this process's and the others', at the whole rate until then);
            // the local queue starts `processes` slots of the shared queue after them.
            let gap = processes.saturating_mul(queue.per_ms).div_ceil(queue.rate.max(1));
            tat = Some(Tat {
                ms: local.seen_until_ms.saturating_add(gap),
                frac: 0,
                rate: share.rate,
                tail: String::new(),
            });
        }
        let reply = share.reserve(&mut tat, cost, max_wait_ms, member, now_ms);
        if reply.granted > 0 {
            let until = local.owed_until_ms.max(end_ms(tat.as_ref()));
            self.owe(&mut local, until);
        }
        local.tat = tat;
        local.touched_ms = now_ms;
        Some(reply)
    }

    /// Hands back the local reservation `member` of `cost` tokens while nobody queued behind it (as
    /// `leaky_return.lua`); what is owed ends where the local schedule now ends.
    pub(crate) fn give_back(
        &self,
        key: &str,
        (queue, processes): (LeakyBucket, u64),
        cost: u64,
        member: &str,
        now_ms: u64,
    ) -> Reply {
        let Some(mut local) = self.map.get_mut(key) else {
            return Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                stamp: 0,
            };
        };
        let mut tat = local.tat.take();
        let Some(share) = local_pace(queue, processes) else {
            local.tat = tat;
            return Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                stamp: 0,
            };
        };
        let reply = share.give_back(&mut tat, cost, member, now_ms);
        if reply.granted > 0 && local.owed_until_ms > 0 && !local.charging {
            let end = end_ms(tat.as_ref());
            let until = if end > now_ms { end } else { 0 };
            self.owe(&mut local, until);
        }
        local.tat = tat;
        reply
    }

    /// Whether any key owes a charge.
    #[inline]
    pub(crate) fn any_owed(&self) -> bool {
        self.owing.load(Ordering::Acquire) > 0
    }

    /// Takes what `key` owes at `now_ms`, to charge it: the queue's parameters and the end of its local slots;
    /// `Ok(None)` when it owes nothing, or only slots that have already run (nothing is owed then). The key stays
    /// owing until [`Queues::settled`], so that its other callers know a charge is in flight.
    ///
    /// # Errors
    /// [`Busy`] while another charge of the key is in flight: its answer would not count that charge yet.
    pub(crate) fn take_owed(&self, key: &str, now_ms: u64) -> Result<Option<(LeakyBucket, u64)>, Busy> {
        let Some(mut local) = self.map.get_mut(key) else {
            return Ok(None);
        };
        if local.charging {
            return Err(Busy);
        }
        match local.owed_until_ms {
            0 => Ok(None),
            until if until <= now_ms => {
                self.owe(&mut local, 0);
                Ok(None)
            }
            until => {
                local.charging = true;
                Ok(Some((local.queue, until)))
            }
        }
    }

    /// A charge of the local slots ending at `until_ms`, taken by [`Queues::take_owed`], ended: `applied` (the
    /// store answered) settles them unless more were booked since; otherwise they stay owed.
    pub(crate) fn settled(&self, key: &str, until_ms: u64, applied: bool) {
        if let Some(mut local) = self.map.get_mut(key) {
            local.charging = false;
            if applied && local.owed_until_ms <= until_ms {
                self.owe(&mut local, 0);
            }
        }
    }

    /// Holds the key's store calls until `until_ms`: it was just charged, and the other processes have yet to
    /// charge theirs.
    pub(crate) fn hold(&self, key: &str, until_ms: u64) {
        if let Some(mut local) = self.map.get_mut(key) {
            local.held_until_ms = local.held_until_ms.max(until_ms);
            self.held_until_ms.fetch_max(until_ms, Ordering::AcqRel);
        }
    }

    /// How long the key's store calls are still held at `now_ms`, in ms; `None` when they are not.
    pub(crate) fn held(&self, key: &str, now_ms: u64) -> Option<u64> {
        if self.held_until_ms.load(Ordering::Acquire) <= now_ms {
            return None;
        }
        let until = self.map.get(key)?.held_until_ms;
        (until > now_ms).then(|| until - now_ms)
    }

    /// Forgets the keys untouched for `idle_ms` whose schedules, seen and local, have run and that owe nothing.
    pub(crate) fn sweep(&self, now_ms: u64, idle_ms: u64) {
        self.map.retain(|_, l| {
            l.owed_until_ms > 0
                || l.charging
                || l.held_until_ms > now_ms
                || l.seen_until_ms > now_ms
                || end_ms(l.tat.as_ref()) > now_ms
                || now_ms.saturating_sub(l.touched_ms) < idle_ms
        });
    }

    /// Every key that owes a charge (for shutdown).
    pub(crate) fn owing_keys(&self) -> Vec<String> {
        self.map
            .iter()
            .filter(|l| l.owed_until_ms > 0)
            .map(|l| l.key().clone())
            .collect()
    }
}

#[cfg(test)]
mod tests;
