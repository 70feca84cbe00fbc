//! Unit tests of `bucket.rs`: the local bucket's hot path, leases, turns and expiry.
use super::*;
use crate::algorithm::Pace;
use crate::lease::book::smoothed;
use crate::lease::schedule::tests::shipped;

fn lease() -> Lease {
    Lease {
        min_batch: 10,
        max_batch: 100,
        ttl: Duration::from_millis(200),
        hot_after: None,
        reserve: None,
    }
}

/// A key's bucket of 1000 tokens refilled at 1 per second, leased 10 to 100 at a time for 200 ms.
fn local_bucket() -> LocalBucket {
    let bucket = TokenBucket {
        capacity: 1000,
        rate: 1,
        per_ms: 1000,
    };
    LocalBucket::new("k", "k".into(), bucket, lease(), 0)
}

const MS: u64 = 1_000_000;

fn grant(tokens: u64) -> Reply {
    Reply {
        granted: tokens,
        remaining: 990,
        retry_after_ms: 0,
        reset_after_ms: 0,
        stamp: 0,
        held: 0,
    }
}

/// Two leases sent together expire together: what is left belongs to the newer (spending is first in, first
/// out), and each lease's tokens go back under its own stamp, which caps them (`token_return.lua`).
#[test]
fn tokens_that_expire_together_go_back_under_their_own_leases_stamps() {
    let b = local_bucket();
    let plan = b.plan(1000, 1, 0);
    let stamped = |tokens, stamp| Reply { stamp, ..grant(tokens) };
    assert!(b.add(&stamped(11, 7_000), 0, plan, 0));
    assert!(b.add(&stamped(20, 7_001), 0, plan, 0));
    assert!(matches!(b.try_take(10, MS), Take::Taken { .. }));
    let unspent = b.expire(200 * MS, 4);
    let lent = |stamp, tokens| crate::algorithm::room::Lent { stamp, tokens };
    assert_eq!(unspent.lent, [lent(7_001, 20), lent(7_000, 1)]);
    assert_eq!(unspent.tokens(), 21);
}

/// A process alone lifts the turn it was handed for any token that expires unspent: no other process takes
/// what goes back; in a fleet, half a batch does.
#[test]
fn a_process_alone_lifts_its_turn_when_a_token_expires() {
    for (processes, lifted) in [(4, false), (1, true)] {
        let b = local_bucket();
        let plan = b.plan(1000, 1, 0);
        let turn = Reply {
            retry_after_ms: 5_000,
            ..grant(plan.batch)
        };
        assert!(b.add(&turn, 0, plan, 0));
        assert!(matches!(b.try_take(plan.batch - 1, MS), Take::Taken { .. }));
        assert_eq!(b.expire(200 * MS, processes).tokens(), 1);
        let refused = matches!(b.try_take(1, 201 * MS), Take::Exhausted { .. });
        assert_eq!(!refused, lifted, "{processes} processes");
    }
}

#[test]
fn expiry_gives_back_only_what_older_batches_left() {
    let b = local_bucket();
    let plan = b.plan(1000, 1, 0);
    assert!(b.add(&grant(10), 0, plan, 0));
    assert!(matches!(b.try_take(4, 10 * MS), Take::Taken { .. }));
    assert_eq!(b.available(), 6);
    assert!(b.add(&grant(10), 100 * MS, plan, 100 * MS));
    assert!(
        !b.add(&grant(10), 0, plan, 250 * MS),
        "a reply after its deadline is not added"
    );
    // 16 left: 6 of the first batch, 10 of the second. At 200 ms the first batch's 6 expire.
    assert_eq!(b.expire(200 * MS - 1, 4).tokens(), 0);
    assert_eq!(b.expire(200 * MS, 4).tokens(), 6);
    assert_eq!(b.available(), 10);
    assert!(matches!(b.try_take(3, 201 * MS), Take::Taken { .. }));
    assert_eq!(b.available(), 7);
    assert_eq!(b.expire(300 * MS, 4).tokens(), 7);
    assert_eq!(b.available(), 0);
    assert!(!b.has_expired(10_000 * MS), "nothing left to expire");
    assert!(b.add(&grant(5), 10_000 * MS, plan, 10_000 * MS));
    assert_eq!(b.drain().tokens(), 5);
    assert_eq!(b.claim_lease(), None, "a retired bucket starts no lease");
    assert!(
        !b.add(&grant(10), 10_001 * MS, plan, 10_001 * MS),
        "nor takes a grant: it goes back"
    );
}

/// The shipped rule's bucket ([`shipped`]), made hot on a
/// saturated shared bucket, that has refused 10 decisions in its first 100 ms: 100 a second, as each process of
/// a fleet of 1000 sharing 10^5.
fn slow_saturated() -> LocalBucket {
    let (bucket, lease) = shipped();
    let b = LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, 0).measuring();
    b.refused(Duration::from_millis(100), Duration::ZERO, Duration::ZERO, 0);
    for i in 0..10 {
        assert!(matches!(b.try_take(1, i * 10 * MS), Take::Exhausted { .. }));
    }
    b
}

/// [`slow_saturated`] with a paced grant of 35 tokens (`grant`'s other fields as given) added to it: the lease
/// sent at 100 ms, its reply 1 ms later. The first chunk (10) is
/// spendable; 10 are released at 200 ms, 10 at 300 ms and 5 at 400 ms. Returns it with the lease's plan.
fn paced_35(reply: Reply) -> (LocalBucket, LeasePlan) {
    let b = slow_saturated();
    let sent = 100 * MS;
    let plan = b.plan(2, 1, sent);
    let granted = Reply { granted: 35, ..reply };
    assert!(b.add(&granted, sent, plan, sent + MS));
    (b, plan)
}

#[test]
fn a_slow_process_on_a_saturated_bucket_leases_a_paced_turn() {
    let b = slow_saturated();
    let plan = b.plan(2, 1, 100 * MS);
    // It spends 18 tokens in the TTL: a turn of 100, released 10 every 100 ms (what it spends in half a TTL),
    // over 1 s (the refill of half the burst), never more: a longer span would let the bucket's pending line
    // hold its refill back.
    assert_eq!(
        plan,
        LeasePlan {
            min: 1,
            max: 100,
            batch: 100,
            per_turn: 100,
            pace: Pace {
                chunk: 10,
                chunk_ms: 100
            },
        }
    );
    // A fast process (2500 a second, refused meanwhile, so each decision counts) spends a whole batch in the
    // TTL: not paced.
    let fast = local_bucket();
    let _ = fast.plan(1000, 1, 0);
    fast.refused(Duration::from_millis(100), Duration::ZERO, Duration::ZERO, 0);
    for i in 0..250 {
        assert!(matches!(fast.try_take(1, i * 400_000), Take::Exhausted { .. }));
    }
    assert_eq!(fast.plan(1000, 1, 100 * MS).pace, Pace::default());
}

/// A bucket made hot on a saturated shared bucket that counted no decision in the half TTL its first lease
/// waited (a process deciding 6 times a second in a fleet of 256): the demand is at most one per that time, not
/// unknown, so it leases paced (a token a chunk) rather than a batch of 20 to 40 to give back. Before, such
/// first leases of 256 processes took the whole burst and gave 72 % of it back (`simulate --processes 256
/// --demand 1500`: 88.5 % of the bound sold in 10 s; 94.9 % since).
#[test]
fn no_decision_in_half_a_ttl_reads_as_a_slow_demand_not_an_unknown_one() {
    let (bucket, lease) = shipped();
    let b = LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, 0).measuring();
    let plan = b.plan(7, 1, 100 * MS);
    assert_eq!(
        plan.pace,
        Pace {
            chunk: 1,
            chunk_ms: 100
        },
        "{plan:?}"
    );
    assert_eq!((plan.min, plan.max), (1, 10), "ten chunks over a second: {plan:?}");
    // Within half a TTL, no decision counted is still no measure: the first lease of a new key is not paced.
    let early = LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, 0).measuring();
    assert_eq!(early.plan(7, 1, 10 * MS).pace, Pace::default());
}

/// A warm key the hot-key sketch counted 3 times a second (under one decision per 200 ms TTL) leases what it
/// spends in the TTL, one token, not `min_batch`: most of a batch of 10 would go back, a give-back per lease.
/// On a saturated bucket too, where it asks for turns spaced for that token: a turn of `min_batch` left nine
/// tokens to expire in one process while the others were refused (healthy seed 506, a bucket of 13 shared by
/// 64 processes deciding 2 times a second each: 81.6 % sold, 97.4 % so). A key with no demand seen leases
/// `min_batch`.
#[test]
fn a_slow_key_leases_what_it_spends_and_a_key_of_unknown_demand_min_batch() {
    let (bucket, lease) = shipped();
    let made = || LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, 0);
    let slow = made().seeded(Some(3)).plan(500, 1, MS);
    assert_eq!((slow.min, slow.max, slow.pace), (1, 1, Pace::default()), "{slow:?}");
    let saturated = made().seeded(Some(3)).measuring().plan(500, 1, MS);
    assert_eq!(
        (saturated.min, saturated.max, saturated.per_turn),
        (1, 1, 1),
        "{saturated:?}"
    );
    let unknown = made().plan(500, 1, MS);
    assert_eq!((unknown.min, unknown.max), (1, 10), "{unknown:?}");
}

/// The sketch seeds every new hot key at the count that made it hot, a few decisions a second whatever its
/// speed. A measure of a few timed decisions replaces the seed: a flash sale's key, deciding 10^4 times a
/// second, leased 1, 6, 33, 35, 67 ... tokens a few hundred µs apart while the seed was mixed in as the demand of
/// a TTL. A warm key's measure of one decision is still mixed with it, and the first lease, which no decision
/// measured, keeps it.
#[test]
fn a_seeded_demand_is_replaced_by_a_measure_of_a_few_decisions() {
    let (bucket, lease) = shipped();
    let made = || LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, 0).seeded(Some(7));
    let spend = |b: &LocalBucket, decisions: u64, from_ns: u64, every_ns: u64| {
        for i in 0..decisions {
            let _ = b.try_take(1, from_ns + i * every_ns);
        }
    };
    let fast = made();
    let first = fast.plan(500, 1, 5 * MS);
    assert_eq!(fast.lock().demand, Demand::Seeded(7), "no decision measured yet");
    assert_eq!(
        (first.max, first.pace.chunk),
        (7, 1),
        "seven chunks of one over a second: {first:?}"
    );
    assert!(fast.add(&grant(7), 5 * MS, first, 5 * MS));
    // Released early to the callers who find the bucket empty ([`LocalBucket::release_early`]).
    for i in 0..7 {
        fast.release_early(1, 5 * MS + i * MS / 50, 4);
        spend(&fast, 1, 5 * MS + i * MS / 50, 0);
    }
    let second = fast.plan(500, 1, 5 * MS + 300_000);
    assert!(fast.lock().demand.per_s() > 20_000, "{:?}", fast.lock().demand);
    assert_eq!(second.batch, 500, "`max_batch`: {second:?}");
    let warm = made();
    let first = warm.plan(500, 1, 5 * MS);
    assert!(warm.add(&grant(1), 5 * MS, first, 5 * MS));
    spend(&warm, 2, 60 * MS, MS);
    let _ = warm.plan(500, 1, 61 * MS);
    let demand = warm.lock().demand.per_s();
    assert!(
        (7..=20).contains(&demand),
        "two decisions in 56 ms mixed with the seed: {demand}"
    );
}

#[test]
fn a_paced_grant_is_spent_a_chunk_at_a_time_and_its_rest_goes_back_at_drain() {
    let (b, plan) = paced_35(grant(35));
    let sent = 100 * MS;
    // The first chunk at once; the next at 200 ms, 300 ms and (the last 5) 400 ms.
    assert_eq!((b.available(), b.scheduled()), (10, 25));
    for t in 0..10 {
        assert!(matches!(b.try_take(1, sent + (2 + t) * MS), Take::Taken { .. }));
    }
    // Spent: no lease before the last chunk, but the next one may come early (`release_early`).
    assert_eq!(b.try_take(1, 150 * MS), Take::Empty);
    assert!(!b.below_watermark(0, 150 * MS), "no lease while chunks are to come");
    assert!(!b.has_expired(200 * MS - 1));
    assert!(b.has_expired(200 * MS));
    assert_eq!(b.expire(200 * MS, 4).tokens(), 0);
    assert_eq!((b.available(), b.scheduled()), (10, 15));
    // Unspent, the chunk released at 200 ms goes back at 400 ms, when the last chunk comes.
    assert_eq!(b.expire(400 * MS, 4).tokens(), 10);
    assert_eq!((b.available(), b.scheduled()), (15, 0));
    assert!(b.add(&grant(30), 400 * MS, plan, 401 * MS));
    // Drained: what is left and what was still to come go back.
    assert_eq!(b.drain().tokens(), 15 + 30);
}

#[test]
fn a_demand_that_outruns_the_pace_takes_the_chunks_early_then_waits_for_its_turn() {
    let handed_a_turn = Reply {
        retry_after_ms: 500,
        ..grant(35)
    };
    let (b, _) = paced_35(handed_a_turn);
    let sent = 100 * MS;
    assert_eq!(b.try_take(10, sent + 2 * MS), Take::Taken { remaining: 0 });
    // A burst at 120 ms: the chunks due at 200, 300 and 400 ms come now, each spent within the TTL from now.
    let now = 120 * MS;
    for (chunk, left) in [(10, 15), (10, 5), (5, 0)] {
        assert_eq!(b.try_take(1, now), Take::Empty);
        assert!(b.release_early(chunk, now, 1));
        assert_eq!(b.scheduled(), left);
        assert_eq!(b.try_take(chunk, now), Take::Taken { remaining: 0 });
    }
    // All out: refused until the turn the bucket handed (101 ms + 500 ms), not the last chunk's time.
    assert!(!b.release_early(1, now, 1));
    assert_eq!(b.expire(now + 200 * MS, 4).tokens(), 0);
    assert_eq!(b.try_take(1, now + 200 * MS), Take::Exhausted { retry_ns: 281 * MS });
    assert_eq!(b.try_take(1, 601 * MS), Take::Empty);
}

/// [`paced_35`] in a fleet, its first chunk spent at 102 ms and every other chunk taken early at `at_ns`.
fn paced_35_spent_early_at(at_ns: u64) -> LocalBucket {
    let (b, _) = paced_35(grant(35));
    assert_eq!(b.try_take(10, 102 * MS), Take::Taken { remaining: 0 });
    while b.release_early(5, at_ns, 4) {
        assert!(matches!(b.try_take(5, at_ns), Take::Taken { .. }));
    }
    b
}

#[test]
fn in_a_fleet_a_key_whose_chunks_came_early_leases_after_the_last_ones_time() {
    // Leased at 100 ms, chunks until 400 ms; the last taken at 260 ms, past half their span: the demand
    // outran the pace by less than twice.
    let b = paced_35_spent_early_at(260 * MS);
    // The shared bucket counts the chunks pending until 400 ms: a second paced lease would merge with them.
    assert_eq!(b.try_take(1, 260 * MS), Take::Exhausted { retry_ns: 140 * MS });
}

/// Seed 270 of the healthy search: 24 processes paced for 138 decisions a second (a token every 333 ms) took
/// their chunks early when the demand rose to 367, then refused for up to 600 ms each, waiting for their last
/// chunk's time: 122 sold in a second of a demand under the rate. A demand that at least doubled leases now.
#[test]
fn in_a_fleet_a_key_whose_demand_doubled_leases_as_soon_as_its_chunks_are_out() {
    let b = paced_35_spent_early_at(240 * MS);
    assert_eq!(b.try_take(1, 240 * MS), Take::Empty, "leases now");
}

/// Seed 270 of the healthy search again, at a demand under the rate: 24 processes paced for 367 a second took
/// their chunks early when the demand rose a little, then waited for their last chunk's time beside a bucket
/// with 1000 tokens in stock, selling 311 a second of 367. On a bucket with room to spare a key whose chunks are
/// out leases again from its turn, unless the fleet's paced leases together could hold a quarter of the bucket
/// pending (the shared bucket's merged pending line would stop its refill: with half, 256 processes at 1.5 times
/// the rate sold 90.7 % of a 10 s bound, 96.1 % waiting).
#[test]
fn on_a_bucket_with_room_a_key_whose_chunks_came_early_leases_unless_the_fleet_is_large() {
    for (processes, leases_now) in [(4, true), (16, false)] {
        let stocked = Reply {
            remaining: 1_500,
            ..grant(35)
        };
        let (b, plan) = paced_35(stocked);
        assert_eq!(
            plan.batch, 100,
            "4 x 100 x 4 fits in 2000 tokens, 16 x 100 x 4 does not"
        );
        assert_eq!(b.try_take(10, 102 * MS), Take::Taken { remaining: 0 });
        while b.release_early(5, 260 * MS, processes) {
            assert!(matches!(b.try_take(5, 260 * MS), Take::Taken { .. }));
        }
        let leases = b.try_take(1, 260 * MS) == Take::Empty;
        assert_eq!(leases, leases_now, "{processes} processes");
    }
}

#[test]
fn a_refusal_is_cached_until_retry_after() {
    let b = local_bucket();
    b.refused(Duration::from_nanos(50), Duration::ZERO, Duration::ZERO, 100);
    assert_eq!(b.try_take(1, 120), Take::Exhausted { retry_ns: 30 });
    assert_eq!(b.try_take(1, 150), Take::Empty);
}

#[test]
fn a_first_lease_on_a_spent_bucket_waits_half_a_ttl_in_a_large_fleet_only() {
    let (bucket, lease) = shipped();
    let made = 1_000_000_000;
    let fresh = || LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, made);
    // The lease's slot is claimed first; a bucket made hot on a spent bucket is claimed from `Measuring`.
    let first_wait = |b: &LocalBucket, processes, now| {
        let from = b.claim_lease().expect("no lease in flight");
        let wait = b.first_lease_wait(from, processes, now);
        b.finish_lease();
        wait
    };
    // Not made hot by the fleet's spending: leases at once, however large the fleet.
    assert_eq!(first_wait(&fresh(), 1_000, made), None);
    // Four processes: their first turns (6 ms apart) go round within the 100 ms wait.
    assert_eq!(first_wait(&fresh().measuring(), 4, made), None);
    // A thousand: the first lease waits until half a TTL after the bucket was made, refusing meanwhile.
    let spent = fresh().measuring();
    let until = made + 100_000_000;
    assert_eq!(first_wait(&spent, 1_000, made + 1), Some(until));
    assert!(matches!(spent.try_take(1, made + 2), Take::Exhausted { .. }));
    // Once only: the lease after the wait goes.
    assert_eq!(first_wait(&spent, 1_000, until), None);
}

#[test]
fn the_demand_is_averaged_over_a_ttl_weighted_by_time() {
    let ttl = 200 * MS;
    // No estimate yet, or a whole TTL or more since the last lease: the rate since then.
    assert_eq!(smoothed(0, (10, 100 * MS), ttl), 100);
    assert_eq!(smoothed(500, (30, 300 * MS), ttl), 100);
    // Half a TTL since the last lease: half the old rate, half the new.
    assert_eq!(smoothed(500, (10, 100 * MS), ttl), 300);
    // Two leases a millisecond apart with no decision between them: the key is not read as idle.
    assert_eq!(smoothed(500, (0, MS), ttl), 497);
}

/// A key that decided 100 times a second for a second, refused while the shared bucket was saturated, then
/// leased at 1 s and was handed a turn 5 s ahead (a long queue of the fleet's turns).
fn waiting_for_a_far_turn() -> LocalBucket {
    let b = local_bucket();
    b.refused(Duration::from_secs(1), Duration::ZERO, Duration::ZERO, 0);
    for i in 0..100 {
        assert!(matches!(b.try_take(1, i * 10 * MS), Take::Exhausted { .. }));
    }
    let plan = b.plan(1000, 1, 1000 * MS);
    assert_eq!(b.lock().demand.per_s(), 100);
    let turn = Reply {
        granted: 10,
        remaining: 0,
        retry_after_ms: 5_000,
        reset_after_ms: 1_000,
        stamp: 0,
        held: 0,
    };
    assert!(b.add(&turn, 1000 * MS, plan, 1000 * MS));
    b
}

#[test]
fn a_demand_that_falls_lifts_the_wait_for_a_far_turn_and_the_lease_probes() {
    let b = waiting_for_a_far_turn();
    // The demand keeps its pace for a second, sampled by the sweeper every quarter TTL: the turn stands.
    for i in 0..100 {
        let now = 1000 * MS + i * 10 * MS;
        let _ = b.try_take(1, now);
        if i % 5 == 0 {
            assert!(!b.sample(now), "a steady demand keeps its turn (at {now} ns)");
        }
    }
    assert!(matches!(b.try_take(1, 2000 * MS), Take::Exhausted { .. }));
    // Then it stops: within the eight samples' span (400 ms) the wait is lifted, and the next caller leases.
    let lifted = (0..8).map(|i| 2000 * MS + i * 50 * MS).find(|&now| b.sample(now));
    let lifted = lifted.expect("the wait lifted within 400 ms of the fall");
    assert_eq!(b.try_take(1, lifted), Take::Empty);
    assert!(b.probing(lifted), "the lease after a lift asks for no turn");
    // The lease measures the demand as it is now, not since the last lease (100 in 1.3 s or more).
    let _ = b.plan(1000, 1, lifted);
    assert!(b.lock().demand.per_s() < 50, "{}", b.lock().demand.per_s());
    // Refused, the probe backs off a TTL, then two, then waits for the turn it kept (at 6 s).
    let empty = Reply {
        granted: 0,
        remaining: 0,
        retry_after_ms: 1,
        reset_after_ms: 1_000,
        stamp: 0,
        held: 0,
    };
    let mut now = lifted;
    for backoff in [200, 400, 800, 1_600] {
        b.refused_by_store(&empty, now);
        assert_eq!(b.try_take(1, now), Take::Exhausted { retry_ns: backoff * MS });
        now += backoff * MS;
        assert_eq!(b.try_take(1, now), Take::Empty);
        assert!(b.probing(now));
    }
    b.refused_by_store(&empty, now);
    assert_eq!(
        b.try_take(1, now),
        Take::Exhausted {
            retry_ns: 6000 * MS - now
        }
    );
    assert!(!b.probing(now), "back in the queue at its kept turn");
}

#[test]
fn a_granted_probe_ends_the_probing() {
    let b = waiting_for_a_far_turn();
    let lifted = (0..40).map(|i| 1000 * MS + i * 50 * MS).find(|&now| b.sample(now));
    let lifted = lifted.expect("no decision after the lease: lifted");
    assert!(b.probing(lifted));
    let plan = b.plan(1000, 1, lifted);
    assert!(b.add(&grant(10), lifted, plan, lifted));
    assert!(!b.probing(lifted), "granted: the next lease asks for a turn again");
    assert!(matches!(b.try_take(1, lifted), Take::Taken { .. }));
}

/// A lease is sized for what the demand will spend in its TTL, and the demand of the last TTL is the best guess
/// of that: a key that decided 1 000 times a second for 100 ms, then not at all for 200 ms, leases no more than
/// that spends (a healthy seed of 4 processes sold 23 of 48 demanded in the second after its demand fell to a
/// thirtieth: three processes leased 107 to 125 tokens each that expired unspent while the others were refused).
#[test]
fn a_lease_after_the_demand_fell_is_sized_for_the_demand_of_the_last_ttl() {
    let b = local_bucket();
    b.refused(Duration::from_secs(1), Duration::ZERO, Duration::ZERO, 0);
    for ms in 0..100 {
        assert!(matches!(b.try_take(1, ms * MS), Take::Exhausted { .. }));
    }
    // The sweeper samples every quarter TTL (50 ms).
    for at in (50..=300).step_by(50) {
        b.sample(at * MS);
    }
    let plan = b.plan(1000, 1, 300 * MS);
    // Measured since the bucket was made, 100 decisions in 300 ms: 333 a second, a lease of 59 (two batches,
    // within 0.9 TTL of it). The last TTL's demand, none, leaves the caller's token.
    assert!(b.lock().demand.per_s() > 300, "{}", b.lock().demand.per_s());
    assert_eq!(
        (plan.min, plan.max),
        (1, 1),
        "sized for the last TTL's demand, not 333 a second: {plan:?}"
    );
}

/// A fast key whose demand stops is told within half a TTL, by the newest two samples: over the whole span it
/// would take a TTL more, while the tokens leased for the old demand expire in this process and the others are
/// refused (healthy seed 682, 3 processes from 1 347 to 108 decisions a second each: 175 sold of 323 demanded
/// in the second after, 88.2 % over the minute; 93.6 % so). A slow key needs the whole span, so that chance
/// does not read as a fall.
#[test]
fn a_fast_key_that_stops_is_told_within_half_a_ttl() {
    let mut recent = Recent::new(0);
    // Samples every 50 ms (a quarter of a 200 ms TTL), 2 000 decisions a second until 350 ms, then none.
    for t in (50..=450).step_by(50) {
        recent.sample((t * MS, t.min(350) * 2));
    }
    assert_eq!(
        recent.fallen(2_000, (460 * MS, 700)),
        Some(0),
        "60 ms with none of 120 expected"
    );
    assert_eq!(recent.fallen(2_000, (410 * MS, 700)), None, "10 ms are too few to tell");
    // The same stop at 20 decisions a second: the newest samples expect too few (1.2) to tell.
    let mut slow = Recent::new(0);
    for t in (50..=450).step_by(50) {
        slow.sample((t * MS, t.min(350) / 50));
    }
    assert_eq!(slow.fallen(20, (460 * MS, 7)), None);
}
