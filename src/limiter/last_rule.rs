//! A per-thread cache of the rules this thread last decided by name, in front of the limiter's rule map.
//!
//! [`Limiter::check`](crate::Limiter::check) finds its rule by name: an `ArcSwap::load` of the map's snapshot and
//! a hashed lookup, 45-55 ns a decision on this project's machine, more than the rest of a hot key's decision
//! (docs/BENCHMARKS.md). Most threads decide a handful of rules, so a few entries per thread answer most lookups
//! from the thread's own memory, as `lease/nearby.rs` does for hot keys' buckets. An entry is used only while its
//! rule is in force: a reload that replaces or removes a rule retires it (`Compiled::is_retired`) after storing
//! the new map, as a [`RuleHandle`](crate::RuleHandle) sees it. A limiter is known by a number unique for the
//! life of the process, never by its address, which a limiter built after another was dropped may reuse.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::compiled::Compiled;
use crate::lease::nearby::same;

/// Entries per thread.
const ENTRIES: usize = 4;

/// The next limiter's number: 0 is never handed out.
static NEXT_LIMITER: AtomicU64 = AtomicU64::new(1);

/// A number for a new limiter, unique for the life of the process.
pub(super) fn next_limiter() -> u64 {
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
pub(super) fn with<R>(limiter: u64, name: &str, f: impl FnOnce(&Arc<Compiled>) -> R) -> Option<R> {
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
pub(super) fn put(limiter: u64, compiled: &Arc<Compiled>) {
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
