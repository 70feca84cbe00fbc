//! The local shares of token buckets under `fail_mode = "local"`, and the debits they owe (invariant 12 of
//! docs/ARCHITECTURE.md).
//!
//! A key's share is one continuous token bucket per process: `capacity / expected_processes` tokens refilled at
//! `rate / expected_processes` ([`TokenBucket::share`]). It is never refilled at once: every answer of the store
//! for the key lowers it to this process's part of the level the store reported, it refills at its rate while
//! the store is away, and a key the store never reported starts empty (what the other processes took is
//! unknown). What it admits alone is *owed*: charged to the shared bucket when the store answers again, the part
//! the bucket cannot absorb yet carried to the next charge, so no debit is dropped. A charge is a *debit* with an
//! id of its own: one whose answer was lost is sent again, same id, same tokens, and the store applies it once
//! (`token_return.lua`'s mark), so no debit is charged twice either.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::algorithm::{Reply, TokenBucket, TokenBucketState, NEVER};

/// Another charge of the key is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy;

/// A debit to send: the shared bucket's parameters now, the tokens, and the debit's id (the same every time this
/// debit is sent, until the store's answer is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Debit {
    pub(crate) bucket: TokenBucket,
    pub(crate) tokens: u64,
    pub(crate) id: String,
}

/// An empty share at `now_ms`.
fn empty(share: TokenBucket, now_ms: u64) -> TokenBucketState {
    let mut s = share.refill(None, now_ms);
    s.level = 0;
    s
}

/// `state` as a state of `share`, the same level: a level is in units of `1 / (per_ms × processes)` token of the
/// share, whatever the count, so when the fleet's count changes the share keeps its level (its part of the
/// shared bucket's level) and only the parameters it records change. Converting it as a reload would (invariant
/// 11) would scale the share by the change of the count instead.
fn relabel(state: Option<TokenBucketState>, share: TokenBucket) -> Option<TokenBucketState> {
    state.map(|s| TokenBucketState { bucket: share, ..s })
}

/// The exact full level of one process's share of `bucket`, in units of its share: `capacity / processes`
/// tokens are `capacity × per_ms` units of `1 / (per_ms × processes)` token.
fn exact_full(bucket: TokenBucket) -> i64 {
    i64::try_from(bucket.capacity.saturating_mul(bucket.per_ms)).unwrap_or(i64::MAX)
}

/// One key's share and debt.
#[derive(Debug)]
struct Share {
    /// The shared bucket's parameters (the share's are `bucket.share(processes)`).
    bucket: TokenBucket,
    /// The share's state; `None` when full.
    state: Option<TokenBucketState>,
    /// Tokens admitted alone and not in a debit yet.
    owed: u64,
    /// Of `owed`, what a debit already took down to the shared bucket's floor (−capacity) and could not charge:
    /// carried to a later debit, once the bucket has refilled. The fleet need not wait for it: the bucket
    /// charged to its floor already makes up for it (invariant 19).
    carried: u64,
    /// The debit sent whose answer is not known (it failed, or timed out, perhaps after the store applied it):
    /// its id and tokens, sent again as they are before anything else of the key.
    pending: Option<(String, u64)>,
    /// A charge of this key is in flight: its tokens are still counted in [`Shares::owed`].
    settling: bool,
    /// When the share was last reported or taken from, in ms of the limiter's clock.
    touched_ms: u64,
    /// After a charge, the key's store calls wait until then (ms), so the other processes' charges land first.
    held_until_ms: u64,
    /// Reported by the store since the last take: the time from the report to the next take is not refilled.
    /// The store was answering then, and the other processes leased that refill from it (under saturation a
    /// process hears from the store once per turn, so its share would otherwise start an outage with a turn's
    /// refill that the fleet had already sold).
    reported: bool,
}

/// The local shares of this process's token-bucket keys, at most `max_keys` of them.
#[derive(Debug)]
pub(crate) struct Shares {
    map: DashMap<String, Share, foldhash::fast::RandomState>,
    max_keys: usize,
    /// Tokens owed over all keys: zero (the common case) costs callers one load.
    owed: AtomicU64,
    /// The latest hold of any key (ms): past it (the common case), no key is held.
    held_until_ms: AtomicU64,
}

impl Shares {
    /// Shares remembering at most `max_keys` keys.
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: DashMap::default(),
            max_keys,
            owed: AtomicU64::new(0),
            held_until_ms: AtomicU64::new(0),
        }
    }

    /// The store reported `remaining` tokens in the shared bucket of `key`, shared by `processes` processes, at
    /// `now_ms`: the share is lowered to `remaining / processes` tokens, never raised. A key not yet known is
    /// remembered while there is room.
    pub(crate) fn report(&self, key: &str, (bucket, processes): (TokenBucket, u64), remaining: u64, now_ms: u64) {
        let share = bucket.share(processes);
        // remaining / processes tokens in units of 1 / share.per_ms = remaining × per_ms units (exact).
        let part = i64::try_from(remaining.saturating_mul(bucket.per_ms)).unwrap_or(i64::MAX);
        let lowered = |state: Option<TokenBucketState>| {
            let mut s = share.refill(relabel(state, share), now_ms);
            s.level = s.level.min(part);
            s
        };
        if let Some(mut entry) = self.map.get_mut(key) {
            // Reloaded: the new parameters start from the reported level.
            let state = if entry.bucket == bucket { entry.state } else { None };
            entry.bucket = bucket;
            entry.state = Some(lowered(state));
            entry.touched_ms = now_ms;
            entry.reported = true;
        } else if self.map.len() < self.max_keys {
            self.map.insert(
                key.to_owned(),
                Share {
                    bucket,
                    state: Some(lowered(None)),
                    owed: 0,
                    carried: 0,
                    pending: None,
                    settling: false,
                    touched_ms: now_ms,
                    held_until_ms: 0,
                    reported: true,
                },
            );
        }
    }

    /// Takes `cost` tokens of `key`'s share of `bucket`, shared by `processes` processes, at `now_ms` while the
    /// store fails; what is granted is owed. A key the store never reported starts empty. `None` when the key is
    /// not known and there is no room for it: what it admitted could not be remembered, so nothing is admitted.
    pub(crate) fn take(
        &self,
        key: &str,
        (bucket, processes): (TokenBucket, u64),
        cost: u64,
        now_ms: u64,
    ) -> Option<Reply> {
        let share = bucket.share(processes);
        let mut entry = match self.map.get_mut(key) {
            Some(entry) => entry,
            None if self.map.len() < self.max_keys => self.map.entry(key.to_owned()).or_insert(Share {
                bucket,
                state: Some(empty(share, now_ms)),
                owed: 0,
                carried: 0,
                pending: None,
                settling: false,
                touched_ms: now_ms,
                held_until_ms: 0,
                reported: false,
            }),
            None => return None,
        };
        if entry.bucket != bucket {
            // Reloaded while the store failed: what is known of the old parameters does not carry over.
            entry.bucket = bucket;
            entry.state = Some(empty(share, now_ms));
        }
        if bucket.rate == 0 {
            // A stock that never refills: a debt would never be repaid, so nothing is sold alone.
            return Some(Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: NEVER,
                reset_after_ms: NEVER,
                stamp: 0,
            });
        }
        // Exactly capacity / processes tokens (`share` rounds its capacity up to a whole token, at least 1): a
        // bucket smaller than the processes admits nothing alone.
        if std::mem::take(&mut entry.reported) {
            if let Some(s) = entry.state.as_mut() {
                s.ts_ms = s.ts_ms.max(now_ms);
            }
        }
        let mut state = share.refill(relabel(entry.state, share), now_ms);
        state.level = state.level.min(exact_full(bucket));
        let (state, reply) = share.take(Some(state), cost, cost, now_ms);
        entry.state = state;
        entry.touched_ms = now_ms;
        if reply.granted > 0 {
            entry.owed = entry.owed.saturating_add(reply.granted);
            self.owed.fetch_add(reply.granted, Ordering::AcqRel);
        }
        Some(reply)
    }

    /// Whether any key owes tokens.
    #[inline]
    pub(crate) fn any_owed(&self) -> bool {
        self.owed.load(Ordering::Acquire) > 0
    }

    /// Takes what `key` owes, to charge it: the debit not answered yet if there is one (same id, same tokens),
    /// else a new debit of everything owed, with the id `new_id` gives; `Ok(None)` when it owes nothing. The
    /// tokens stay counted as owed until [`Shares::settled`], so that other callers of the key know a charge is
    /// in flight.
    ///
    /// # Errors
    /// [`Busy`] while another charge of the key is in flight: its answer would not count that charge yet.
    pub(crate) fn take_owed(&self, key: &str, new_id: impl FnOnce() -> String) -> Result<Option<Debit>, Busy> {
        let Some(mut entry) = self.map.get_mut(key) else {
            return Ok(None);
        };
        if entry.settling {
            return Err(Busy);
        }
        if entry.pending.is_none() && entry.owed > 0 {
            entry.pending = Some((new_id(), std::mem::take(&mut entry.owed)));
        }
        let Some((id, tokens)) = entry.pending.clone() else {
            return Ok(None);
        };
        entry.settling = true;
        Ok(Some(Debit {
            bucket: entry.bucket,
            tokens,
            id,
        }))
    }

    /// Holds the key's store calls until `until_ms`: it was just charged, and the other processes, which
    /// come back from the outage on their own clocks, have yet to charge theirs.
    pub(crate) fn hold(&self, key: &str, until_ms: u64) {
        if let Some(mut entry) = self.map.get_mut(key) {
            entry.held_until_ms = entry.held_until_ms.max(until_ms);
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

    /// The debit taken by [`Shares::take_owed`] was answered: the store charged `charged` of its tokens, and the
    /// rest is owed again (to a new debit, once the bucket has refilled); `None` when its answer is not known
    /// (an error, a timeout): it stays pending, to be sent again as it is.
    pub(crate) fn settled(&self, key: &str, charged: Option<u64>) {
        let Some(mut entry) = self.map.get_mut(key) else {
            return;
        };
        entry.settling = false;
        let Some(charged) = charged else {
            return;
        };
        if let Some((_, tokens)) = entry.pending.take() {
            let charged = charged.min(tokens);
            entry.owed = entry.owed.saturating_add(tokens - charged);
            entry.carried = tokens - charged;
            drop(entry);
            self.owed.fetch_sub(charged, Ordering::AcqRel);
        }
    }

    /// Gives up what `key` owes (its pending debit and the rest): the tokens, no longer counted as owed.
    pub(crate) fn forgive(&self, key: &str) -> u64 {
        let Some(mut entry) = self.map.get_mut(key) else {
            return 0;
        };
        let pending = entry.pending.take().map_or(0, |(_, tokens)| tokens);
        let tokens = std::mem::take(&mut entry.owed).saturating_add(pending);
        entry.carried = 0;
        entry.settling = false;
        drop(entry);
        self.owed.fetch_sub(tokens, Ordering::AcqRel);
        tokens
    }

    /// Forgets the keys untouched for `idle_ms` that owe nothing. Forgetting is always on the safe side: a key
    /// not known starts empty.
    pub(crate) fn sweep(&self, now_ms: u64, idle_ms: u64) {
        self.map.retain(|_, s| {
            s.owed > 0
                || s.pending.is_some()
                || s.settling
                || s.held_until_ms > now_ms
                || now_ms.saturating_sub(s.touched_ms) < idle_ms
        });
    }

    /// Every key that owes tokens no debit has taken to the shared bucket yet (what it admitted alone since its
    /// last charge, or a debit whose answer is not known): what the fleet's hold waits for. A key that owes only
    /// what a debit carried past the bucket's floor is not listed.
    pub(crate) fn uncharged_keys(&self) -> Vec<String> {
        self.map
            .iter()
            .filter(|e| e.owed > e.carried || e.pending.is_some() || e.settling)
            .map(|e| e.key().clone())
            .collect()
    }

    /// Every key that owes tokens, with how many (for shutdown, when all of it is charged).
    pub(crate) fn owing_keys(&self) -> Vec<(String, u64)> {
        self.map
            .iter()
            .map(|e| (e.key().clone(), e.owed + e.pending.as_ref().map_or(0, |(_, t)| *t)))
            .filter(|(_, tokens)| *tokens > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 tokens at 10 per second, shared by 2 processes: a share of 5 tokens at 5 per second.
    const BUCKET: TokenBucket = TokenBucket {
        capacity: 10,
        rate: 10,
        per_ms: 1000,
    };

    fn granted(shares: &Shares, cost: u64, now_ms: u64) -> u64 {
        shares.take("k", (BUCKET, 2), cost, now_ms).map_or(0, |r| r.granted)
    }

    #[test]
    fn a_key_never_reported_starts_empty_and_refills_at_its_share_of_the_rate() {
        let shares = Shares::new(10);
        let refused = shares.take("k", (BUCKET, 2), 1, 0).expect("room");
        assert_eq!((refused.granted, refused.retry_after_ms), (0, 200));
        assert_eq!(granted(&shares, 1, 199), 0);
        assert_eq!(granted(&shares, 1, 200), 1);
        // Five tokens a second, never more than the share's capacity of 5.
        assert_eq!(granted(&shares, 5, 10_000), 5);
        assert_eq!(granted(&shares, 1, 10_000), 0);
    }

    #[test]
    fn a_report_lowers_the_share_to_its_part_of_the_level_and_never_raises_it() {
        let shares = Shares::new(10);
        shares.report("k", (BUCKET, 2), 6, 0);
        assert_eq!(granted(&shares, 3, 0), 3);
        assert_eq!(granted(&shares, 1, 0), 0);
        // The store says full: the share stays where it was (empty), refilling at 5 per second.
        shares.report("k", (BUCKET, 2), 10, 0);
        assert_eq!(granted(&shares, 1, 0), 0);
        assert_eq!(granted(&shares, 1, 200), 1);
        // An episode's end does not refill it either: a report of an empty bucket empties it.
        shares.report("k", (BUCKET, 2), 0, 1_000);
        assert_eq!(granted(&shares, 1, 1_000), 0);
    }

    /// Debit ids as a caller hands them out.
    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("d{n}")
        }
    }

    #[test]
    fn the_time_between_a_report_and_the_first_take_after_it_is_not_refilled() {
        let shares = Shares::new(10);
        // The store said empty at 0; the outage starts at 600 ms (a turn later, the others leased that refill).
        shares.report("k", (BUCKET, 2), 0, 0);
        assert_eq!(granted(&shares, 1, 600), 0);
        // From the first take on, the share refills at its rate: 5 per second.
        assert_eq!(granted(&shares, 1, 799), 0);
        assert_eq!(granted(&shares, 1, 800), 1);
        // A new report: again nothing for the time up to the next take.
        shares.report("k", (BUCKET, 2), 0, 1_000);
        assert_eq!(granted(&shares, 1, 5_000), 0);
        assert_eq!(granted(&shares, 1, 5_200), 1);
    }

    #[test]
    fn a_debt_carried_past_the_floor_is_not_waited_for_but_a_new_one_is() {
        let shares = Shares::new(10);
        let mut id = ids();
        shares.report("k", (BUCKET, 2), 10, 0);
        assert_eq!(granted(&shares, 3, 0), 3);
        assert_eq!(shares.uncharged_keys(), ["k"], "admitted alone, never charged");
        let debit = shares.take_owed("k", &mut id).expect("free").expect("owed");
        assert_eq!(shares.uncharged_keys(), ["k"], "a charge in flight");
        // The bucket was at its floor: one token charged, two carried.
        shares.settled("k", Some(1));
        assert_eq!(debit.tokens, 3);
        assert!(
            shares.uncharged_keys().is_empty(),
            "only carried: the fleet need not wait"
        );
        assert_eq!(
            shares.owing_keys(),
            [("k".to_owned(), 2)],
            "still owed, and charged later"
        );
        // Admitted alone again: waited for again.
        assert_eq!(granted(&shares, 1, 2_000), 1);
        assert_eq!(shares.uncharged_keys(), ["k"]);
    }

    #[test]
    fn what_a_share_grants_is_owed_until_its_charge_ends_and_the_unabsorbed_part_is_carried() {
        let shares = Shares::new(10);
        let mut id = ids();
        shares.report("k", (BUCKET, 2), 10, 0);
        assert!(!shares.any_owed());
        assert_eq!(granted(&shares, 2, 0), 2);
        assert_eq!(granted(&shares, 1, 0), 1);
        assert!(shares.any_owed());
        let debit = |tokens: u64, id: &str| Debit {
            bucket: BUCKET,
            tokens,
            id: id.to_owned(),
        };
        assert_eq!(shares.take_owed("k", &mut id), Ok(Some(debit(3, "d1"))));
        // While the charge is in flight, other callers of the key know it, and wait.
        assert_eq!(shares.take_owed("k", &mut id), Err(Busy));
        assert!(shares.any_owed());
        // The bucket absorbed 2: 1 is carried to the next charge, a new debit.
        shares.settled("k", Some(2));
        assert_eq!(shares.take_owed("k", &mut id), Ok(Some(debit(1, "d2"))));
        shares.settled("k", Some(1));
        assert!(!shares.any_owed());
        assert_eq!(shares.take_owed("k", &mut id), Ok(None));
    }

    #[test]
    fn a_debit_whose_answer_was_lost_is_sent_again_as_it_was_and_what_was_sold_since_waits_behind_it() {
        let shares = Shares::new(10);
        let mut id = ids();
        shares.report("k", (BUCKET, 2), 10, 0);
        assert_eq!(granted(&shares, 2, 0), 2);
        let first = shares.take_owed("k", &mut id).expect("not busy").expect("owed");
        assert_eq!((first.tokens, first.id.as_str()), (2, "d1"));
        // Timed out: perhaps applied. Another token is sold alone meanwhile.
        shares.settled("k", None);
        assert_eq!(granted(&shares, 1, 1_000), 1);
        let again = shares.take_owed("k", &mut id).expect("not busy").expect("owed");
        assert_eq!(
            again, first,
            "the same debit, same id and tokens: the store applies it once"
        );
        shares.settled("k", Some(2));
        let next = shares.take_owed("k", &mut id).expect("not busy").expect("owed");
        assert_eq!((next.tokens, next.id.as_str()), (1, "d2"));
        // Given up: nothing is owed any more, and the forgiven tokens are told.
        assert_eq!(shares.forgive("k"), 1);
        assert!(!shares.any_owed());
        assert_eq!(shares.owing_keys(), []);
    }

    #[test]
    fn a_share_follows_the_fleets_count_without_growing() {
        // 19 of 20 tokens left when the process counted itself alone: its share is all 19. The fleet is then
        // counted at two: its share is half of what was left, 9.5 tokens, so 9 whole ones.
        let b = TokenBucket {
            capacity: 20,
            rate: 1,
            per_ms: 3_600_000,
        };
        let shares = Shares::new(10);
        shares.report("k", (b, 1), 19, 1_000);
        let sold: u64 = (0..15)
            .map(|i| shares.take("k", (b, 2), 1, 2_000 + i).map_or(0, |r| r.granted))
            .sum();
        assert_eq!(sold, 9);
    }

    #[test]
    fn a_bucket_smaller_than_the_processes_or_a_stock_admits_nothing_alone() {
        // 1 token per second shared by 4: a quarter of a token each, never a whole one.
        let one = TokenBucket {
            capacity: 1,
            rate: 1,
            per_ms: 1000,
        };
        let shares = Shares::new(10);
        shares.report("u", (one, 4), 1, 0);
        for now in [0, 4_000, 60_000] {
            assert_eq!(
                shares.take("u", (one, 4), 1, now).map(|r| r.granted),
                Some(0),
                "at {now}"
            );
        }
        // A stock (rate 0): its debt would never be repaid.
        let stock = TokenBucket { rate: 0, ..BUCKET };
        shares.report("s", (stock, 4), 10, 0);
        let refused = shares.take("s", (stock, 4), 1, 0).expect("room");
        assert_eq!((refused.granted, refused.retry_after_ms), (0, NEVER));
    }

    #[test]
    fn the_sweep_forgets_idle_keys_but_never_a_debt_and_a_full_map_admits_no_new_key() {
        let shares = Shares::new(2);
        shares.report("a", (BUCKET, 2), 10, 0);
        shares.report("k", (BUCKET, 2), 10, 0);
        assert_eq!(granted(&shares, 1, 0), 1);
        // Full: a third key is neither remembered nor admitted.
        shares.report("c", (BUCKET, 2), 10, 0);
        assert!(shares.take("c", (BUCKET, 2), 1, 0).is_none());
        shares.sweep(60_000, 60_000);
        assert_eq!(shares.map.len(), 1, "`a` was idle and owed nothing");
        assert_eq!(shares.owing_keys(), [("k".to_owned(), 1)]);
    }
}
