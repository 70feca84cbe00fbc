//! Taking turns on a saturated shared bucket.
//!
//! When demand outruns the refill, every process wants the next tokens. If each asked as soon as a batch could
//! have accumulated, N processes would make N calls per batch and N − 1 of them would be refused. Instead each
//! process estimates its share of the refill from what the shared bucket tells it (what was left after its
//! last call, what is there now, and the refill in between: the rest went to the others) and asks again when
//! *its share* of the refill has made up part of a batch (its turn). The first turn comes at a random point of
//! the period and the others with ±5 % jitter, so that processes that saturated the bucket together spread out
//! rather than take their turns in a bunch. With N equal processes each asks every N turns' worth of refill, so
//! the store sees about one call per turn whatever N is; a process alone asks every turn. The bound does not
//! depend on this: it only decides when to ask.

use crate::algorithm::TokenBucket;

/// The smallest share of the refill a process assumes is its own (1/16: more processes than that take longer
/// turns than they need, which costs calls, not the bound).
const MIN_SHARE: f64 = 1.0 / 16.0;

/// How much of the past a new reply keeps: what one interval between replies shows is noisy (whether another
/// process asked in it or not), so the share is measured over the last several.
const DECAY: f64 = 0.85;

/// What one process has seen of a shared bucket, and its estimated share of the refill.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turns {
    /// When the last reply arrived (ns), 0 before the first.
    seen_ns: u64,
    /// Tokens the shared bucket had left after it.
    seen_remaining: u64,
    /// The refill between this process's replies that the others did not take, and the whole refill, both
    /// decayed by `DECAY` per reply: their ratio is this process's share of the refill.
    mine: f64,
    refill: f64,
    /// A xorshift state for the jitter.
    jitter: u64,
    /// No turn was waited for yet.
    first: bool,
}

impl Turns {
    /// Nothing seen yet: the share starts at 1/`processes` (the configured `expected_processes`), weighted as
    /// one capacity's worth of refill, and follows what the replies show. `seed` varies the jitter between keys
    /// and processes.
    pub(crate) fn new(seed: u64, processes: u64, bucket: &TokenBucket) -> Self {
        let prior = bucket.capacity as f64;
        Self {
            seen_ns: 0,
            seen_remaining: 0,
            mine: prior / processes.max(1) as f64,
            refill: prior,
            jitter: seed | 1,
            first: true,
        }
    }

    /// This process's estimated share of the refill.
    pub(crate) fn share(&self) -> f64 {
        if self.refill > 0.0 {
            (self.mine / self.refill).clamp(MIN_SHARE, 1.0)
        } else {
            1.0
        }
    }

    /// Records a reply arriving at `now_ns`: the bucket had `before` tokens for this call (granted plus
    /// remaining) and `remaining` after it. What the refill since the last reply should have left there, less
    /// what was there, is what the other processes took.
    pub(crate) fn observe(&mut self, bucket: &TokenBucket, before: u64, remaining: u64, now_ns: u64) {
        if self.seen_ns > 0 && bucket.rate > 0 {
            let elapsed_ns = now_ns.saturating_sub(self.seen_ns);
            // What the bucket could hold of the refill: beyond its capacity, the refill tells nothing.
            let room = bucket.capacity.saturating_sub(self.seen_remaining) as f64;
            let refill = refill_tokens(bucket, elapsed_ns).min(room);
            if refill >= 1.0 {
                let expected = self.seen_remaining as f64 + refill;
                let others = (expected - before as f64).clamp(0.0, refill);
                self.mine = self.mine * DECAY + (refill - others);
                self.refill = self.refill * DECAY + refill;
            }
        }
        self.seen_ns = now_ns;
        self.seen_remaining = remaining;
    }

    /// Nanoseconds until this process's next turn on a bucket of `batch`-token leases that has `remaining`
    /// left: when its share of the refill has made up three fifths of a batch, jittered by ±5 %, and never so
    /// late that the bucket could fill up meanwhile (its refill would be lost). 0 for a stock (rate 0).
    ///
    /// Three fifths: the processes' calls come about 0.6 batch of refill apart, each taking what accumulated,
    /// so what a sale leaves in the shared bucket when it ends is about a third of a batch; waiting for whole
    /// batches would make fewer calls and leave twice as much.
    ///
    /// Tokens already there (`remaining > 0`) are not left waiting for a slow refill: the turn then comes within
    /// `scraps_ns` over the share (about one call per `scraps_ns`, the lease TTL, for the whole fleet), so the last
    /// tokens of a bucket refilled at a few an hour sell within the TTL for a process alone, not hours later.
    pub(crate) fn wait_ns(&mut self, bucket: &TokenBucket, (batch, remaining): (u64, u64), scraps_ns: u64) -> u64 {
        if bucket.rate == 0 {
            return 0;
        }
        let share = self.share();
        let ns_per_token = bucket.per_ms as f64 * 1e6 / bucket.rate as f64;
        let missing = (batch as f64 * 0.6 - remaining as f64).max(0.0);
        // Alone the bucket fills in `until_full`; with others taking their turns, in that over the share.
        let until_full = bucket.capacity.saturating_sub(remaining) as f64 * ns_per_token / share;
        // The first turn comes at a random point of the period: processes that saturate the bucket together would
        // otherwise keep taking their turns together, leaving long gaps between the bunches (and, when a sale ends
        // in one, its refill in Redis).
        let phase = if std::mem::take(&mut self.first) {
            0.3 + 0.7 * self.uniform()
        } else {
            self.jitter()
        };
        let mut wait = (missing * ns_per_token / share * phase).min(until_full * 0.9);
        if remaining > 0 {
            wait = wait.min(scraps_ns as f64 / share * phase);
        }
        wait.max(0.0) as u64
    }

    /// A factor from 0.95 to 1.05.
    fn jitter(&mut self) -> f64 {
        0.95 + 0.1 * self.uniform()
    }

    /// A number from 0 to 1 (xorshift64: enough to spread processes apart).
    fn uniform(&mut self) -> f64 {
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Tokens the bucket refills in `ns`.
fn refill_tokens(bucket: &TokenBucket, ns: u64) -> f64 {
    ns as f64 * bucket.rate as f64 / (bucket.per_ms as f64 * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// 1000 tokens per second, capacity 2000.
    fn bucket() -> TokenBucket {
        TokenBucket {
            capacity: 2000,
            rate: 1000,
            per_ms: 1000,
        }
    }

    #[test]
    fn a_process_alone_asks_every_batch() {
        let mut t = Turns::new(7, 4, &bucket());
        t.observe(&bucket(), 500, 0, 1000 * MS);
        // Each 500 ms brought 500 tokens, all there: nobody else took any. The first guess of 1/4 fades.
        for i in 1..=20 {
            t.observe(&bucket(), 500, 0, (1000 + 500 * i) * MS);
        }
        assert!(t.share() > 0.95, "{}", t.share());
        // Its turn: three fifths of a 500-token batch, all its own, in 300 ms; the first at a random point of it.
        let first = t.wait_ns(&bucket(), (500, 0), u64::MAX);
        assert!((90 * MS..=300 * MS).contains(&first), "{first}");
        let wait = t.wait_ns(&bucket(), (500, 0), u64::MAX);
        assert!((285 * MS..=315 * MS).contains(&wait), "{wait}");
    }

    #[test]
    fn four_processes_each_ask_every_fourth_batch() {
        let mut t = Turns::new(7, 1, &bucket());
        t.observe(&bucket(), 500, 0, 1000 * MS);
        // Each time, 2000 ms brought 2000 tokens of which the others took 1500.
        for i in 1..=30 {
            t.observe(&bucket(), 500, 0, (1000 + 2000 * i) * MS);
        }
        assert!((t.share() - 0.25).abs() < 0.01, "{}", t.share());
        // A quarter of the refill makes 300 tokens in 1.2 s (after a first turn anywhere from 0.36 s to 1.2 s).
        let first = t.wait_ns(&bucket(), (500, 0), u64::MAX);
        assert!((350 * MS..=1200 * MS).contains(&first), "{first}");
        let wait = t.wait_ns(&bucket(), (500, 0), u64::MAX);
        assert!((1100 * MS..=1260 * MS).contains(&wait), "{wait}");
        // Never so late that the bucket could fill up: 2000 tokens take 2 s alone, 8 s shared by four.
        let wait = t.wait_ns(&bucket(), (10_000, 0), u64::MAX);
        assert!((7100 * MS..=7300 * MS).contains(&wait), "{wait}");
        // One interval in which nobody else asked moves the share, but not all the way.
        t.observe(&bucket(), 2000, 0, 63_000 * MS);
        assert!((0.25..0.5).contains(&t.share()), "{}", t.share());
        let mut stock = bucket();
        stock.rate = 0;
        assert_eq!(t.wait_ns(&stock, (500, 0), u64::MAX), 0);
    }

    #[test]
    fn tokens_already_there_wait_for_no_slow_refill() {
        // 10 tokens refilled at 1 an hour; a process alone, with 1 token left and batches of 5.
        let slow = TokenBucket {
            capacity: 10,
            rate: 1,
            per_ms: 3_600_000,
        };
        let mut t = Turns::new(7, 1, &slow);
        t.wait_ns(&slow, (5, 1), 30_000 * MS);
        // Three fifths of a batch would take two hours: the token there sells within the 30 s TTL instead.
        let wait = t.wait_ns(&slow, (5, 1), 30_000 * MS);
        assert!((28_000 * MS..=31_600 * MS).contains(&wait), "{wait}");
        // With nothing left, the turn waits for the refill.
        assert!(t.wait_ns(&slow, (5, 0), 30_000 * MS) > 3_000_000 * MS);
    }
}
