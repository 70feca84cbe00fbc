//! The window rules' local shares on a fake clock (times in ms of the limiter's clock): what each process may
//! admit alone in the window it last saw and after, and what it owes until the store applies its charge.

use super::*;
use crate::clock::FakeClock;
use crate::rule::Calendar;

/// 100 per 2 s, calendar windows from the Unix epoch (UTC).
const FIXED: ChargedWindow = ChargedWindow::FixedWindow {
    window_ms: 2_000,
    limit: 100,
    calendar: Some(Calendar::Offset { align_ms: 0 }),
};
const LOG: ChargedWindow = ChargedWindow::SlidingLog {
    window_ms: 2_000,
    limit: 100,
};

fn reply(granted: u64, remaining: u64, reset_after_ms: i64) -> Reply {
    Reply {
        granted,
        remaining,
        retry_after_ms: if granted > 0 { 0 } else { reset_after_ms },
        reset_after_ms,
        stamp: 0,
    }
}

/// Tokens of `cost` one at a time admitted at `now` until refused.
fn fill(shares: &WindowShares, window: &ChargedWindow, now: u64) -> u64 {
    let mut n = 0;
    while shares.take("k", window, 1, 4, now).expect("room").granted > 0 {
        n += 1;
    }
    n
}

/// Shares on a fake clock whose calendar windows start at local ms multiples of 2 000 (the wall shift is a
/// multiple of the window): the limiter's `0` is a window's start.
fn shares() -> WindowShares {
    let mut s = WindowShares::new(16, &FakeClock::default());
    s.wall_shift_ms = 1_700_000_000_000;
    s
}

#[test]
fn a_fixed_window_share_is_a_part_of_what_was_left_then_a_part_of_the_limit() {
    let s = shares();
    // Seen at 500 ms with 40 left in the window [0, 2000): a quarter of it, 10, alone.
    s.report("k", &FIXED, &reply(1, 40, 1_500), 500);
    assert_eq!(fill(&s, &FIXED, 600), 10);
    assert_eq!(fill(&s, &FIXED, 1_999), 0);
    // The next windows: a quarter of the limit each.
    assert_eq!(fill(&s, &FIXED, 2_000), 25);
    assert_eq!(fill(&s, &FIXED, 3_999), 0);
    let refused = s.take("k", &FIXED, 1, 4, 3_000).expect("room");
    assert_eq!((refused.granted, refused.retry_after_ms), (0, 1_000));
    assert_eq!(fill(&s, &FIXED, 4_000), 25);
    // A cost above the share can never pass alone.
    assert_eq!(s.take("k", &FIXED, 26, 4, 6_000).expect("room").retry_after_ms, NEVER);
}

#[test]
fn a_key_never_seen_gets_nothing_in_its_current_window() {
    let s = shares();
    assert_eq!(fill(&s, &FIXED, 1_000), 0);
    assert_eq!(fill(&s, &FIXED, 2_000), 25);
    // A log never seen: nothing until a whole window has passed since the first decision alone.
    assert_eq!(fill(&s, &LOG, 10_000), 0);
    assert_eq!(fill(&s, &LOG, 11_999), 0);
    assert_eq!(fill(&s, &LOG, 12_000), 25);
}

#[test]
fn a_log_share_slides_and_starts_from_what_was_left() {
    let s = shares();
    // Seen with 20 left; every grant counted then leaves by 1 500 ms later.
    s.report("k", &LOG, &reply(1, 20, 1_500), 1_000);
    assert_eq!(fill(&s, &LOG, 1_100), 5);
    assert_eq!(fill(&s, &LOG, 2_499), 0);
    // From 2 500: a quarter of the limit in any 2 s, the 5 admitted at 1 100 included until 3 100.
    assert_eq!(fill(&s, &LOG, 2_500), 20);
    assert_eq!(fill(&s, &LOG, 3_099), 0);
    assert_eq!(fill(&s, &LOG, 3_100), 5);
    assert_eq!(fill(&s, &LOG, 4_499), 0);
    assert_eq!(fill(&s, &LOG, 4_500), 20);
}

#[test]
fn a_refusal_or_ban_seen_is_honoured_alone() {
    let s = shares();
    // Banned for 10 s, with the window itself empty again.
    let banned = Reply {
        granted: 0,
        remaining: 100,
        retry_after_ms: 10_000,
        reset_after_ms: 10_000,
        stamp: 0,
    };
    s.report("k", &LOG, &banned, 0);
    assert_eq!(fill(&s, &LOG, 9_999), 0);
    assert_eq!(fill(&s, &LOG, 10_000), 25);
}

#[test]
fn what_is_admitted_is_owed_under_one_id_until_applied() {
    let s = shares();
    s.report("k", &FIXED, &reply(1, 100, 2_000), 0);
    assert!(!s.any_owed());
    assert_eq!(fill(&s, &FIXED, 10), 25);
    assert!(s.any_owed());
    let charge = s.take_owed("k", || "c1".into()).expect("free").expect("owed");
    assert_eq!(
        charge,
        Charge {
            id: "c1".into(),
            admitted: vec![(10, 25)]
        }
    );
    // While it is in flight, other callers of the key know it.
    assert_eq!(s.take_owed("k", || "c2".into()), Err(Busy));
    // Admitted meanwhile: counted against the share, owed in the next charge.
    s.settled("k", &FIXED, None, 20);
    assert_eq!(fill(&s, &FIXED, 30), 0, "the charge in flight still counts");
    // Failed: sent again as it was, same id, same admissions.
    let again = s.take_owed("k", || "c3".into()).expect("free").expect("owed");
    assert_eq!(again, charge);
    s.settled("k", &FIXED, Some(&reply(25, 75, 1_960)), 40);
    assert!(!s.any_owed());
    assert_eq!(s.take_owed("k", || "c4".into()), Ok(None));
    // The store's answer after the charge is the window last seen: 75 left, a quarter alone.
    assert_eq!(fill(&s, &FIXED, 50), 18);
    assert_eq!(
        s.take_owed("k", || "c5".into()).expect("free").map(|c| c.id),
        Some("c5".into())
    );
}

#[test]
fn the_sweep_keeps_what_is_owed_and_a_full_map_admits_no_new_key() {
    let s = WindowShares::new(2, &FakeClock::default());
    s.report("a", &LOG, &reply(1, 100, 2_000), 0);
    s.report("k", &LOG, &reply(1, 100, 2_000), 0);
    assert_eq!(fill(&s, &LOG, 0), 25);
    assert!(s.take("c", &LOG, 1, 4, 0).is_none());
    s.sweep(60_000, 60_000);
    assert_eq!(s.map.len(), 1, "`a` was idle and owed nothing");
    assert_eq!(s.owing_keys(), [("k".to_owned(), LOG)]);
}
