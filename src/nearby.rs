//! This thread's caches in front of the limiter's shared maps: the rules it last decided by name, and hot keys'
//! local buckets. Each answers most lookups from the thread's own memory, and each entry is used only while what
//! it points to is in force.
//!
//! **Rules by name** ([`rule`], [`keep_rule`]). [`Limiter::check`](crate::Limiter::check) finds its rule by name:
//! an `ArcSwap::load` of the map's snapshot and a hashed lookup, 45-55 ns a decision on this project's machine,
//! more than the rest of a hot key's decision (docs/BENCHMARKS.md). Most threads decide a handful of rules, so a
//! few entries per thread answer most lookups. A reload that replaces or removes a rule retires it
//! (`Compiled::is_retired`) after storing the new map, as a [`RuleHandle`](crate::RuleHandle) sees it. A limiter
//! is known by a number unique for the life of the process ([`next_limiter`]), never by its address, which a
//! limiter built after another was dropped may reuse.
//!
//! **Hot keys' buckets** ([`bucket`], [`keep_bucket`]). Looking a key up in the `DashMap` takes its shard's read
//! lock: an atomic add and sub on a cache line that every thread deciding keys of that shard writes, so two
//! threads on one hot key would bounce it on every decision even though their tokens sit in per-core shards. A
//! small direct-mapped table of (rule, key) → bucket is checked against the rule's generation, the bucket's key
//! and whether its slot is `Slot::Retired` (an evicted, cooled or reloaded bucket, or one whose limiter was
//! dropped, is retired for good, so a stale entry is never used). A rule is known by its generation, unique for
//! the life of the process, never by its address: a rule compiled after another was dropped may land at the same
//! address, and its limiter would then be answered from the dead one's bucket (invariant 20).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::compiled::Compiled;
use crate::lease::bucket::LocalBucket;

/// Rules per thread.
const ENTRIES: usize = 4;

/// The next limiter's number: 0 is never handed out.
static NEXT_LIMITER: AtomicU64 = AtomicU64::new(1);

/// A number for a new limiter, unique for the life of the process.
pub(crate) fn next_limiter() -> u64 {
    NEXT_LIMITER.fetch_add(1, Ordering::Relaxed)
}

/// A rule of a limiter, by its name.
struct Entry {
    limiter: u64,
    compiled: Arc<Compiled>,
}

/// The entries, and the one the next miss replaces.
struct Entries {
    entries: [Option<Entry>; ENTRIES],
    next: usize,
}

thread_local! {
    static ENTRIES_OF_THREAD: RefCell<Entries> =
        const { RefCell::new(Entries { entries: [const { None }; ENTRIES], next: 0 }) };
}

/// Runs `f` on the rule named `name` of limiter number `limiter`, if this thread cached it and it is in force;
/// `None` otherwise. The rule is borrowed, not cloned: a clone would write its shared count.
#[inline(always)]
pub(crate) fn rule<R>(limiter: u64, name: &str, f: impl FnOnce(&Arc<Compiled>) -> R) -> Option<R> {
    ENTRIES_OF_THREAD.with(|entries| {
        let entries = entries.borrow();
        let entry = entries
            .entries
            .iter()
            .flatten()
            .find(|e| e.limiter == limiter && same(&e.compiled.rule.name, name) && !e.compiled.is_retired())?;
        Some(f(&entry.compiled))
    })
}

/// Caches `compiled` as the rule of its name of limiter number `limiter`, in place of the oldest entry.
pub(crate) fn keep_rule(limiter: u64, compiled: &Arc<Compiled>) {
    ENTRIES_OF_THREAD.with(|entries| {
        let mut entries = entries.borrow_mut();
        let at = entries.next;
        entries.next = (at + 1) % ENTRIES;
        if let Some(entry) = entries.entries.get_mut(at) {
            *entry = Some(Entry {
                limiter,
                compiled: compiled.clone(),
            });
        }
    });
}

/// Buckets per thread (a power of two).
const SLOTS: usize = 64;

/// One cached bucket and the rule it belongs to (its compiled rule's generation).
struct Slot {
    rule: u64,
    bucket: Arc<LocalBucket>,
}

/// The slot of a key: its length and last two bytes, mixed with the rule (a full hash of the key would cost more
/// than the rest of a decision; keys such as `sku:1042` differ at the end, and a collision only costs a lookup
/// in the map).
#[inline(always)]
fn slot_of(rule: u64, key: &str) -> usize {
    let bytes = key.as_bytes();
    let at = |back: usize| {
        bytes
            .len()
            .checked_sub(back)
            .and_then(|i| bytes.get(i))
            .map_or(0, |&b| u64::from(b))
    };
    let mixed = (bytes.len() as u64 ^ (at(1) << 8) ^ (at(2) << 16) ^ (rule << 24)).wrapping_mul(0x9E37_79B9);
    (mixed >> 16) as usize & (SLOTS - 1)
}

/// Whether two keys are equal: short keys by two overlapping word loads each, without a call to `memcmp`
/// (which costs as much as the rest of the lookup).
#[inline(always)]
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| {
        s.get(at..at + 8)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let half = |s: &[u8], at: usize| {
        s.get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .map(u32::from_le_bytes)
    };
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        1..=3 => a.first() == b.first() && a.get(n / 2) == b.get(n / 2) && a.last() == b.last(),
        _ => a == b,
    }
}

thread_local! {
    static SLOTS_OF_THREAD: RefCell<[Option<Slot>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// Runs `f` on the bucket of `key` of the rule of generation `rule`, if this thread cached it and it is live;
/// `None` otherwise. The bucket is borrowed, not cloned: a clone would write its shared count.
#[inline(always)]
pub(crate) fn bucket<R>(rule: u64, key: &str, f: impl FnOnce(&Arc<LocalBucket>) -> R) -> Option<R> {
    SLOTS_OF_THREAD.with(|slots| {
        let slots = slots.borrow();
        let slot = slots.get(slot_of(rule, key))?.as_ref()?;
        let live = slot.rule == rule && same(slot.bucket.key(), key) && !slot.bucket.is_retired();
        live.then(|| f(&slot.bucket))
    })
}

/// Caches `bucket` as the bucket of its key under the rule of generation `rule`.
pub(crate) fn keep_bucket(rule: u64, bucket: &Arc<LocalBucket>) {
    SLOTS_OF_THREAD.with(|slots| {
        let mut slots = slots.borrow_mut();
        if let Some(slot) = slots.get_mut(slot_of(rule, bucket.key())) {
            *slot = Some(Slot {
                rule,
                bucket: bucket.clone(),
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn keys_compare_whole() {
        for (a, b) in [
            ("sku:1", "sku:2"),
            ("sku:1042", "sku:1043"),
            ("a", "b"),
            ("user:12345678", "user:12345679"),
        ] {
            assert!(same(a, a) && !same(a, b), "{a} {b}");
        }
        assert!(!same("sku:1", "sku:10"));
        assert!(same("hot", "hot") && !same("hot", "hit") && !same("ab", "aa") && same("x", "x"));
        let long = "tenant:42:user:1234567890:action";
        let copy: String = long.chars().collect();
        assert!(same(long, &copy) && !same(long, "tenant:42:user:1234567891:action"));
    }
}
