//! Typed store calls: one constructor per script of `lua/`, and the only place where store keys are built. The
//! in-process store matches on the same types; `script.rs` turns them into a script's `KEYS` and `ARGV` for Redis,
//! so neither side decodes positions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::algorithm::fleet::Beat;
use crate::algorithm::room::Lent;
use crate::algorithm::{HoldAsk, LeakyBucket, Pace, TokenBucket};
use crate::rule::{Algorithm, Calendar};

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
    /// slot is free now). A leased bucket's call is its cold key's: the lease is ignored, and so is a ban (a
    /// leased rule cannot ban; one whose public fields say otherwise does not ban its cold keys either).
    pub(crate) fn check(algorithm: &Algorithm, key: &str, cost: u64, members: &Members) -> Self {
        match algorithm {
            Algorithm::TokenBucket {
                bucket, lease: Some(_), ..
            } => Self::take_or_ban(key, *bucket, cost, 0),
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

    /// The ban key beside the decided key (same hash tag).
    pub(crate) fn ban_key(&self) -> String {
        format!("{}:ban", self.key)
    }

    /// A marked give-back's mark beside the decided key (same hash tag): applied once ([`Call::once`]).
    pub(crate) fn mark_key(&self, id: &str) -> String {
        format!("{}:return:{id}", self.key)
    }

    /// The same call with its own timeout.
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// This call made with parameters adopted at `adopted_ms` (ms since the Unix epoch): a token bucket's hash
    /// keeps the latest it saw, and a call adopted earlier reads the bucket in the hash's parameters (invariant
    /// 11). Other calls ignore it.
    #[must_use]
    pub(crate) fn adopted(mut self, adopted_ms: u64) -> Self {
        self.adopted_ms = adopted_ms;
        self
    }

    // The token bucket's calls: takes, leases, give-backs and pay-later acquires.

    /// `token_bucket.lua` with its ban key: take `cost` tokens, ban for `ban_ms` after a refusal.
    pub(crate) fn take_or_ban(key: impl Into<String>, bucket: TokenBucket, cost: u64, ban_ms: u64) -> Self {
        Self::new(
            key,
            Op::TokenBucket {
                bucket,
                min: cost,
                max: cost,
                ban_ms,
            },
        )
    }

    /// `token_lease.lua`: a lease of between `min` and `max` tokens sized for `batch`, handed the bucket's next
    /// turn (`batch` spaces them) when it leaves fewer than `min` tokens behind.
    pub(crate) fn lease(key: impl Into<String>, bucket: TokenBucket, (min, max): (u64, u64), batch: u64) -> Self {
        Self::new(
            key,
            Op::TokenLease {
                bucket,
                min,
                max,
                batch,
                pace: Pace::default(),
                hold: None,
            },
        )
    }

    /// This lease (of [`Call::lease`]) released by `pace`: in chunks, the bucket keeping what is to be released
    /// as pending. Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn paced(mut self, pace: Pace) -> Self {
        if let Op::TokenLease { pace: p, .. } = &mut self.op {
            *p = pace;
        }
        self
    }

    /// This lease (of [`Call::lease`]) asking to hold tokens for an outage (`fail_mode = "local"`'s reserve,
    /// [`crate::algorithm::hold`]). Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn holding(mut self, ask: HoldAsk) -> Self {
        if let Op::TokenLease { hold, .. } = &mut self.op {
            *hold = Some(ask);
        }
        self
    }

    /// `token_return.lua`: `tokens` back to the bucket.
    pub(crate) fn give_back(key: impl Into<String>, bucket: TokenBucket, tokens: u64) -> Self {
        Self::new(
            key,
            Op::TokenReturn {
                bucket,
                tokens,
                id: None,
                mark_ms: 0,
                lent: Vec::new(),
            },
        )
    }

    /// This give-back (of [`Call::give_back`]) of the tokens of the leases `lent` names ([`Lent`], by the
    /// [`crate::algorithm::Reply::stamp`] of each): its tokens become their sum, and each lease's add at most the
    /// room the bucket had since it. Applies to a call made [`Call::once`] (the script reads the stamps after the
    /// mark); other calls are returned unchanged.
    #[must_use]
    pub(crate) fn since(mut self, lent: Vec<Lent>) -> Self {
        if let Op::TokenReturn { tokens, lent: at, .. } = &mut self.op {
            *tokens = lent.iter().map(|l| l.tokens).sum();
            *at = lent;
        }
        self
    }

    /// This give-back (of [`Call::give_back`]) applied once however often it is sent with the same `id` (unique
    /// to the call; it must not hold `}`) within `mark` (longer than the call and its retries may take,
    /// [`crate::timings::Timings::mark`]): sent again after a connection dropped once the script ran (a Cluster
    /// client retries such a call), it does not add the tokens twice. Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn once(mut self, id: impl Into<String>, mark: Duration) -> Self {
        if let Op::TokenReturn { id: at, mark_ms, .. } = &mut self.op {
            *at = Some(id.into());
            *mark_ms = crate::clock::millis(mark).max(1);
        }
        self
    }

    /// `token_acquire.lua`: take `cost` now and pay later, when the wait fits in `max_wait_ms`.
    pub(crate) fn acquire(key: impl Into<String>, bucket: TokenBucket, cost: u64, max_wait_ms: u64) -> Self {
        Self::new(
            key,
            Op::TokenAcquire {
                bucket,
                cost,
                max_wait_ms,
            },
        )
    }
}

/// Unique members of sliding-log and leaky-bucket calls: `{prefix}-{n}`, the prefix telling apart processes
/// and limiters of one process.
#[derive(Debug)]
pub(crate) struct Members {
    prefix: String,
    next: AtomicU64,
}

impl Members {
    /// Members for one limiter of this process: the prefix is the process id, the wall clock's nanoseconds now
    /// (a restarted process with the same id gets another) and the limiter's number in the process (two
    /// limiters built in the same nanosecond get two).
    pub(crate) fn new() -> Self {
        static LIMITERS: AtomicU64 = AtomicU64::new(0);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = LIMITERS.fetch_add(1, Ordering::Relaxed);
        Self {
            prefix: format!("{:x}.{seed:x}.{n:x}", std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    /// Members named `{name}-{n}`, the limiter itself `name` (see [`crate::LimiterBuilder::member`]).
    pub(crate) fn named(name: String) -> Self {
        Self {
            prefix: name,
            next: AtomicU64::new(0),
        }
    }

    /// The limiter's own name: its member in the rules' rosters (`fleet.lua`).
    pub(crate) fn name(&self) -> &str {
        &self.prefix
    }

    /// The next member.
    pub(crate) fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.prefix)
    }
}

/// Calls only the tests make.
#[cfg(test)]
impl Call {
    /// `token_bucket.lua`: take between `min` and `max` tokens (the limiter leases with [`Call::lease`]).
    pub(crate) fn take(key: impl Into<String>, bucket: TokenBucket, min: u64, max: u64) -> Self {
        Self::new(
            key,
            Op::TokenBucket {
                bucket,
                min,
                max,
                ban_ms: 0,
            },
        )
    }

    /// The same call replayed at `now_ms` (tests).
    pub(crate) fn at(mut self, now_ms: u64) -> Self {
        self.now_ms = Some(now_ms);
        self
    }
}
