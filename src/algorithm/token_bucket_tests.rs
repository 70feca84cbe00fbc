//! Tests of the token bucket's arithmetic: takes, leases and turns, give-backs, reloads.

use super::*;

const NINE_PER_MINUTE: TokenBucket = TokenBucket {
    capacity: 9,
    rate: 9,
    per_ms: 60_000,
};

/// Tokens of two leases given back in one call: each capped by the room since its own lease. Under the older
/// stamp alone, the newer lease's 20 would be capped by the room the bucket had before that lease took them (11),
/// which it had only because they were still in it (found by `tests/undersell.rs`).
#[test]
fn a_give_back_caps_each_leases_tokens_by_the_room_since_its_own_stamp() {
    let b = TokenBucket {
        capacity: 45,
        rate: 10,
        per_ms: 1_000,
    };
    let lease = |s, n| b.lease((s, 0), (1, n, 0), (Pace::default(), None), 0);
    let (s, _, a) = lease(None, 11);
    let (s, _, b2) = lease(s, 20);
    assert_eq!((a.granted, b2.granted, b2.remaining), (11, 20, 14));
    let named = [
        Lent {
            stamp: b2.stamp,
            tokens: 20,
        },
        Lent {
            stamp: a.stamp,
            tokens: 1,
        },
    ];
    let (_, back) = b.give_back(s.clone(), Back::Lent(&named), 100);
    assert_eq!((back.granted, back.remaining), (21, 36), "15 after 0.1 s, and all 21");
    let oldest = [Lent {
        stamp: a.stamp,
        tokens: 21,
    }];
    let (_, back) = b.give_back(s, Back::Lent(&oldest), 100);
    assert_eq!(back.granted, 11, "capped by the room before the newer lease");
}

/// Found by `simulate --healthy` (seed 70, with slow demands leased unpaced): the store refills for the tokens
/// a lease holds, so giving them back unspent after their TTL refills the bucket twice. Three leases and two
/// give-backs then hold 1.24 times the bound of a 0.2 s window: the TTL's tokens in hand and a full level.
#[test]
fn tokens_given_back_after_their_ttl_never_let_the_fleet_hold_more_than_the_bound() {
    let b = TokenBucket {
        capacity: 100,
        rate: 50,
        per_ms: 1_000,
    };
    let ttl_ms = 1_000;
    let lease = |s, n, now| b.lease((s, 0), (1, n, 0), (Pace::default(), None), now);
    let (s, _, a) = lease(None, 100, 0); // A: the whole burst, spends none
    let (s, _, first) = lease(s, 100, 999); // B: the refill, 49
    let (s, _) = b.give_back(
        s,
        Back::Lent(&[Lent {
            stamp: a.stamp,
            tokens: a.granted,
        }]),
        1_000,
    ); // A's tokens, expired, go back
    let (s, _, c) = lease(s, 100, 1_000); // C: 100, in hand until 2000
    let (s, _, d) = lease(s, 100, 1_998); // D: the refill, 49
    let (s, _) = b.give_back(
        s,
        Back::Lent(&[Lent {
            stamp: first.stamp,
            tokens: first.granted,
        }]),
        1_999,
    ); // B's, expired, go back
    let (_, _, e) = lease(s, 100, 1_999); // E: what the level holds

    // At 1999 C, D and E hold tokens leased within the TTL, all spendable in the next 0.2 s.
    let held = c.granted + d.granted + e.granted;
    let bound = b.capacity + b.rate * (200 + ttl_ms) / 1_000;
    assert!(held <= bound, "{held} tokens spendable in 0.2 s, bound {bound}");
}

#[test]
fn tokens_due_at_a_millisecond_are_there_at_it() {
    let b = NINE_PER_MINUTE;
    let (s, r) = b.take(None, 9, 9, 0);
    assert_eq!((r.granted, r.remaining), (9, 0));
    let (_, r) = b.take(s.clone(), 3, 3, 19_999);
    assert_eq!((r.granted, r.retry_after_ms), (0, 1));
    let (_, r) = b.take(s, 3, 3, 20_000);
    assert_eq!((r.granted, r.remaining), (3, 0));
}

#[test]
fn rescale_rounds_down_exactly_and_drops_under_a_token_only_beyond_2_pow_53() {
    assert_eq!(rescale(5_000, 1_000, 60_000), 300_000);
    assert_eq!(rescale(1_999, 1_000, 500), 999);
    assert_eq!(
        rescale(-4_001, 1_000, 500),
        -2_001,
        "a debt rounds to more debt, never less"
    );
    assert_eq!(rescale(7, 3, 7), 16);
    // Periods whose reduced product reaches 2^53: the part under a token is dropped, as the scripts do.
    let (a, b): (u64, u64) = (94_906_267, 94_906_269);
    assert!(a * b >= MAX_EXACT);
    assert_eq!(rescale(3 * ms(a) + 5, a, b), 3 * ms(b));
}

#[test]
fn a_reload_refills_the_time_before_it_at_the_old_parameters() {
    let old = TokenBucket {
        capacity: 10,
        rate: 1,
        per_ms: 1_000,
    };
    let new = TokenBucket { rate: 10, ..old };
    let (s, _) = old.take(None, 10, 10, 0);
    let (s, r) = new.take(s, 1, 1, 900);
    assert_eq!(
        (r.granted, s.as_ref().map(|s| (s.level, s.ts_ms, s.bucket))),
        (0, Some((900, 900, new)))
    );
    let (s, r) = new.take(s, 1, 1, 1_000);
    assert_eq!((r.granted, s.as_ref().map(|s| s.level)), (1, Some(900)));
    let (same, r) = new.take(s.clone(), 1, 1, 1_000);
    assert_eq!(
        (r.granted, same),
        (0, s),
        "a refusal under the same parameters stores nothing new"
    );
}

#[test]
fn short_leases_are_handed_turns_a_fraction_of_a_batch_apart() {
    // 100 tokens refilled at 1000 a second; batches of 50: turns 30 ms apart.
    let b = TokenBucket {
        capacity: 100,
        rate: 1_000,
        per_ms: 1_000,
    };
    assert_eq!(b.turn_spacing(50), 30);
    // All it asked for, and as much left: no turn.
    let (s, turn, r) = b.lease((None, 0), (1, 50, 50), (Pace::default(), None), 0);
    assert_eq!((r.granted, r.remaining, r.retry_after_ms, turn), (50, 50, 0, 0));
    // The next drains the bucket: the first turn, 30 ms from now.
    let (s, turn, r) = b.lease((s, turn), (1, 60, 50), (Pace::default(), None), 0);
    assert_eq!((r.granted, r.remaining, r.retry_after_ms, turn), (50, 0, 30, 30));
    // Two more callers at 10 ms: a grant of what refilled and a refusal, each given the next turn.
    let (s, turn, r) = b.lease((s, turn), (1, 60, 50), (Pace::default(), None), 10);
    assert_eq!((r.granted, r.retry_after_ms, turn), (10, 50, 60));
    let (s, turn, r) = b.lease((s, turn), (5, 60, 50), (Pace::default(), None), 10);
    assert_eq!((r.granted, r.retry_after_ms, turn), (0, 80, 90));
    // The bucket refilled to its top: a batch taken and one left, no turn, and the line of turns restarts.
    let (s, turn, r) = b.lease((s, turn), (1, 50, 50), (Pace::default(), None), 500);
    assert_eq!((r.granted, r.retry_after_ms, turn), (50, 0, 0));
    // The next starts from now.
    let (_, turn, r) = b.lease((s, turn), (1, 60, 50), (Pace::default(), None), 500);
    assert_eq!((r.granted, r.retry_after_ms, turn), (50, 30, 530));
    // A stock or a cost above the capacity is never: no turn.
    let stock = TokenBucket { rate: 0, ..b };
    let (_, turn, r) = stock.lease(
        (Some(stock.refill(None, 0)), 0),
        (101, 101, 50),
        (Pace::default(), None),
        0,
    );
    assert_eq!((r.retry_after_ms, turn), (NEVER, 0));
}

#[test]
fn a_bucket_near_its_top_or_a_granted_probe_restarts_the_line_of_turns() {
    // 100 tokens refilled at 1000 a second; batches of 50: turns 30 ms apart.
    let b = TokenBucket {
        capacity: 100,
        rate: 1_000,
        per_ms: 1_000,
    };
    // Drained at 0, then twenty refusals at 1 ms push the line 630 ms ahead.
    let (mut s, mut turn, _) = b.lease((None, 0), (1, 100, 50), (Pace::default(), None), 0);
    for _ in 0..20 {
        (s, turn, _) = b.lease((s, turn), (60, 60, 50), (Pace::default(), None), 1);
    }
    assert_eq!(turn, 630);
    // At 40 ms the bucket holds 40 (room 60, over a batch): a lease that drains it queues at the back.
    let (_, far, r) = b.lease((s.clone(), turn), (1, 60, 50), (Pace::default(), None), 40);
    assert_eq!((r.granted, r.retry_after_ms, far), (40, 620, 660));
    // At 95 ms it holds 95 (room 5): its refill is being lost, nobody took the turns handed, and the line
    // starts again from now.
    let (_, near, r) = b.lease((s.clone(), turn), (1, 100, 50), (Pace::default(), None), 95);
    assert_eq!((r.granted, r.retry_after_ms, near), (95, 30, 125));
    // A probe (batch 0) refused at 2 ms keeps the line; granted at 40 ms, it restarts it.
    let (_, kept, r) = b.lease((s.clone(), turn), (5, 5, 0), (Pace::default(), None), 2);
    assert_eq!((r.granted, kept), (0, 630));
    let (_, dropped, r) = b.lease((s, turn), (1, 10, 0), (Pace::default(), None), 40);
    assert_eq!((r.granted, r.retry_after_ms, dropped), (10, 0, 0));
}

#[test]
fn a_missing_bucket_starts_full_and_a_full_one_is_not_stored() {
    let b = NINE_PER_MINUTE;
    let (s, r) = b.take(None, 1, 1, 5);
    assert_eq!((r.granted, r.remaining, r.reset_after_ms), (1, 8, 6_667));
    let (s, _) = b.give_back(s, Back::Unnamed(5), 5);
    assert_eq!(s, None, "a return that fills the bucket deletes it");
}
