//! Refusals answered in process (invariant 4). After the store refuses a key, saying "retry after X", this
//! process refuses the same key locally until X, for every algorithm: a client hammering a key over its limit
//! costs the store one call per `retry_after`, not one per attempt. envoy's ratelimit answers keys over their
//! limit from a local cache in the same way; a hot key of a leased rule has this in its local bucket already.
//!
//! Remembering a refusal can only sell less, never more: until X the store would refuse the same call too,
//! except for tokens given back meanwhile (a lease's unused tokens, a reset, which forgets the key here). X is
//! counted from when the call was sent, before the store read its clock, so it is never later than the store's.
//!
//! Bounded: at most [`ProcessConfig::max_refused_keys`](crate::ProcessConfig::max_refused_keys) keys over all
//! rules, evicted by S3-FIFO (quick_cache: the oldest keys not refused again first). Keyed by the rule's
//! generation (invariant 20), so a reload forgets what the rule it replaced refused.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quick_cache::sync::Cache;
use quick_cache::{Equivalent, UnitWeighter};

use crate::clock::{duration, nanos};
use crate::decision::{Decision, Source};
use crate::timings::Timings;

/// What a remembered refusal answers, in ns on the engine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    /// Calls of at least this cost are refused until `until` ends (a smaller cost may be granted sooner).
    cost: u64,
    until: Until,
    /// What the store said was left.
    remaining: u64,
    /// When the key is back to its full allowance (`None`: never).
    reset_at_ns: Option<u64>,
}

/// How long a remembered refusal answers, in ns on the engine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Until the store's `retry_after`, counted from when the call was sent.
    Retry { at_ns: u64 },
    /// The store said "never" (the cost is over what the key can ever hold): answered as never, as a hot key's
    /// local bucket does, and asked again at `recheck_ns` ([`Timings::NEVER_REMEMBERED`] later), since tokens
    /// given back or a reload may still change it.
    Never { recheck_ns: u64 },
}

impl Until {
    /// When the store is asked again.
    fn ends_ns(self) -> u64 {
        match self {
            Self::Retry { at_ns } => at_ns,
            Self::Never { recheck_ns } => recheck_ns,
        }
    }

    /// The `retry_after` a caller is told at `now_ns` (before [`Self::ends_ns`]).
    fn retry_after(self, now_ns: u64) -> Duration {
        match self {
            Self::Retry { at_ns } => duration(at_ns.saturating_sub(now_ns)),
            Self::Never { .. } => Duration::MAX,
        }
    }
}

/// A key as the cache holds it: the rule's generation and the caller's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cached {
    rule: u64,
    key: String,
}

/// A key as a lookup borrows it; hashes as [`Cached`] does.
struct Looked<'a> {
    rule: u64,
    key: &'a str,
}

impl Hash for Looked<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.rule.hash(state);
        self.key.hash(state);
    }
}

impl Equivalent<Cached> for Looked<'_> {
    fn equivalent(&self, cached: &Cached) -> bool {
        self.rule == cached.rule && self.key == cached.key
    }
}

/// The refusals this process remembers; see the module docs.
pub(crate) struct Refusals {
    /// `None`: `max_refused_keys = 0`, every refusal is the store's.
    cache: Option<Cache<Cached, Refusal, UnitWeighter, foldhash::fast::RandomState>>,
    /// Refusals answered so far.
    answered: AtomicU64,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.cache.as_ref().map_or(0, Cache::len);
        f.debug_struct("Refusals").field("cached", &cached).finish()
    }
}

impl Refusals {
    /// Remembers at most `max_keys` refused keys (0: none).
    pub(crate) fn new(max_keys: usize) -> Self {
        let cache = (max_keys > 0).then(|| {
            let weight = u64::try_from(max_keys).unwrap_or(u64::MAX);
            Cache::with(max_keys, weight, UnitWeighter, Default::default(), Default::default())
        });
        Self {
            cache,
            answered: AtomicU64::new(0),
        }
    }

    /// The refusal of `cost` tokens of `key` under the rule of generation `rule` at `now_ns`, when the store
    /// refused at least that cost for the key and its `retry_after` has not passed (`source = local`).
    #[inline]
    pub(crate) fn answer(&self, rule: u64, key: &str, cost: u64, now_ns: u64) -> Option<Decision> {
        let cache = self.cache.as_ref()?;
        let looked = Looked { rule, key };
        let refusal = cache.get(&looked)?;
        if now_ns >= refusal.until.ends_ns() {
            cache.remove_if(&looked, |r| r.until.ends_ns() <= now_ns);
            return None;
        }
        if cost < refusal.cost {
            return None;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(Decision {
            allowed: false,
            remaining: refusal.remaining,
            retry_after: refusal.until.retry_after(now_ns),
            reset_after: refusal
                .reset_at_ns
                .map_or(Duration::MAX, |at| duration(at.saturating_sub(now_ns))),
            source: Source::Local,
            shadowed: false,
        })
    }

    /// Remembers the store's `refused` decision of `cost` tokens of `key`, for a call sent at `sent_ns`.
    pub(crate) fn remember(&self, rule: u64, key: &str, cost: u64, refused: &Decision, sent_ns: u64) {
        let Some(cache) = &self.cache else { return };
        if refused.allowed || refused.retry_after.is_zero() {
            return;
        }
        let after = |wait: Duration| sent_ns.saturating_add(nanos(wait));
        let until = if refused.retry_after == Duration::MAX {
            Until::Never {
                recheck_ns: after(Timings::NEVER_REMEMBERED),
            }
        } else {
            Until::Retry {
                at_ns: after(refused.retry_after),
            }
        };
        let refusal = Refusal {
            cost,
            until,
            remaining: refused.remaining,
            reset_at_ns: (refused.reset_after != Duration::MAX).then(|| after(refused.reset_after)),
        };
        let cached = Cached {
            rule,
            key: key.to_owned(),
        };
        cache.insert(cached, refusal);
    }

    /// Forgets the refusal of `key` (the key was reset).
    pub(crate) fn forget(&self, rule: u64, key: &str) {
        if let Some(cache) = &self.cache {
            cache.remove(&Looked { rule, key });
        }
    }

    /// Refusals answered so far.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Refused keys remembered now.
    pub(crate) fn len(&self) -> usize {
        self.cache.as_ref().map_or(0, Cache::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn refused(retry_ms: u64) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            retry_after: Duration::from_millis(retry_ms),
            reset_after: Duration::from_millis(2 * retry_ms),
            source: Source::Redis,
            shadowed: false,
        }
    }

    #[test]
    fn a_refusal_answers_until_its_retry_after_from_when_the_call_was_sent() {
        let refusals = Refusals::new(16);
        refusals.remember(1, "user:7", 1, &refused(500), 100 * MS);
        let answer = refusals
            .answer(1, "user:7", 1, 200 * MS)
            .map(|d| (d.allowed, d.retry_after, d.source));
        assert_eq!(answer, Some((false, Duration::from_millis(400), Source::Local)));
        assert_eq!(
            refusals.answer(1, "user:7", 1, 600 * MS),
            None,
            "retry_after passed: the store decides"
        );
        assert_eq!(refusals.len(), 0, "a passed refusal is dropped when read");
    }

    #[test]
    fn a_smaller_cost_another_key_or_another_rule_goes_to_the_store() {
        let refusals = Refusals::new(16);
        refusals.remember(1, "k", 5, &refused(500), 0);
        assert!(
            refusals.answer(1, "k", 4, MS).is_none(),
            "4 tokens may come before 5 do"
        );
        assert!(
            refusals.answer(1, "k", 6, MS).is_some(),
            "6 tokens come no sooner than 5"
        );
        assert!(refusals.answer(1, "other", 5, MS).is_none());
        assert!(
            refusals.answer(2, "k", 5, MS).is_none(),
            "a reloaded rule has a new generation"
        );
    }

    #[test]
    fn allowances_and_zero_waits_are_not_remembered_and_never_is_asked_again() {
        let refusals = Refusals::new(16);
        let mut allowed = refused(500);
        allowed.allowed = true;
        refusals.remember(1, "a", 1, &allowed, 0);
        refusals.remember(1, "b", 1, &refused(0), 0);
        assert_eq!(refusals.len(), 0);
        let mut never = refused(0);
        never.retry_after = Duration::MAX;
        never.reset_after = Duration::MAX;
        refusals.remember(1, "stock", 1, &never, 0);
        let answer = refusals
            .answer(1, "stock", 1, 0)
            .map(|d| (d.retry_after, d.reset_after));
        assert_eq!(
            answer,
            Some((Duration::MAX, Duration::MAX)),
            "never, as the store said and as a hot key answers"
        );
        assert!(refusals
            .answer(1, "stock", 1, nanos(Timings::NEVER_REMEMBERED))
            .is_none());
    }

    #[test]
    fn a_reset_forgets_and_the_size_is_bounded() {
        let refusals = Refusals::new(100);
        refusals.remember(1, "k", 1, &refused(500), 0);
        refusals.forget(1, "k");
        assert!(refusals.answer(1, "k", 1, MS).is_none());
        for i in 0..1000 {
            refusals.remember(1, &format!("k{i}"), 1, &refused(500), 0);
        }
        assert!(refusals.len() <= 100, "remembered {}", refusals.len());
        assert!(
            refusals.answer(1, "k999", 1, MS).is_some(),
            "the newest key is remembered"
        );
        let off = Refusals::new(0);
        off.remember(1, "k", 1, &refused(500), 0);
        assert!(
            off.answer(1, "k", 1, MS).is_none(),
            "max_refused_keys = 0 remembers nothing"
        );
    }
}
