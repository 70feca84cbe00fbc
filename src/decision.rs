//! What a check answers: a [`Decision`] (a refusal is a decision, not an error), a [`Permit`] for a paced job,
//! and the [`Source`] that made either.
//!
//! "Never" has one encoding at each boundary: `-1` in the Lua protocol ([`NEVER`]), [`Duration::MAX`] in the
//! public types, and `crate::clock::NEVER_NS` in the nanoseconds the hot path counts in. The scripts' `-1`
//! becomes [`Duration::MAX`] in [`from_protocol_ms`], the only place that reads the protocol's milliseconds;
//! `clock::nanos` and `clock::duration` map [`Duration::MAX`] and `NEVER_NS` onto each other.

use std::time::Duration;

use crate::algorithm::{Reply, NEVER};

/// Where a decision was made: the `source` label of `tokenlease_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// In this process: from its leased tokens, or from a refusal it remembers until the store's `retry_after`.
    Local,
    /// By a script in Redis.
    Redis,
    /// By the in-process store.
    Memory,
    /// By the rule's `fail_mode` while the store failed.
    Fallback,
}

impl Source {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Redis => "redis",
            Self::Memory => "memory",
            Self::Fallback => "fallback",
        }
    }

    /// Every source, in declaration order (the index of a per-source metric handle).
    pub(crate) const ALL: [Source; 4] = [Self::Local, Self::Redis, Self::Memory, Self::Fallback];
}

/// The answer to a check. A refusal is a decision, not an error.
#[must_use = "a decision does nothing unless `allowed` is looked at"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the call may go ahead (its tokens are spent).
    pub allowed: bool,
    /// Tokens left: in the shared bucket for decisions made by a store; for decisions made from leased tokens
    /// (`source == Local`), a lower bound of what this process has left (what the deciding thread's shard has:
    /// the others are not read on the hot path; 0 when refused).
    pub remaining: u64,
    /// Zero when allowed; otherwise how long until the same call would be allowed. [`Duration::MAX`] when it
    /// never can (a stock with rate 0).
    pub retry_after: Duration,
    /// How long until the key is back to its full allowance ([`Duration::MAX`]: never).
    pub reset_after: Duration,
    /// Where the decision was made.
    pub source: Source,
    /// The rule is in shadow mode ([`crate::Rule::shadow`]) and would have refused this call: `allowed` is true
    /// anyway and `retry_after` zero.
    pub shadowed: bool,
}

impl Decision {
    /// The decision a store's reply makes for `cost` tokens.
    pub(crate) fn from_reply(reply: &Reply, cost: u64, source: Source) -> Self {
        Self {
            allowed: reply.granted >= cost,
            remaining: reply.remaining,
            retry_after: from_protocol_ms(reply.retry_after_ms),
            reset_after: from_protocol_ms(reply.reset_after_ms),
            source,
            shadowed: false,
        }
    }

    /// The answer to a peek (cost 0): allowed when a call of one token would be now; nothing was taken.
    pub(crate) fn from_peek(reply: &Reply, source: Source) -> Self {
        Self {
            allowed: reply.retry_after_ms == 0,
            ..Self::from_reply(reply, 0, source)
        }
    }

    /// A decision made without the shared bucket's numbers: by `fail_mode`, or locally while a lease is slow.
    pub(crate) fn bare(allowed: bool, retry_after: Duration, source: Source) -> Self {
        Self {
            allowed,
            remaining: 0,
            retry_after,
            reset_after: Duration::ZERO,
            source,
            shadowed: false,
        }
    }
}

/// Permission to run one paced job, from [`crate::Limiter::acquire`]: its slot has come.
#[must_use = "a permit means the job may run now"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    /// How long the caller waited in the queue.
    pub waited: Duration,
    /// Tokens the job was granted.
    pub cost: u64,
    /// Where the slot was reserved (`redis`, `memory`, or `fallback` when the store failed).
    pub source: Source,
}

/// The protocol's milliseconds (`-1`: never) as a duration ([`Duration::MAX`]: never).
pub(crate) fn from_protocol_ms(v: i64) -> Duration {
    if v == NEVER {
        Duration::MAX
    } else {
        Duration::from_millis(u64::try_from(v).unwrap_or(0))
    }
}
