//! Every timing the limiter keeps, in one place: those fixed by the design as constants of [`Timings`], those
//! that follow from the store's call timeout as its fields ([`Timings::from_call`]), and those that follow from a
//! rule's lease as its functions. The tests below check how they relate (a beat comes more often than the
//! silence that marks a member gone, a caller stops waiting for a lease before the lease itself gives up, ...),
//! and that the scripts' literals agree with them.

use std::time::Duration;

/// The store's timings, from its call timeout, and every fixed timing as a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timings {
    /// A direct check's call (the configured `[redis] timeout`, enforced by the store).
    pub call: Duration,
    /// How long a caller waits for its key's lease in flight: two call timeouts and 5 ms.
    pub lease_wait: Duration,
    /// The timeout of a lease call itself: ten call timeouts, at least 100 ms. Longer than callers wait, since a
    /// lease that timed out after Redis granted it would strand its tokens.
    pub lease: Duration,
    /// The timeout of a beat of the fleet's roster, and the Redis connection's own response timeout (the
    /// longest a call may take): two lease timeouts. A beat is harmless when late, so it may wait for a slow
    /// link (a round trip of up to a second at a 50 ms call timeout) where a lease would time out.
    pub beat: Duration,
    /// After a failed store call, a key is decided by `fail_mode` this long before the store is asked again:
    /// 100 ms, or the call timeout when longer.
    pub backoff: Duration,
    /// How long the circuit breaker stays open before it lets a probe through: 500 ms, or the call timeout.
    pub breaker_open: Duration,
    /// How long one attempt to connect to Redis (or to find the master) may take: ten call timeouts, at least 1 s.
    pub connect: Duration,
    /// How long the mark of a give-back is kept (`token_return.lua`'s `mark_ms`): longer than the call and its
    /// retries may take, twice the connection's response timeout, at least [`Timings::GIVE_BACK_MARK`].
    pub mark: Duration,
}

impl Timings {
    /// How often the hot path's clock (`clock::Recent`) is read by its ticker thread.
    pub(crate) const TICK: Duration = Duration::from_millis(1);
    /// How far ahead of its ticker's reading the hot path's clock answers: two ticks, so a deadline is never
    /// read early.
    pub(crate) const AHEAD: Duration = Duration::from_millis(2);
    /// The longest the kernel's coarse clock is watched for its ticks at start (the coarsest Linux kernel ticks
    /// every 10 ms).
    pub(crate) const CALIBRATION: Duration = Duration::from_millis(50);

    /// Transient store failures in a row that open the circuit breaker.
    pub(crate) const BREAKER_FAILURES: u32 = 5;
    /// The shortest wait between two Redis connections made again (a `READONLY` storm remakes it at most this
    /// often).
    pub(crate) const REMAKE_INTERVAL: Duration = Duration::from_millis(100);

    /// How often a member beats for each of its rules.
    pub(crate) const BEAT: Duration = Duration::from_secs(1);
    /// How often it beats while its beats fail: it learns soon that the store is back.
    pub(crate) const BEAT_SOON: Duration = Duration::from_millis(100);
    /// A member heard within this is live: three beats.
    pub(crate) const LIVE: Duration = Duration::from_secs(3);
    /// A member unheard this long is forgotten (it exited).
    pub(crate) const KEEP: Duration = Duration::from_secs(60);

    /// How long a caller refused because its lease is slow is told to wait (`source = local`).
    pub(crate) const SLOW_LEASE_RETRY: Duration = Duration::from_millis(1);
    /// How long a "never" from the shared bucket (a stock with rate 0) is cached by a hot key before it asks
    /// again: tokens given back to the stock can still sell.
    pub(crate) const NEVER_RECHECK: Duration = Duration::from_secs(1);
    /// How long a refusal the store said is for ever is remembered for a key that is not hot, for the same reason.
    pub(crate) const NEVER_REMEMBERED: Duration = Duration::from_secs(1);
    /// The lease TTLs over which a hot key's demand is measured before it is found cooled.
    pub(crate) const COOLING_TTLS: u32 = 5;
    /// How long after a reserve's length its hold lasts in the store: a key keeps its reserve between leases at
    /// least this long (a dead process's hold is counted this much longer than it could sell it).
    pub(crate) const HOLD_MARGIN: Duration = Duration::from_secs(2);
    /// The shortest a give-back's mark is kept, and how long `token_return.lua` keeps it when the caller does not
    /// say (`mark_ms` 0).
    pub(crate) const GIVE_BACK_MARK: Duration = Duration::from_secs(10);
    /// How often the in-process store drops the keys whose state equals a missing key again.
    pub(crate) const PURGE_EVERY: Duration = Duration::from_secs(1);

    /// The timings that follow from a store call timeout.
    pub(crate) fn from_call(call: Duration) -> Self {
        let beat = call.saturating_mul(20).max(Duration::from_millis(200));
        Self {
            call,
            lease_wait: call.saturating_mul(2).saturating_add(Duration::from_millis(5)),
            lease: call.saturating_mul(10).max(Duration::from_millis(100)),
            beat,
            backoff: Duration::from_millis(100).max(call),
            breaker_open: Duration::from_millis(500).max(call),
            connect: call.saturating_mul(10).max(Duration::from_secs(1)),
            mark: beat.saturating_mul(2).max(Self::GIVE_BACK_MARK),
        }
    }

    /// How often the sweeper runs for leases of `shortest_ttl` (none: no leased rule): a quarter of it, 5 ms to
    /// 1 s.
    pub(crate) fn sweep_every(shortest_ttl: Option<Duration>) -> Duration {
        shortest_ttl
            .map_or(Duration::from_secs(1), |ttl| ttl / 4)
            .clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    /// How long a hot key's demand is measured before it is found cooled, for leases of `ttl`.
    pub(crate) fn cooling(ttl: Duration) -> Duration {
        ttl.saturating_mul(Self::COOLING_TTLS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Call timeouts from 1 ms to 10 s, the shipped 5 ms and the default 50 ms among them.
    const CALLS_MS: [u64; 8] = [1, 5, 20, 50, 100, 500, 2_000, 10_000];

    #[test]
    fn a_caller_gives_up_on_a_lease_before_the_lease_and_the_beat_wait_longest() {
        for ms in CALLS_MS {
            let t = Timings::from_call(Duration::from_millis(ms));
            assert!(
                t.call < t.lease_wait,
                "{t:?}: a caller waits for a lease longer than a call takes"
            );
            assert!(
                t.lease_wait < t.lease,
                "{t:?}: a lease outlives its waiters: its grant is not stranded"
            );
            assert!(
                t.lease < t.beat,
                "{t:?}: the connection's own timeout never cuts a lease"
            );
            assert!(
                t.call <= t.backoff && t.call <= t.breaker_open,
                "{t:?}: a back-off outlasts a call"
            );
        }
    }

    #[test]
    fn a_member_beats_more_often_than_the_silence_that_marks_it_gone() {
        assert!(Timings::BEAT_SOON < Timings::BEAT);
        // Two beats may be lost or late before a member stops being live.
        assert!(Timings::BEAT.saturating_mul(2) < Timings::LIVE);
        assert!(Timings::LIVE < Timings::KEEP);
        // A beat at the default 50 ms call timeout answers before the member would be counted gone.
        assert!(Timings::from_call(Duration::from_millis(50)).beat < Timings::LIVE);
    }

    #[test]
    fn a_give_back_is_remembered_longer_than_any_retry_of_it() {
        // Up to the longest call timeout the config accepts (60 s).
        for ms in CALLS_MS.into_iter().chain([60_000]) {
            let t = Timings::from_call(Duration::from_millis(ms));
            assert!(t.beat < t.mark, "{t:?}: a call outlives its give-back's mark");
            assert!(t.mark >= Timings::GIVE_BACK_MARK);
        }
        // token_return.lua keeps the mark this long when the caller does not say (other languages).
        let script = include_str!("../lua/src/token_return.lua");
        let default = format!("mark_ms = {}", Timings::GIVE_BACK_MARK.as_millis());
        assert_eq!(
            script.matches(&default).count(),
            1,
            "token_return.lua's default mark is not {default}"
        );
    }

    #[test]
    fn the_hot_paths_clock_reads_ahead_by_whole_ticks_and_the_sweep_by_quarter_ttls() {
        assert_eq!(Timings::AHEAD, Timings::TICK * 2);
        assert!(Timings::TICK < Timings::CALIBRATION);
        assert_eq!(
            Timings::sweep_every(Some(Duration::from_millis(200))),
            Duration::from_millis(50)
        );
        assert_eq!(
            Timings::sweep_every(Some(Duration::from_millis(4))),
            Duration::from_millis(5)
        );
        assert_eq!(Timings::sweep_every(None), Duration::from_secs(1));
        // A hold outlives its reserve by a margin longer than a lease's whole life at the default timeout.
        assert!(Timings::HOLD_MARGIN > Timings::from_call(Duration::from_millis(50)).lease);
        assert_eq!(Timings::cooling(Duration::from_millis(200)), Duration::from_secs(1));
    }
}
