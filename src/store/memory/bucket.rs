//! The token-bucket calls of the in-process store, as `token_bucket.lua`, `token_lease.lua`, `token_acquire.lua`
//! and `token_return.lua` run them: the bucket's level ([`crate::algorithm::TokenBucket`]), its ban, its marks
//! and the fields of its hash ([`super::hash`]), one entry under one lock.

use super::hash::{Fields, Marks};
use super::{MemoryStore, State};
use crate::algorithm::token_bucket::Back;
use crate::algorithm::{Ban, Reply, TokenBucket, TokenBucketState};
use crate::error::StoreError;
use crate::store::bad_args;
use crate::store::call::{Call, Op};
use crate::timings::Timings;

impl MemoryStore {
    /// Runs `call`, a token-bucket call whose arguments were checked, at `now` (ms).
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` for a call of another algorithm.
    pub(super) fn run_bucket(&self, call: &Call, now: u64) -> Result<Reply, StoreError> {
        let at = (call.key.as_str(), call.adopted_ms, now);
        match &call.op {
            Op::TokenLease {
                bucket,
                min,
                max,
                batch,
                pace,
                hold,
            } => self.update_bucket_with(*bucket, at, |bucket, old, _, _, fields| {
                let paced = (*pace, hold.as_ref());
                let (new, next, reply) = bucket.lease((old, fields.turn_ms), (*min, *max, *batch), paced, now);
                fields.turn_ms = next;
                (new, reply)
            }),
            Op::TokenBucket {
                bucket,
                min,
                max,
                ban_ms,
            } => self.update_bucket(*bucket, at, |bucket, old, ban| {
                bucket.take_banned(old, ban, *min, *max, *ban_ms, now)
            }),
            Op::TokenAcquire {
                bucket,
                cost,
                max_wait_ms,
            } => self.update_bucket(*bucket, at, |bucket, old, _| {
                bucket.acquire(old, *cost, *max_wait_ms, now)
            }),
            Op::TokenReturn {
                bucket,
                tokens,
                id: Some(id),
                mark_ms,
                lent,
            } => self.update_bucket_with(*bucket, at, |bucket, old, _, marks, _| {
                // A give-back to a full bucket adds nothing and still leaves its mark, so that a retry after a
                // take adds nothing either (token_return.lua).
                let back = if lent.is_empty() {
                    Back::Unnamed(*tokens)
                } else {
                    Back::Lent(lent)
                };
                once((&bucket, old, now), marks, (id, *mark_ms), back)
            }),
            Op::TokenReturn { bucket, tokens, .. } => self.update_bucket(*bucket, at, |bucket, old, _| {
                bucket.give_back(old, Back::Unnamed(*tokens), now)
            }),
            _ => Err(bad_args(call, "not a token-bucket call")),
        }
    }

    /// Applies a token-bucket step to the key's bucket and ban; a full bucket with no ban is dropped. The entry
    /// lives until the bucket is full again at the parameters it records, or the ban ends (Redis's TTLs on the two
    /// keys): a reload that raises the rate shortens it, as the script's `PEXPIRE` does.
    fn update_bucket(
        &self,
        bucket: TokenBucket,
        at: (&str, u64, u64),
        f: impl FnOnce(TokenBucket, Option<TokenBucketState>, &mut Ban) -> (Option<TokenBucketState>, Reply),
    ) -> Result<Reply, StoreError> {
        self.update_bucket_with(bucket, at, |bucket, old, ban, _, _| f(bucket, old, ban))
    }

    /// Applies a step to the key's bucket, ban, give-back marks and hash fields; the entry lives until the bucket
    /// is full, the ban ends and the last mark is forgotten, whichever is latest (Redis's TTLs on the keys). The
    /// fields go with the hash: once the bucket is full at a save (Redis deletes the hash), or once it would be
    /// full (Redis expired it). `at` is the key, the call's `adopted_ms` and now (ms): the step runs with the
    /// parameters in force ([`TokenBucketState::in_force`]) and the bucket it leaves records the latest adoption.
    fn update_bucket_with(
        &self,
        bucket: TokenBucket,
        (key, adopted_ms, now): (&str, u64, u64),
        f: impl FnOnce(
            TokenBucket,
            Option<TokenBucketState>,
            &mut Ban,
            &mut Marks,
            &mut Fields,
        ) -> (Option<TokenBucketState>, Reply),
    ) -> Result<Reply, StoreError> {
        self.update_until(key, now, |state| {
            let (mut old, mut ban, mut marks, mut fields) = match state {
                Some((State::TokenBucket(s, ban, marks, fields), _)) => (s.map(|s| *s), ban, marks, fields),
                _ => (None, Ban::default(), Marks::new(), Fields::default()),
            };
            let hash_until = old.as_ref().map_or(0, |s| s.full_at_ms().unwrap_or(u64::MAX));
            if hash_until <= now {
                // Redis expired the hash (the entry lived on for a ban or a mark): a missing bucket, full in this
                // call's parameters, with no notes or pending tokens.
                old = None;
                fields = Fields::default();
            }
            let (bucket, adopted_ms) = TokenBucketState::in_force(old.as_ref(), bucket, adopted_ms);
            let (mut new, reply) = f(bucket, old, &mut ban, &mut marks, &mut fields);
            if let Some(s) = new.as_mut() {
                s.adopted_ms = adopted_ms;
            }
            // A full bucket's hash is deleted, its fields with it (token buckets' save_bucket).
            if new.is_none() {
                fields = Fields::default();
            }
            let full_at = new.as_ref().map_or(0, |s| s.full_at_ms().unwrap_or(u64::MAX));
            let marked = marks.iter().map(|(_, _, until)| *until).max().unwrap_or(0);
            let until = full_at.max(ban.until_ms).max(marked);
            let keep = until > now;
            (
                keep.then_some((State::TokenBucket(new.map(Box::new), ban, marks, fields), until)),
                reply,
            )
        })
    }
}

/// A give-back applied once under the mark `id` kept `mark_ms` (`token_return.lua` with its mark), at `now` to
/// `old`: a mark that exists means applied already, and the reply gives what it added then with the bucket as it
/// is now, nothing written.
fn once(
    (bucket, old, now): (&TokenBucket, Option<TokenBucketState>, u64),
    marks: &mut Marks,
    (id, mark_ms): (&str, u64),
    back: Back<'_>,
) -> (Option<TokenBucketState>, Reply) {
    marks.retain(|(_, _, until)| *until > now);
    if let Some(&(_, applied, _)) = marks.iter().find(|(mark, ..)| mark == id) {
        let (_, mut reply) = bucket.give_back(old.clone(), Back::Unnamed(0), now);
        reply.granted = applied;
        return (old, reply);
    }
    let (new, reply) = bucket.give_back(old, back, now);
    let mark_ms = if mark_ms == 0 {
        crate::clock::millis(Timings::GIVE_BACK_MARK)
    } else {
        mark_ms
    };
    marks.push((id.to_owned(), reply.granted, now.saturating_add(mark_ms)));
    (new, reply)
}
