//! The local shares of window rules (fixed window, sliding window, sliding log) under `fail_mode = "local"`, and
//! the admissions they write back (invariant 16 of docs/ARCHITECTURE.md).
//!
//! Every answer of the store for a key of a `local` window rule is remembered: what the window had left
//! (`remaining`), when (this limiter's clock, in ms) and until when it counts what it had (`reset_after`). While
//! the store fails, this process admits alone at most its share of each window:
//!
//! - in the window it last saw, `remaining / processes` (what the others had already been granted is in it);
//! - in every later window, `limit / processes`;
//! - a key the store never reported to this process gets nothing in the window holding the first decision made
//!   alone (what the others were granted in it is unknown), then `limit / processes` per window.
//!
//! A fixed window's windows are the rule's own: calendar windows cut on the wall clock as the store cuts them,
//! or, rolling, one window after another from the end of the one last seen. A sliding log or sliding window
//! counts what this process admitted in the last window length; the window it last saw lasts until every grant
//! the store counted then has left it (`reset_after`). The shares of the processes add up to at most what the
//! window had left, and to the limit afterwards.
//!
//! What is admitted alone is *owed*: before the key's next store call (and at shutdown) it is written back with
//! `window_charge.lua`, at the times it was admitted, so the shared window counts it and refuses accordingly.
//! A charge keeps its id (and its admissions) until the store applied it, so a charge timed out after Redis
//! applied it is not applied twice; admissions made meanwhile go to the next charge. After a charge the key's
//! store calls are held for the recovery spread, so that the other processes write theirs back first.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::algorithm::{Reply, NEVER};
use crate::clock::Clock;
use crate::store::call::ChargedWindow;

use super::share::Busy;

/// A store's answer for a key, as this process saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// When, in ms of the limiter's clock.
    at_ms: u64,
    /// Tokens the window had left.
    remaining: u64,
    /// Ms until the window counts nothing it counted then (a fixed window: until it ends).
    reset_after_ms: u64,
    /// The store refused the key until then (ms of the limiter's clock): a window full for this cost, or a ban.
    refused_until_ms: u64,
}

/// A charge: what it writes back, under one id until the store applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charge {
    /// Unique per process and charge: a retry with it writes nothing more.
    pub(crate) id: String,
    /// `(ms of the limiter's clock, tokens)` admitted alone, in time order.
    pub(crate) admitted: Vec<(u64, u64)>,
}

/// One key's share and what it owes.
#[derive(Debug)]
struct Share {
    /// The rule's window (a reload changes it).
    window: ChargedWindow,
    /// The store's last answer for the key.
    seen: Option<Seen>,
    /// When this process first decided the key alone without an answer of the store (ms).
    first_ms: u64,
    /// Admitted alone and in no charge yet: `(ms, tokens)`, in time order.
    open: Vec<(u64, u64)>,
    /// The charge being written back, sent again as it is until the store applied it.
    sealed: Option<Charge>,
    /// A charge of this key is in flight.
    settling: bool,
    /// When the key was last reported, taken from or charged (ms).
    touched_ms: u64,
    /// After a charge, the key's store calls wait until then (ms), so the other processes' charges land first.
    held_until_ms: u64,
}

impl Share {
    fn new(window: ChargedWindow, now_ms: u64) -> Self {
        Self {
            window,
            seen: None,
            first_ms: now_ms,
            open: Vec::new(),
            sealed: None,
            settling: false,
            touched_ms: now_ms,
            held_until_ms: 0,
        }
    }

    /// Everything admitted alone and not written back yet, the charge in flight included.
    fn admitted(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let sealed = self.sealed.iter().flat_map(|c| c.admitted.iter().copied());
        sealed.chain(self.open.iter().copied())
    }
}

/// What a local decision counts against: `[start, end)` in ms of the limiter's clock, and the tokens this process
/// may admit alone in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    start: u64,
    end: u64,
    budget: u64,
    /// Whether the counted span slides (a log or sub-buckets: what was admitted in `(now − window, now]`).
    sliding: bool,
}

/// The local shares of this process's window keys, at most `max_keys` of them.
#[derive(Debug)]
pub(crate) struct WindowShares {
    map: DashMap<String, Share, foldhash::fast::RandomState>,
    max_keys: usize,
    /// Tokens admitted alone and not written back, over all keys: zero (the common case) costs callers one load.
    owed: AtomicU64,
    /// The latest hold of any key (ms): past it (the common case), no key is held.
    held_until_ms: AtomicU64,
    /// The wall clock's ms since the Unix epoch minus the limiter clock's ms, read once: calendar windows are
    /// cut on the wall clock, as the store cuts them.
    wall_shift_ms: i64,
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl WindowShares {
    /// Shares remembering at most `max_keys` keys, on the limiter's `clock`.
    pub(crate) fn new(max_keys: usize, clock: &dyn Clock) -> Self {
        Self {
            map: DashMap::default(),
            max_keys,
            owed: AtomicU64::new(0),
            held_until_ms: AtomicU64::new(0),
            wall_shift_ms: crate::rule::wall_clock_ms() - signed(clock.now_ms()),
        }
    }

    /// The store answered `reply` for `key` (of `window`) at `now_ms`: remembered as the window last seen. A key
    /// not yet known is remembered while there is room.
    pub(crate) fn report(&self, key: &str, window: &ChargedWindow, reply: &Reply, now_ms: u64) {
        let refused_for = if reply.granted == 0 { reply.retry_after_ms } else { 0 };
        let seen = Seen {
            at_ms: now_ms,
            remaining: reply.remaining,
            reset_after_ms: u64::try_from(reply.reset_after_ms).unwrap_or(0),
            refused_until_ms: u64::try_from(refused_for).map_or(u64::MAX, |ms| now_ms.saturating_add(ms)),
        };
        if let Some(mut share) = self.map.get_mut(key) {
            share.window = window.clone();
            share.seen = Some(seen);
            share.touched_ms = now_ms;
        } else if self.map.len() < self.max_keys {
            let mut share = Share::new(window.clone(), now_ms);
            share.seen = Some(seen);
            self.map.insert(key.to_owned(), share);
        }
    }

    /// Where a fixed window of `window_ms` cut by `share`'s rule holds `now_ms`, in ms of the limiter's clock.
    fn fixed_frame(&self, share: &Share, now_ms: u64) -> (u64, u64) {
        let w = share.window.window_ms().max(1);
        if let ChargedWindow::FixedWindow {
            calendar: Some(calendar),
            ..
        } = &share.window
        {
            let wall = signed(now_ms).saturating_add(self.wall_shift_ms);
            let (start, end) = calendar.window(w, wall);
            let local = |t: i64| u64::try_from(t.saturating_sub(self.wall_shift_ms)).unwrap_or(0);
            return (local(start), local(end));
        }
        // Rolling: one window after another from the end of the one last seen (or of the first decision alone).
        let end0 = match share.seen {
            Some(seen) if seen.reset_after_ms > 0 => seen.at_ms + seen.reset_after_ms,
            Some(seen) => seen.at_ms + w,
            None => share.first_ms + w,
        };
        if now_ms < end0 {
            return (end0.saturating_sub(w), end0);
        }
        let start = end0 + (now_ms - end0) / w * w;
        (start, start + w)
    }

    /// What a decision of `share` at `now_ms` counts against, for `processes` processes.
    fn frame(&self, share: &Share, processes: u64, now_ms: u64) -> Frame {
        let n = processes.max(1);
        let (limit, w) = match &share.window {
            ChargedWindow::FixedWindow { limit, window_ms, .. }
            | ChargedWindow::SlidingWindow { limit, window_ms, .. }
            | ChargedWindow::SlidingLog { limit, window_ms } => (*limit, *window_ms),
        };
        // What the window had left when last seen, or nothing for a key never seen.
        let first = share.seen.map_or(0, |s| s.remaining);
        if let ChargedWindow::FixedWindow { .. } = share.window {
            let (start, end) = self.fixed_frame(share, now_ms);
            let first_frame = self.fixed_frame(share, share.seen.map_or(share.first_ms, |s| s.at_ms));
            let budget = if (start, end) == first_frame {
                first / n
            } else {
                limit / n
            };
            return Frame {
                start,
                end,
                budget,
                sliding: false,
            };
        }
        // A log or sub-buckets: what was counted when last seen has left at its reset_after.
        let first_end = share.seen.map_or(share.first_ms + w, |s| s.at_ms + s.reset_after_ms);
        let budget = if now_ms < first_end { first / n } else { limit / n };
        Frame {
            start: (now_ms + 1).saturating_sub(w),
            // Until the window last seen ends, else until what is counted now has left.
            end: if now_ms < first_end { first_end } else { now_ms + w },
            budget,
            sliding: true,
        }
    }

    /// Decides `cost` tokens of `key` (of `window`) alone at `now_ms`, as one of `processes`; what is granted is
    /// owed. `None` when the key is not known and there is no room for it: what it admitted could not be
    /// remembered, so nothing is admitted.
    pub(crate) fn take(
        &self,
        key: &str,
        window: &ChargedWindow,
        cost: u64,
        processes: u64,
        now_ms: u64,
    ) -> Option<Reply> {
        let mut share = match self.map.get_mut(key) {
            Some(share) => share,
            None if self.map.len() < self.max_keys => self
                .map
                .entry(key.to_owned())
                .or_insert_with(|| Share::new(window.clone(), now_ms)),
            None => return None,
        };
        if share.window != *window {
            // Reloaded while the store failed: what is known of the old window does not carry over.
            share.window = window.clone();
            share.seen = None;
            share.first_ms = now_ms;
        }
        share.touched_ms = now_ms;
        let w = window.window_ms();
        // Admissions older than two windows count in no window any more (a time zone's day is at most 25 h).
        let old = |&(at, _): &(u64, u64)| at.saturating_add(w.saturating_mul(2)) <= now_ms;
        let dropped: u64 = share.open.iter().filter(|a| old(a)).map(|(_, n)| n).sum();
        if dropped > 0 {
            share.open.retain(|a| !old(a));
            self.owed.fetch_sub(dropped, Ordering::AcqRel);
        }
        let frame = self.frame(&share, processes, now_ms);
        let counts = |at: u64| {
            if frame.sliding {
                at + w > now_ms
            } else {
                at >= frame.start && at < frame.end
            }
        };
        let counted: u64 = share.admitted().filter(|&(at, _)| counts(at)).map(|(_, n)| n).sum();
        let limit_share = match window {
            ChargedWindow::FixedWindow { limit, .. }
            | ChargedWindow::SlidingWindow { limit, .. }
            | ChargedWindow::SlidingLog { limit, .. } => limit / processes.max(1),
        };
        let refused_until = share.seen.map_or(0, |s| s.refused_until_ms);
        if now_ms >= refused_until && counted + cost <= frame.budget {
            match share.open.last_mut() {
                Some((at, n)) if *at == now_ms => *n += cost,
                _ => share.open.push((now_ms, cost)),
            }
            self.owed.fetch_add(cost, Ordering::AcqRel);
            let reset_after = if frame.sliding { w } else { frame.end - now_ms };
            return Some(Reply {
                granted: cost,
                remaining: frame.budget - counted - cost,
                retry_after_ms: 0,
                reset_after_ms: signed(reset_after),
                stamp: 0,
            });
        }
        // When a call could pass: the window ends (fixed), or the oldest counted admission leaves it or the
        // window last seen ends (sliding), or the store's refusal ends.
        let retry_after = if cost > limit_share {
            NEVER
        } else {
            let next = if frame.sliding {
                let oldest = share
                    .admitted()
                    .filter(|&(at, _)| counts(at))
                    .map(|(at, _)| at + w)
                    .min();
                oldest.unwrap_or(frame.end).min(frame.end)
            } else {
                frame.end
            };
            signed(next.max(refused_until).saturating_sub(now_ms).max(1))
        };
        Some(Reply {
            granted: 0,
            remaining: frame.budget.saturating_sub(counted),
            retry_after_ms: retry_after,
            reset_after_ms: signed(frame.end.saturating_sub(now_ms)),
            stamp: 0,
        })
    }

    /// Whether any key owes admissions.
    #[inline]
    pub(crate) fn any_owed(&self) -> bool {
        self.owed.load(Ordering::Acquire) > 0
    }

    /// The charge of what `key` owes, to write back: the one in flight before (same id), else a new one of what
    /// was admitted since (its id from `id`); `Ok(None)` when it owes nothing. Until [`WindowShares::settled`]
    /// other callers of the key know a charge is in flight.
    ///
    /// # Errors
    /// [`Busy`] while another charge of the key is in flight: its answer would not count that charge yet.
    pub(crate) fn take_owed(&self, key: &str, id: impl FnOnce() -> String) -> Result<Option<Charge>, Busy> {
        let Some(mut share) = self.map.get_mut(key) else {
            return Ok(None);
        };
        if share.settling {
            return Err(Busy);
        }
        if share.sealed.is_none() && !share.open.is_empty() {
            let admitted = std::mem::take(&mut share.open);
            share.sealed = Some(Charge { id: id(), admitted });
        }
        let charge = share.sealed.clone();
        share.settling = charge.is_some();
        Ok(charge)
    }

    /// A charge taken by [`WindowShares::take_owed`] ended at `now_ms`: applied by the store, which answered
    /// `reply` (the window after it), or not (`None`: it stays owed, to be sent again as it is).
    pub(crate) fn settled(&self, key: &str, window: &ChargedWindow, reply: Option<&Reply>, now_ms: u64) {
        let Some(mut share) = self.map.get_mut(key) else {
            return;
        };
        share.settling = false;
        share.touched_ms = now_ms;
        if reply.is_some() {
            if let Some(charge) = share.sealed.take() {
                let tokens: u64 = charge.admitted.iter().map(|(_, n)| n).sum();
                self.owed.fetch_sub(tokens, Ordering::AcqRel);
            }
        }
        drop(share);
        if let Some(reply) = reply {
            self.report(key, window, reply, now_ms);
        }
    }

    /// Drops what `key` owes (its rule is no longer a window: writing it would corrupt the new state; or
    /// shutdown gave up) and returns how many tokens that was.
    pub(crate) fn forget(&self, key: &str) -> u64 {
        let Some((_, share)) = self.map.remove(key) else {
            return 0;
        };
        let tokens: u64 = share.admitted().map(|(_, n)| n).sum();
        self.owed.fetch_sub(tokens, Ordering::AcqRel);
        tokens
    }

    /// Holds the key's store calls until `until_ms`: it was just charged, and the other processes, which
    /// come back from the outage on their own clocks, have yet to charge theirs.
    pub(crate) fn hold(&self, key: &str, until_ms: u64) {
        if let Some(mut share) = self.map.get_mut(key) {
            share.held_until_ms = share.held_until_ms.max(until_ms);
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

    /// Forgets the keys untouched for `idle_ms` that owe nothing. Forgetting is on the safe side: a key not known
    /// gets nothing in its current window.
    pub(crate) fn sweep(&self, now_ms: u64, idle_ms: u64) {
        self.map.retain(|_, s| {
            s.sealed.is_some()
                || !s.open.is_empty()
                || s.settling
                || s.held_until_ms > now_ms
                || now_ms.saturating_sub(s.touched_ms) < idle_ms
        });
    }

    /// Every key that owes admissions, with its window (for shutdown, when all of it is written back).
    pub(crate) fn owing_keys(&self) -> Vec<(String, ChargedWindow)> {
        self.map
            .iter()
            .filter(|e| e.sealed.is_some() || !e.open.is_empty())
            .map(|e| (e.key().clone(), e.window.clone()))
            .collect()
    }
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
