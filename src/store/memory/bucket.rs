//! The token-bucket calls of the in-process store, as `token_bucket.lua`, `token_lease.lua`, `token_acquire.lua`
//! and `token_return.lua` run them: the bucket's level ([`crate::algorithm::TokenBucket`]), its ban, its marks
//! and the fields of its hash ([`super::hash`]), one entry under one lock.

use super::hash::{Fields, Marks};
use super::{MemoryStore, State};
use crate::algorithm::{Ban, Reply, TokenBucket, TokenBucketState};
use crate::error::StoreError;
use crate::store::bad_args;
use crate::store::call::{debit_mark_ms, Call, Op, GIVE_BACK_MARK_MS};

impl MemoryStore {
    /// Runs `call`, a token-bucket call whose arguments were checked, at `now` (ms).
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` for a call of another algorithm.
    pub(super) fn run_bucket(&self, call: &Call, now: u64) -> Result<Reply, StoreError> {
        let key = call.key.as_str();
        match &call.op {
            Op::TokenLease {
                bucket,
                min,
                max,
                batch,
                pace,
            } => self.update_bucket_with(key, now, |old, _, _, fields| {
                if let Some(held) = bucket.held(old, fields.hold_until_ms, now) {
                    return held;
                }
                let (new, next, reply) = bucket.lease((old, fields.turn_ms), (*min, *max, *batch), *pace, now);
                fields.turn_ms = next;
                (new, reply)
            }),
            Op::TokenBucket {
                bucket,
                min,
                max,
                ban_ms,
            } => self.update_bucket_with(key, now, |old, ban, _, fields| {
                // The ban first, then the hold, as token_bucket.lua checks them.
                if ban.left(now).is_none() {
                    if let Some(held) = bucket.held(old, fields.hold_until_ms, now) {
                        return held;
                    }
                }
                bucket.take_banned(old, ban, *min, *max, *ban_ms, now)
            }),
            Op::TokenAcquire {
                bucket,
                cost,
                max_wait_ms,
            } => self.update_bucket_with(key, now, |old, _, _, fields| {
                if let Some(held) = bucket.held(old, fields.hold_until_ms, now) {
                    return held;
                }
                bucket.acquire(old, *cost, *max_wait_ms, now)
            }),
            Op::TokenReturn {
                bucket,
                tokens,
                id: Some(id),
                since,
            } => self.update_bucket_with(key, now, |old, _, marks, fields| {
                // A give-back to a full bucket adds nothing and still leaves its mark, so that a retry after a
                // take adds nothing either (token_return.lua).
                let (n, debit) = (tokens.unsigned_abs(), *tokens < 0);
                once((bucket, old, now), (marks, fields), (id, debit, n, 0), *since)
            }),
            Op::TokenReturn { bucket, tokens, .. } if *tokens < 0 => {
                self.update_bucket(key, now, |old, _| bucket.debit(old, tokens.unsigned_abs(), now))
            }
            Op::TokenReturn { bucket, tokens, .. } => {
                let tokens = tokens.unsigned_abs();
                self.update_bucket(key, now, |old, _| bucket.give_back(old, tokens, None, now))
            }
            Op::Debit {
                bucket,
                tokens,
                id,
                hold_ms,
            } => self.update_bucket_with(key, now, |old, _, marks, fields| {
                once((bucket, old, now), (marks, fields), (id, true, *tokens, *hold_ms), None)
            }),
            _ => Err(bad_args(call, "not a token-bucket call")),
        }
    }

    /// Applies a token-bucket step to the key's bucket and ban; a full bucket with no ban is dropped. The entry
    /// lives until the bucket is full again at the parameters it records, or the ban ends (Redis's TTLs on the two
    /// keys): a reload that raises the rate shortens it, as the script's `PEXPIRE` does.
    fn update_bucket(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(Option<TokenBucketState>, &mut Ban) -> (Option<TokenBucketState>, Reply),
    ) -> Result<Reply, StoreError> {
        self.update_bucket_with(key, now, |old, ban, _, _| f(old, ban))
    }

    /// Applies a step to the key's bucket, ban, debit marks and hash fields; the entry lives until the bucket is
    /// full, the ban ends, the hold ends and the last mark is forgotten, whichever is latest (Redis's TTLs on the
    /// keys). The fields go with the hash: once the bucket is full at a save (Redis deletes the hash), or once
    /// it would be full and no hold is left (Redis expired it).
    fn update_bucket_with(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(Option<TokenBucketState>, &mut Ban, &mut Marks, &mut Fields) -> (Option<TokenBucketState>, Reply),
    ) -> Result<Reply, StoreError> {
        self.update_until(key, now, |state| {
            let (mut old, mut ban, mut marks, mut fields) = match state {
                Some((State::TokenBucket(s, ban, marks, fields), _)) => (s.map(|s| *s), ban, marks, fields),
                _ => (None, Ban::default(), Marks::new(), Fields::default()),
            };
            let hash_until = old
                .map_or(0, |s| s.full_at_ms().unwrap_or(u64::MAX))
                .max(fields.hold_until_ms);
            if hash_until <= now {
                // Redis expired the hash (the entry lived on for a ban or a mark): a missing bucket, full in this
                // call's parameters, with no notes or pending tokens.
                old = None;
                fields = Fields::default();
            }
            let (new, reply) = f(old, &mut ban, &mut marks, &mut fields);
            // A held bucket keeps its hash, full or not, until the hold ends (token buckets' save_bucket).
            if new.is_none() && fields.hold_until_ms <= now {
                fields = Fields::default();
            }
            let full_at = new.map_or(0, |s| s.full_at_ms().unwrap_or(u64::MAX));
            let marked = marks.iter().map(|(_, _, until)| *until).max().unwrap_or(0);
            let until = full_at.max(ban.until_ms).max(marked).max(fields.hold_until_ms);
            let keep = until > now;
            (
                keep.then_some((State::TokenBucket(new.map(Box::new), ban, marks, fields), until)),
                reply,
            )
        })
    }
}

/// A debit (`debit`) or a give-back of `n` tokens applied once under the mark `id` (`token_return.lua` with its
/// mark), at `now` to `old`: a mark that exists means applied already, and the reply gives what it did then with
/// the bucket as it is now, nothing written. An applied debit holds the bucket `hold_ms` while it is not full.
fn once(
    (bucket, old, now): (&TokenBucket, Option<TokenBucketState>, u64),
    (marks, fields): (&mut Marks, &mut Fields),
    (id, debit, n, hold_ms): (&str, bool, u64, u64),
    since: Option<u64>,
) -> (Option<TokenBucketState>, Reply) {
    let apply = |old, n| {
        if debit {
            bucket.debit(old, n, now)
        } else {
            bucket.give_back(old, n, since, now)
        }
    };
    marks.retain(|(_, _, until)| *until > now);
    if let Some(&(_, applied, _)) = marks.iter().find(|(mark, ..)| mark == id) {
        let (_, mut reply) = apply(old, 0);
        reply.granted = applied;
        return (old, reply);
    }
    let (new, reply) = apply(old, n);
    let life = if debit {
        debit_mark_ms(*bucket, n)
    } else {
        GIVE_BACK_MARK_MS
    };
    marks.push((id.to_owned(), reply.granted, now.saturating_add(life)));
    if hold_ms > 0 && reply.granted > 0 && new.is_some() {
        fields.hold_until_ms = fields.hold_until_ms.max(now.saturating_add(hold_ms));
    }
    (new, reply)
}
