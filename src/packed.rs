//! A state that outlives a call, kept in one atomic word: an enum of named states with a tag (0 to 3) and a
//! payload (a deadline in ns, or a count), so that a reader never sees half of one change and a step is one
//! compare-and-swap. The store's breaker and a hot key's slot, wait and back-off are kept so.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest payload [`tagged`] keeps: as a deadline, 2^62 ns, 146 years after the clock's origin; a later
/// one is kept as this ("never", in practice).
pub(crate) const PAYLOAD_MAX: u64 = (1 << 62) - 1;

/// A state's tag (0 to 3) and its payload in one word; a payload above [`PAYLOAD_MAX`] is kept as it.
pub(crate) fn tagged(tag: u8, payload: u64) -> u64 {
    u64::from(tag & 3) << 62 | payload.min(PAYLOAD_MAX)
}

/// The tag and payload [`tagged`] put in `word`.
pub(crate) fn untagged(word: u64) -> (u8, u64) {
    ((word >> 62) as u8, word & PAYLOAD_MAX)
}

/// A state kept in one word, with [`tagged`].
pub(crate) trait Packed: Copy {
    /// The state as a word.
    fn pack(self) -> u64;
    /// The state [`Packed::pack`] made `word` of.
    fn unpack(word: u64) -> Self;
}

/// A [`Packed`] state in an atomic word: loaded with acquire, changed with release ordering.
#[derive(Debug)]
pub(crate) struct Atomic<S> {
    word: AtomicU64,
    state: PhantomData<S>,
}

impl<S: Packed> Atomic<S> {
    pub(crate) fn new(state: S) -> Self {
        Self {
            word: AtomicU64::new(state.pack()),
            state: PhantomData,
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> S {
        S::unpack(self.word.load(Ordering::Acquire))
    }

    pub(crate) fn store(&self, state: S) {
        self.word.store(state.pack(), Ordering::Release);
    }

    /// Steps the state by `step` (the next state, and what to return), with compare-and-swap: `step` runs
    /// again on the state another thread left meanwhile. A step that leaves the state as it was writes nothing.
    pub(crate) fn update<R>(&self, step: impl Fn(S) -> (S, R)) -> R {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let (next, out) = step(S::unpack(word));
            let next = next.pack();
            if next == word {
                return out;
            }
            match (self.word).compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return out,
                Err(now) => word = now,
            }
        }
    }
}

/// "Never" ([`crate::clock::NEVER_NS`]) is kept as the latest deadline one word holds: never reached.
const _: () = assert!(PAYLOAD_MAX < crate::clock::NEVER_NS);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Count(u64);

    impl Packed for Count {
        fn pack(self) -> u64 {
            tagged(1, self.0)
        }
        fn unpack(word: u64) -> Self {
            Self(untagged(word).1)
        }
    }

    #[test]
    fn a_word_keeps_its_tag_and_payload_and_steps_by_compare_and_swap() {
        assert_eq!(untagged(tagged(3, 12_345)), (3, 12_345));
        assert_eq!(
            untagged(tagged(2, u64::MAX)),
            (2, PAYLOAD_MAX),
            "a later deadline kept as the latest"
        );
        let count = Atomic::new(Count(1));
        assert_eq!(count.update(|c| (Count(c.0 + 1), c.0)), 1);
        assert_eq!(count.load(), Count(2));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..100_000).for_each(|_| count.update(|c| (Count(c.0 + 1), ()))));
            }
        });
        assert_eq!(count.load(), Count(400_002), "no step lost between threads");
    }
}
