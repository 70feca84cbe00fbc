//! Typed store calls: one constructor per script of `lua/` (`script.rs`), and the only place where a call becomes the
//! script's `KEYS` and `ARGV` (as redis-rs's `ScriptInvocation` builds an invocation) and where store keys are
//! built. The in-process store matches on the same types, so neither side decodes positions.

use std::time::Duration;

use crate::algorithm::fleet::Beat;
use crate::algorithm::room::Lent;
use crate::algorithm::{ms, HoldAsk, LeakyBucket, Pace, TokenBucket};
use crate::rule::{Algorithm, Calendar};

pub(crate) use super::script::Script;
pub(crate) use members::Members;

mod members;
mod token_bucket;

/// What a call asks of its script, with its arguments typed. Tokens are counts, times are milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `token_bucket.lua`: take between `min` and `max` tokens (all that is there up to `max`, when at least
    /// `min` is). With `ban_ms > 0` the call carries the ban key and bans the key after a refusal.
    TokenBucket {
        bucket: TokenBucket,
        min: u64,
        max: u64,
        ban_ms: u64,
    },
    /// `token_lease.lua`: take between `min` and `max` tokens, and the bucket's next turn (spaced by `batch`)
    /// when the call leaves fewer than `min` behind (invariant 18); a grant released by `pace` is pending in the
    /// bucket until its last chunk. With a `hold`, the caller's hold for an outage is kept, topped up and
    /// renewed ([`crate::algorithm::hold`]).
    TokenLease {
        bucket: TokenBucket,
        min: u64,
        max: u64,
        batch: u64,
        pace: Pace,
        hold: Option<HoldAsk>,
    },
    /// `token_return.lua`: give `tokens` back (capped at the capacity). With an
    /// `id`, applied once however often the call is sent (the mark `{key}:return:{id}`, kept `mark_ms`): a
    /// give-back retried after a connection dropped once the script ran does not add the tokens twice. `lent`:
    /// the tokens by the lease each came from ([`Lent`], named by its [`crate::algorithm::Reply::stamp`]; their
    /// sum is `tokens`), each capped at the room the bucket had since its lease (sent with an `id` only); empty
    /// when not named.
    TokenReturn {
        bucket: TokenBucket,
        tokens: u64,
        id: Option<String>,
        mark_ms: u64,
        lent: Vec<Lent>,
    },
    /// `token_acquire.lua`: take `cost` now, into debt, when the wait for the debt fits in `max_wait_ms`.
    TokenAcquire {
        bucket: TokenBucket,
        cost: u64,
        max_wait_ms: u64,
    },
    /// `sliding_log.lua`: `cost` tokens against `limit` per `window_ms`; `member` is unique per call.
    SlidingLog {
        window_ms: u64,
        limit: u64,
        cost: u64,
        member: String,
        ban_ms: u64,
    },
    /// `fixed_window.lua`: `calendar` `None` rolls (the first hit opens the window), `Some` cuts calendar
    /// windows of a fixed offset (`align_ms`) or of a time zone (the client sends the windows around its clock).
    FixedWindow {
        window_ms: u64,
        limit: u64,
        cost: u64,
        ban_ms: u64,
        calendar: Option<Calendar>,
    },
    /// `sliding_window.lua`: `limit` per `window_ms`, counted in `sub_buckets` sub-buckets.
    SlidingWindow {
        window_ms: u64,
        sub_buckets: u64,
        limit: u64,
        cost: u64,
        ban_ms: u64,
    },
    /// `leaky_bucket.lua`: reserve the next slot for `cost` tokens when the wait fits in `max_wait_ms`.
    LeakyBucket {
        queue: LeakyBucket,
        cost: u64,
        max_wait_ms: u64,
        member: String,
    },
    /// `leaky_return.lua`: hand the reservation `member` back while nobody queued behind it.
    LeakyReturn {
        queue: LeakyBucket,
        cost: u64,
        member: String,
    },
    /// `reset.lua`: forget the key's state and its ban.
    Reset,
    /// `fleet.lua`: a member's beat in a rule's roster (the call's key), answered with the live count.
    Fleet(Beat),
}

/// An argument of a script, in `ARGV` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg<'a> {
    Int(i64),
    Str(&'a str),
    /// A give-back's tokens by lease, sent as `stamp:tokens` pairs joined by commas ([`Lent::encode`]).
    Lent(&'a [Lent]),
}

/// An integer argument (tokens or ms), saturating at `i64::MAX`.
pub(crate) fn int(v: u64) -> Arg<'static> {
    Arg::Int(ms(v))
}

/// One script call: the key it decides, what it asks, and optionally the time it runs at and its own timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The store key, `{prefix}:{rule:key}` (see [`store_key`]).
    pub(crate) key: String,
    pub(crate) op: Op,
    /// The optional trailing `now_ms`: `None` lets the store read its own clock (Redis `TIME`).
    pub(crate) now_ms: Option<u64>,
    /// A timeout for this call instead of the store's own.
    pub(crate) timeout: Option<Duration>,
    /// A token-bucket call's `adopted_ms`: when the caller adopted the bucket's parameters
    /// ([`crate::compiled::Compiled::adopted_ms`]); 0 says nothing (a call adopted before any other).
    pub(crate) adopted_ms: u64,
}

/// The store key of `key` under `rule`: `{prefix}:{rule:key}`, the hash tag keeping a rule's keys for one key in
/// one Redis Cluster slot.
pub(crate) fn store_key(prefix: &str, rule: &str, key: &str) -> String {
    format!("{prefix}:{{{rule}:{key}}}")
}

/// The roster of `rule` (`fleet.lua`): `{prefix}:fleet:{rule}`. Store keys put `:{` right after the prefix and
/// rule names hold no `:`, so it is no store key of any (rule, key) pair.
pub(crate) fn roster_key(prefix: &str, rule: &str) -> String {
    format!("{prefix}:fleet:{{{rule}}}")
}

impl Call {
    fn new(key: impl Into<String>, op: Op) -> Self {
        Self {
            key: key.into(),
            op,
            now_ms: None,
            timeout: None,
            adopted_ms: 0,
        }
    }

    /// `fleet.lua`: `beat` in the roster `key` ([`roster_key`]).
    pub(crate) fn beat(key: impl Into<String>, beat: Beat) -> Self {
        Self::new(key, Op::Fleet(beat))
    }

    /// `sliding_log.lua`.
    pub(crate) fn sliding_log(
        key: impl Into<String>,
        (window_ms, limit): (u64, u64),
        cost: u64,
        ban_ms: u64,
        member: impl Into<String>,
    ) -> Self {
        let member = member.into();
        Self::new(
            key,
            Op::SlidingLog {
                window_ms,
                limit,
                cost,
                member,
                ban_ms,
            },
        )
    }

    /// `fixed_window.lua`.
    pub(crate) fn fixed_window(
        key: impl Into<String>,
        (window_ms, limit): (u64, u64),
        cost: u64,
        ban_ms: u64,
        calendar: Option<Calendar>,
    ) -> Self {
        Self::new(
            key,
            Op::FixedWindow {
                window_ms,
                limit,
                cost,
                ban_ms,
                calendar,
            },
        )
    }

    /// `sliding_window.lua`.
    pub(crate) fn sliding_window(
        key: impl Into<String>,
        (window_ms, limit): (u64, u64),
        sub_buckets: u64,
        cost: u64,
        ban_ms: u64,
    ) -> Self {
        Self::new(
            key,
            Op::SlidingWindow {
                window_ms,
                sub_buckets,
                limit,
                cost,
                ban_ms,
            },
        )
    }

    /// `leaky_bucket.lua`: reserve a slot.
    pub(crate) fn reserve(
        key: impl Into<String>,
        queue: LeakyBucket,
        cost: u64,
        max_wait_ms: u64,
        member: impl Into<String>,
    ) -> Self {
        let member = member.into();
        Self::new(
            key,
            Op::LeakyBucket {
                queue,
                cost,
                max_wait_ms,
                member,
            },
        )
    }

    /// `leaky_return.lua`: hand a reservation back.
    pub(crate) fn release(key: impl Into<String>, queue: LeakyBucket, cost: u64, member: impl Into<String>) -> Self {
        let member = member.into();
        Self::new(key, Op::LeakyReturn { queue, cost, member })
    }

    /// `reset.lua`: forget the state of `key` (bucket, log, window or queue) and its ban.
    pub(crate) fn reset(key: impl Into<String>) -> Self {
        Self::new(key, Op::Reset)
    }

    /// The call deciding `cost` tokens of `key` under `algorithm` at once (a leaky bucket answers whether a
    /// slot is free now).
    pub(crate) fn check(algorithm: &Algorithm, key: &str, cost: u64, members: &Members) -> Self {
        match algorithm {
            Algorithm::TokenBucket { bucket, ban_ms, .. } => Self::take_or_ban(key, *bucket, cost, *ban_ms),
            Algorithm::SlidingLog {
                limit,
                window_ms,
                ban_ms,
            } => Self::sliding_log(key, (*window_ms, *limit), cost, *ban_ms, members.next()),
            Algorithm::FixedWindow {
                limit,
                window_ms,
                calendar,
                ban_ms,
            } => Self::fixed_window(key, (*window_ms, *limit), cost, *ban_ms, calendar.clone()),
            Algorithm::SlidingWindow {
                limit,
                window_ms,
                sub_buckets,
                ban_ms,
            } => Self::sliding_window(key, (*window_ms, *limit), *sub_buckets, cost, *ban_ms),
            Algorithm::LeakyBucket { rate, per_ms, .. } => {
                let queue = LeakyBucket {
                    rate: *rate,
                    per_ms: *per_ms,
                };
                Self::reserve(key, queue, cost, 0, members.next())
            }
        }
    }

    /// The call reserving `cost` tokens for an `acquire` whose wait is bounded by `max_wait_ms`; `None` for a rule
    /// that is neither a leaky nor a token bucket.
    pub(crate) fn reservation(
        algorithm: &Algorithm,
        key: &str,
        cost: u64,
        max_wait_ms: u64,
        members: &Members,
    ) -> Option<Self> {
        match algorithm {
            Algorithm::TokenBucket { bucket, .. } => Some(Self::acquire(key, *bucket, cost, max_wait_ms)),
            Algorithm::LeakyBucket { rate, per_ms, .. } => {
                let queue = LeakyBucket {
                    rate: *rate,
                    per_ms: *per_ms,
                };
                Some(Self::reserve(key, queue, cost, max_wait_ms, members.next()))
            }
            _ => None,
        }
    }

    /// The call handing back what this reservation took: its tokens to the bucket (the debt shrinks for whoever
    /// comes next), or its slot to the queue while nobody queued behind it. `None` for other calls.
    pub(crate) fn undo(&self) -> Option<Self> {
        match &self.op {
            Op::TokenAcquire { bucket, cost, .. } => {
                Some(Self::give_back(self.key.clone(), *bucket, *cost).adopted(self.adopted_ms))
            }
            Op::LeakyBucket {
                queue, cost, member, ..
            } => Some(Self::release(self.key.clone(), *queue, *cost, member.clone())),
            _ => None,
        }
    }

    /// The windows of `zone` around this process's clock (or the call's `now_ms`) and its neighbours: the
    /// script picks the one holding the Redis server's TIME (invariant 6).
    fn zone_bounds(&self, zone: &crate::rule::Zone, window_ms: u64) -> [i64; 4] {
        let now = self.now_ms.map_or_else(crate::rule::wall_clock_ms, ms);
        zone.bounds(window_ms, now)
    }

    /// The same call replayed at `now_ms` (tests).
    #[cfg(test)]
    pub(crate) fn at(mut self, now_ms: u64) -> Self {
        self.now_ms = Some(now_ms);
        self
    }

    /// The same call with its own timeout.
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The script this call runs.
    pub(crate) fn script(&self) -> Script {
        match self.op {
            Op::TokenBucket { .. } => Script::TokenBucket,
            Op::TokenLease { .. } => Script::TokenLease,
            Op::TokenReturn { .. } => Script::TokenReturn,
            Op::TokenAcquire { .. } => Script::TokenAcquire,
            Op::SlidingLog { .. } => Script::SlidingLog,
            Op::FixedWindow { .. } => Script::FixedWindow,
            Op::SlidingWindow { .. } => Script::SlidingWindow,
            Op::LeakyBucket { .. } => Script::LeakyBucket,
            Op::LeakyReturn { .. } => Script::LeakyReturn,
            Op::Reset => Script::Reset,
            Op::Fleet(_) => Script::Fleet,
        }
    }

    /// The ban key beside the decided key (same hash tag).
    pub(crate) fn ban_key(&self) -> String {
        format!("{}:ban", self.key)
    }

    /// `KEYS`, in the script's order: the decided key, and the ban key for the scripts that ban (a give-back's
    /// mark for a marked give-back).
    pub(crate) fn keys(&self) -> Vec<String> {
        if let Op::TokenReturn { id: Some(id), .. } = &self.op {
            return vec![self.key.clone(), format!("{}:return:{id}", self.key)];
        }
        let banned = match &self.op {
            Op::TokenBucket { ban_ms, .. } => *ban_ms > 0,
            Op::SlidingLog { .. } | Op::FixedWindow { .. } | Op::SlidingWindow { .. } | Op::Reset => true,
            Op::TokenReturn { .. }
            | Op::TokenLease { .. }
            | Op::TokenAcquire { .. }
            | Op::LeakyBucket { .. }
            | Op::LeakyReturn { .. }
            | Op::Fleet(_) => false,
        };
        if banned {
            vec![self.key.clone(), self.ban_key()]
        } else {
            vec![self.key.clone()]
        }
    }

    /// This call made with parameters adopted at `adopted_ms` (ms since the Unix epoch): a token bucket's hash
    /// keeps the latest it saw, and a call adopted earlier reads the bucket in the hash's parameters (invariant
    /// 11). Other calls ignore it.
    #[must_use]
    pub(crate) fn adopted(mut self, adopted_ms: u64) -> Self {
        self.adopted_ms = adopted_ms;
        self
    }

    /// `ARGV`, in the script's order (see each script's header), with the trailing `now_ms` when set; a token
    /// call adopted at some instant then has `now_ms` (empty when unset: the server's TIME) and `adopted_ms`.
    pub(crate) fn args(&self) -> Vec<Arg<'_>> {
        let bucket = |b: &TokenBucket| [int(b.capacity), int(b.rate), int(b.per_ms)];
        let mut args: Vec<Arg<'_>> = match &self.op {
            Op::TokenBucket {
                bucket: b,
                min,
                max,
                ban_ms,
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*min), int(*max)]);
                if *ban_ms > 0 {
                    v.push(int(*ban_ms));
                }
                v
            }
            Op::TokenLease {
                bucket: b,
                min,
                max,
                batch,
                pace,
                ..
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*min), int(*max), int(*batch), int(pace.chunk), int(pace.chunk_ms)]);
                v
            }
            Op::TokenReturn {
                bucket: b,
                tokens,
                id,
                mark_ms,
                lent,
            } => {
                let mut v = bucket(b).to_vec();
                v.push(int(*tokens));
                if id.is_some() {
                    v.push(int(*mark_ms));
                    v.push(if lent.is_empty() { Arg::Int(-1) } else { Arg::Lent(lent) });
                }
                v
            }
            Op::TokenAcquire {
                bucket: b,
                cost,
                max_wait_ms,
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*cost), int(*max_wait_ms)]);
                v
            }
            Op::SlidingLog {
                window_ms,
                limit,
                cost,
                member,
                ban_ms,
            } => vec![int(*window_ms), int(*limit), int(*cost), Arg::Str(member), int(*ban_ms)],
            Op::FixedWindow {
                window_ms,
                limit,
                cost,
                ban_ms,
                calendar,
            } => {
                let mut v = vec![int(*window_ms), int(*limit), int(*cost), int(*ban_ms)];
                match calendar {
                    None => v.push(Arg::Int(-1)),
                    Some(Calendar::Offset { align_ms }) => v.push(int(*align_ms)),
                    Some(Calendar::Zone(zone)) => {
                        v.push(Arg::Int(-2));
                        v.extend(self.zone_bounds(zone, *window_ms).map(Arg::Int));
                    }
                }
                v
            }
            Op::SlidingWindow {
                window_ms,
                sub_buckets,
                limit,
                cost,
                ban_ms,
            } => vec![
                int(*window_ms),
                int(*sub_buckets),
                int(*limit),
                int(*cost),
                int(*ban_ms),
            ],
            Op::LeakyBucket {
                queue,
                cost,
                max_wait_ms,
                member,
            } => vec![
                int(queue.rate),
                int(queue.per_ms),
                int(*cost),
                int(*max_wait_ms),
                Arg::Str(member),
            ],
            Op::LeakyReturn { queue, cost, member } => {
                vec![int(queue.rate), int(queue.per_ms), int(*cost), Arg::Str(member)]
            }
            Op::Reset => Vec::new(),
            Op::Fleet(beat) => vec![
                Arg::Str(&beat.member),
                int(beat.live_ms),
                int(beat.keep_ms),
                Arg::Int(i64::from(beat.leave)),
            ],
        };
        let token = matches!(
            self.op,
            Op::TokenBucket { .. } | Op::TokenLease { .. } | Op::TokenReturn { .. } | Op::TokenAcquire { .. }
        );
        let hold = match &self.op {
            Op::TokenLease { hold: Some(h), .. } => Some(h),
            _ => None,
        };
        // Optional arguments in order: now_ms, adopted_ms, then a lease's hold (each earlier one given, empty for
        // the store's TIME).
        let adopted = token && (self.adopted_ms > 0 || hold.is_some());
        match self.now_ms {
            Some(now) => args.push(int(now)),
            None if adopted => args.push(Arg::Str("")),
            None => {}
        }
        if adopted {
            args.push(int(self.adopted_ms));
        }
        if let Some(h) = hold {
            args.extend([
                Arg::Str(&h.holder),
                int(h.seq),
                int(h.held),
                int(h.want),
                int(h.hold_ms),
            ]);
        }
        args
    }
}

#[cfg(test)]
mod tests;
