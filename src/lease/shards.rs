//! A hot key's leased tokens split into per-core [`Shards`], so that threads deciding on one key do not share
//! one atomic.
//!
//! Each thread has a home shard (assigned round-robin on its first decision). A thread takes from its home shard
//! with one compare-and-swap on a cache line no other thread writes while the shard has tokens; when it runs dry
//! it steals half of another shard's tokens, and gathers from several when no shard holds the cost alone. Each
//! shard also counts the decisions its threads made, so the hot path touches no shared counter: the sweeper
//! sums them into the `metrics` handles (`lease/engine.rs`).
//!
//! Tokens only move between shards, never appear: every token taken was added, and the sum is what the lease
//! book attributes to its batches (`lease/bucket.rs`). A steal holds the tokens it moves between two shards for
//! an instant, so [`Shards::total`] sums the shards, and [`Shards::remove`] ends a pass that fell short, only
//! while no move is under way: a sum or a removal that missed them would let a lease's expiry forget tokens of an
//! expired batch, to be spent after its TTL.
//!
//! Under `--cfg tokenlease_loom` the atomics, the home shard's thread-local and the retries' waits are loom's,
//! and a key has two shards, so that the model checker runs these races (`lease/loom_tests.rs`); the normal
//! build uses std's.

use std::cell::Cell;
#[cfg(not(tokenlease_loom))]
use std::sync::{atomic::AtomicUsize, OnceLock};
#[cfg(not(tokenlease_loom))]
use std::{
    hint,
    sync::atomic::{AtomicU64, Ordering},
    thread,
};

#[cfg(tokenlease_loom)]
use loom::{
    hint,
    sync::atomic::{AtomicU64, Ordering},
    thread,
};

use crossbeam_utils::CachePadded;

/// One shard: its tokens and the decisions its threads made (monotonic counts).
#[derive(Debug, Default)]
struct Shard {
    tokens: AtomicU64,
    allowed: AtomicU64,
    refused: AtomicU64,
}

/// The tokens of one key, in per-core shards.
#[derive(Debug)]
pub(crate) struct Shards {
    shards: Box<[CachePadded<Shard>]>,
    /// Moves of tokens between shards started and finished (steals and gathers): equal while none is under way.
    moves: CachePadded<Moves>,
}

/// Counts of the moves between shards (see [`Shards::total`]).
#[derive(Debug, Default)]
struct Moves {
    started: AtomicU64,
    finished: AtomicU64,
}

/// A move of tokens between shards under way: finished when dropped.
struct Moving<'a>(&'a Moves);

impl<'a> Moving<'a> {
    fn start(moves: &'a Moves) -> Self {
        moves.started.fetch_add(1, Ordering::SeqCst);
        Self(moves)
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// Decisions counted by the shards of a key: allowed and refused, since the key's bucket was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) allowed: u64,
    pub(crate) refused: u64,
}

impl Counts {
    /// All decisions.
    pub(crate) fn total(self) -> u64 {
        self.allowed.saturating_add(self.refused)
    }
}

/// How many shards a key has: the cores, rounded up to a power of two, at most 16 (a shard is a cache line
/// pair, 128 bytes, per hot key).
#[cfg(not(tokenlease_loom))]
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .next_power_of_two()
            .min(16)
    })
}

/// Two shards under the model checker: enough for a move from a shard a sum has not read yet to one it has.
#[cfg(tokenlease_loom)]
fn shard_count() -> usize {
    2
}

/// This thread's home shard index (before masking).
#[cfg(not(tokenlease_loom))]
#[inline]
fn home() -> usize {
    thread_local! {
        static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    HOME.with(|h| {
        let mut i = h.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed);
            h.set(i);
        }
        i
    })
}

#[cfg(tokenlease_loom)]
loom::thread_local! {
    /// A model thread's home shard index: 0 unless the model sets it ([`set_home`]).
    static LOOM_HOME: Cell<usize> = Cell::new(0);
}

/// This model thread's home shard index (before masking).
#[cfg(tokenlease_loom)]
fn home() -> usize {
    LOOM_HOME.with(Cell::get)
}

/// Makes shard `i` this model thread's home.
#[cfg(all(test, tokenlease_loom))]
pub(crate) fn set_home(i: usize) {
    LOOM_HOME.with(|h| h.set(i));
}

/// Waits before the `tries`-th retry of a sum or a removal that a move overlapped: a spin, a yield every 64.
#[inline]
fn backoff(tries: u32) {
    if tries.is_multiple_of(64) {
        thread::yield_now();
    } else {
        hint::spin_loop();
    }
}

/// Takes up to `want` tokens from `shard`; returns how many.
fn take_up_to(shard: &Shard, want: u64) -> u64 {
    let mut current = shard.tokens.load(Ordering::Acquire);
    loop {
        let take = current.min(want);
        if take == 0 {
            return 0;
        }
        match shard
            .tokens
            .compare_exchange_weak(current, current - take, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return take,
            Err(actual) => current = actual,
        }
    }
}

impl Default for Shards {
    fn default() -> Self {
        Self {
            shards: (0..shard_count()).map(|_| CachePadded::new(Shard::default())).collect(),
            moves: CachePadded::new(Moves::default()),
        }
    }
}

impl Shards {
    #[inline]
    fn home(&self) -> (usize, &Shard) {
        let i = home() & (self.shards.len() - 1);
        (i, &self.shards[i])
    }

    /// Takes `cost` tokens: from this thread's shard, else by stealing or gathering from the others, and counts
    /// the allowed decision. Returns the tokens left in this thread's shard (a lower bound of what the key has
    /// left), or `None`, taking and counting nothing, when all shards together hold fewer than `cost`.
    #[inline]
    pub(crate) fn take(&self, cost: u64) -> Option<u64> {
        let (i, home) = self.home();
        let mut current = home.tokens.load(Ordering::Acquire);
        let left = loop {
            if current < cost {
                break self.steal(i, home, cost)?;
            }
            match home
                .tokens
                .compare_exchange_weak(current, current - cost, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break current - cost,
                Err(actual) => current = actual,
            }
        };
        home.allowed.fetch_add(1, Ordering::Relaxed);
        Some(left)
    }

    /// The home shard ran dry: take half of the first other shard that can pay `cost`, or gather `cost` from
    /// several; what was gathered goes back home when even all of them cannot.
    #[cold]
    fn steal(&self, i: usize, home: &Shard, cost: u64) -> Option<u64> {
        // A key run dry refuses without a move, so that its refusals never keep [`Shards::total`] retrying (a sum
        // read while tokens were being added may refuse once for nothing).
        if self.glance() < cost {
            return None;
        }
        let _moving = Moving::start(&self.moves);
        let n = self.shards.len();
        for j in (1..n).map(|k| (i + k) & (n - 1)) {
            let victim = &self.shards[j];
            let mut current = victim.tokens.load(Ordering::Acquire);
            while current >= cost {
                // Half of what it has (at least the cost), so the next decisions here are local again.
                let take = (current / 2).max(cost);
                match victim
                    .tokens
                    .compare_exchange_weak(current, current - take, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        let left = take - cost;
                        return Some(home.tokens.fetch_add(left, Ordering::AcqRel) + left);
                    }
                    Err(actual) => current = actual,
                }
            }
        }
        // No shard holds the cost alone (only with a cost above 1): gather it.
        let mut gathered = take_up_to(home, cost);
        for j in (1..n).map(|k| (i + k) & (n - 1)) {
            if gathered == cost {
                break;
            }
            gathered += take_up_to(&self.shards[j], cost - gathered);
        }
        if gathered == cost {
            return Some(home.tokens.load(Ordering::Acquire));
        }
        if gathered > 0 {
            home.tokens.fetch_add(gathered, Ordering::AcqRel);
        }
        None
    }

    /// Adds `n` tokens, spread evenly over the shards (the remainder to this thread's).
    pub(crate) fn add(&self, n: u64) {
        let len = self.shards.len() as u64;
        let (_, home) = self.home();
        let each = n / len;
        if each > 0 {
            for shard in self.shards.iter() {
                shard.tokens.fetch_add(each, Ordering::AcqRel);
            }
        }
        home.tokens.fetch_add(n - each * len, Ordering::AcqRel);
    }

    /// Removes up to `n` tokens from wherever they are; returns how many were removed: `n` when the shards hold
    /// that many besides what the decisions under way take. A pass over the shards while a steal moves tokens
    /// from a shard not yet read to one already read would miss them, so a pass that fell short is made again
    /// until no move started or was under way while it was made (the check of [`Shards::total`]): an expiry
    /// that removed less than it asked would leave tokens of an expired batch to be spent after its TTL.
    pub(crate) fn remove(&self, n: u64) -> u64 {
        let mut removed = 0;
        let mut tries = 0_u32;
        loop {
            let started = self.moves.started.load(Ordering::SeqCst);
            let idle = self.moves.finished.load(Ordering::SeqCst) == started;
            for shard in self.shards.iter() {
                if removed == n {
                    return removed;
                }
                removed += take_up_to(shard, n - removed);
            }
            if removed == n || (idle && self.moves.started.load(Ordering::SeqCst) == started) {
                return removed;
            }
            tries += 1;
            backoff(tries);
        }
    }

    /// Removes every token; returns how many.
    pub(crate) fn drain(&self) -> u64 {
        self.shards.iter().map(|s| s.tokens.swap(0, Ordering::AcqRel)).sum()
    }

    /// A sum of the shards' loads: it may miss tokens a steal is moving, so it serves a glance (is the key
    /// running low?), never the lease book ([`Shards::total`]).
    #[inline]
    pub(crate) fn glance(&self) -> u64 {
        self.shards.iter().map(|s| s.tokens.load(Ordering::Relaxed)).sum()
    }

    /// Tokens in all shards now: at least what they hold once the decisions under way have taken theirs (a
    /// decision taking tokens meanwhile may be counted or not). A sum of loads while a steal moves tokens from a
    /// shard not yet read to one already read would miss them, so the sum is taken again until no move started
    /// or was under way while it was taken (moves are rare: a thread's shard ran dry).
    pub(crate) fn total(&self) -> u64 {
        let mut tries = 0_u32;
        loop {
            let started = self.moves.started.load(Ordering::SeqCst);
            let idle = self.moves.finished.load(Ordering::SeqCst) == started;
            let sum = self.shards.iter().map(|s| s.tokens.load(Ordering::SeqCst)).sum();
            if idle && self.moves.started.load(Ordering::SeqCst) == started {
                return sum;
            }
            tries += 1;
            backoff(tries);
        }
    }

    /// The number of shards.
    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }

    /// Puts back `cost` tokens [`Self::take`] took on this thread, and the allowed decision it counted there.
    pub(crate) fn untake(&self, cost: u64) {
        let (_, home) = self.home();
        home.tokens.fetch_add(cost, Ordering::AcqRel);
        // The take counted one on this shard, which counts only up: at least one is there.
        home.allowed.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a refused decision in this thread's shard (no line shared with the other cores' deciders).
    #[inline]
    pub(crate) fn refused(&self) {
        let (_, home) = self.home();
        home.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The decisions counted so far.
    pub(crate) fn counts(&self) -> Counts {
        self.shards.iter().fold(Counts::default(), |c, s| Counts {
            allowed: c.allowed + s.allowed.load(Ordering::Relaxed),
            refused: c.refused + s.refused.load(Ordering::Relaxed),
        })
    }
}

/// The model checker's handles on the shards (`lease/loom_tests.rs`).
#[cfg(all(test, tokenlease_loom))]
impl Shards {
    /// Shards holding `tokens` (a power of two of them).
    pub(crate) fn holding(tokens: &[u64]) -> Self {
        assert!(tokens.len().is_power_of_two());
        let shard = |&t| {
            let s = Shard::default();
            s.tokens.store(t, Ordering::Relaxed);
            CachePadded::new(s)
        };
        Self {
            shards: tokens.iter().map(shard).collect(),
            moves: CachePadded::new(Moves::default()),
        }
    }
}

#[cfg(all(test, not(tokenlease_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn with_len(len: usize) -> Shards {
        Shards {
            shards: (0..len).map(|_| CachePadded::new(Shard::default())).collect(),
            moves: CachePadded::new(Moves::default()),
        }
    }

    #[test]
    fn a_thread_steals_and_gathers_but_never_makes_tokens() {
        let s = with_len(4);
        s.add(10); // 2 each, the remainder (2) at home
        assert_eq!(s.total(), 10);
        let (i, _) = s.home();
        assert_eq!(s.shards[i].tokens.load(Ordering::Relaxed), 4);
        assert_eq!(s.take(4), Some(0), "home pays");
        assert_eq!(
            s.take(1),
            Some(0),
            "another shard's half (1 of 2) comes home, and is taken"
        );
        assert_eq!(s.total(), 5);
        assert_eq!(s.take(5), Some(0), "no shard holds 5: gathered from all");
        assert_eq!(s.total(), 0);
        s.add(3);
        assert_eq!(s.take(4), None, "3 cannot pay 4");
        assert_eq!(s.total(), 3, "what was gathered went back");
        assert_eq!(s.remove(2), 2);
        assert_eq!(s.drain(), 1);
    }

    #[test]
    fn the_total_never_misses_tokens_a_steal_is_moving() {
        // Two threads spend one token at a time and steal half of another shard whenever theirs runs dry; the
        // total read meanwhile is never below what was added minus what was asked for before it was read (a
        // sum of loads missed the tokens a steal moved from a shard not yet read to one already read).
        const ADDED: u64 = 4_000_000;
        let s = Arc::new(with_len(8));
        s.add(ADDED);
        let asked = AtomicU64::new(0);
        let done = std::sync::atomic::AtomicBool::new(false);
        let worst = std::thread::scope(|scope| {
            for _ in 0..2 {
                let (s, asked, done) = (s.clone(), &asked, &done);
                scope.spawn(move || {
                    loop {
                        asked.fetch_add(1, Ordering::SeqCst);
                        if s.take(1).is_none() {
                            break;
                        }
                    }
                    done.store(true, Ordering::SeqCst);
                });
            }
            let mut worst = 0_u64;
            while !done.load(Ordering::SeqCst) {
                let total = s.total();
                // Every token spent by the time the total was taken was asked for before this load.
                let asked = asked.load(Ordering::SeqCst);
                worst = worst.max(ADDED.saturating_sub(asked).saturating_sub(total));
            }
            worst
        });
        assert_eq!(worst, 0, "the total missed tokens being moved");
    }

    #[test]
    fn threads_spend_exactly_what_was_added() {
        let s = Arc::new(with_len(4));
        s.add(100_000);
        let (taken, takes) = std::thread::scope(|scope| {
            let handles: Vec<_> = (1..=4)
                .map(|cost| {
                    let s = s.clone();
                    scope.spawn(move || {
                        let (mut tokens, mut takes) = (0, 0);
                        while s.take(cost).is_some() {
                            tokens += cost;
                            takes += 1;
                        }
                        (tokens, takes)
                    })
                })
                .collect();
            let joined = handles.into_iter().map(|h| h.join().unwrap_or_default());
            joined.fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
        });
        let mut left = 0;
        while s.take(1).is_some() {
            left += 1;
        }
        assert_eq!(taken + left, 100_000, "no token made or lost");
        assert_eq!(s.counts().allowed, takes + left, "every decision counted once");
    }
}
