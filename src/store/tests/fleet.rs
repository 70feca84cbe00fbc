//! `fleet.lua` replayed with exact `now_ms` sequences on both stores: the live count, and the hold after an
//! outage (invariants 17 and 19).

use super::harness::{r, step, EveryStore, Step};
use crate::algorithm::fleet::Beat;
use crate::store::call::roster_key;
use crate::store::call::Op;
use crate::store::Call;

/// A beat of `member` at `now` (live 3 s, silent 1.5 s, kept 60 s, holds of at most 2 s).
fn beat(key: &str, member: &str, (back, settled): (bool, bool), now: u64) -> Call {
    let beat = Beat {
        member: member.to_owned(),
        live_ms: 3_000,
        silent_ms: 1_500,
        keep_ms: 60_000,
        hold_ms: 2_000,
        back,
        settled,
        refill_ms: None,
        cut_ms: 0,
        leave: false,
    };
    Call::beat(key, beat).at(now)
}

/// `beat` on a rule whose buckets refill in 2 s, back after `cut_ms` cut off.
fn presuming(key: &str, member: &str, (back, settled): (bool, bool), cut_ms: u64, now: u64) -> Call {
    let mut call = beat(key, member, (back, settled), now);
    if let Op::Fleet(beat) = &mut call.op {
        beat.refill_ms = Some(2_000);
        beat.cut_ms = cut_ms;
    }
    call
}

/// `member` leaving at `now`.
fn leaving(key: &str, member: &str, now: u64) -> Call {
    let mut call = beat(key, member, QUIET, now);
    if let Op::Fleet(beat) = &mut call.op {
        beat.leave = true;
    }
    call
}

const QUIET: (bool, bool) = (false, true);

fn fleet_table(p: &str) -> Vec<Step> {
    let k = roster_key("tl", &format!("sale-{p}"));
    let t0 = 1_700_000_000_000;
    // Replies: { processes, hold_ms, presumed_epoch, presumed_ms }; a window rule's beats presume nothing.
    let steps = [
        ("a joins", beat(&k, "a", QUIET, t0), r(1, 0, 0, 0)),
        ("b joins", beat(&k, "b", QUIET, t0 + 500), r(2, 0, 0, 0)),
        ("c joins", beat(&k, "c", QUIET, t0 + 1_000), r(3, 0, 0, 0)),
        ("a again: three live", beat(&k, "a", QUIET, t0 + 1_000), r(3, 0, 0, 0)),
        // An outage until t0 + 4 000: b is back first and owes what it sold alone; everyone silent owes a report,
        // and is counted while the hold waits for it (it may still be there, cut off).
        (
            "b back, owing",
            beat(&k, "b", (true, false), t0 + 4_000),
            r(3, 2_000, 0, 0),
        ),
        (
            "a back, owed nothing",
            beat(&k, "a", (true, true), t0 + 4_100),
            r(3, 1_900, 0, 0),
        ),
        ("b has charged", beat(&k, "b", QUIET, t0 + 4_200), r(3, 1_800, 0, 0)),
        (
            "c back: the hold ends",
            beat(&k, "c", (true, true), t0 + 4_300),
            r(3, 0, 0, 0),
        ),
        // Another outage: c never reports (it exited); the hold ends at its bound, presuming nothing here.
        ("a back", beat(&k, "a", (true, true), t0 + 9_000), r(3, 2_000, 0, 0)),
        ("b back", beat(&k, "b", (true, true), t0 + 9_500), r(3, 1_500, 0, 0)),
        ("the bound passes", beat(&k, "a", QUIET, t0 + 11_000), r(2, 0, 0, 0)),
        // b alone cut off while a beat on: only c, silent since it exited, may have sold alone.
        ("a beats", beat(&k, "a", QUIET, t0 + 12_000), r(2, 0, 0, 0)),
        (
            "b back, c silent",
            beat(&k, "b", (true, true), t0 + 12_100),
            r(3, 2_000, 0, 0),
        ),
        // c is forgotten once unheard for keep_ms; then b, cut off again, waits for nobody.
        ("c forgotten", beat(&k, "a", QUIET, t0 + 64_301), r(1, 0, 0, 0)),
        (
            "b back, nobody silent",
            beat(&k, "b", (true, true), t0 + 64_400),
            r(2, 0, 0, 0),
        ),
    ];
    steps
        .into_iter()
        .map(|(what, call, reply)| step(what, call, reply))
        .collect()
}

fn presumed_table(p: &str) -> Vec<Step> {
    let k = roster_key("tl", &format!("presumed-{p}"));
    let t0 = 1_700_000_000_000;
    let mut steps = Vec::new();
    for (i, m) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        steps.push(("joins", beat(&k, m, QUIET, t0), r(i as u64 + 1, 0, 0, 0)));
    }
    let hold: u64 = t0 + 4_000; // the epoch of the hold below: the ms it starts
    steps.extend([
        ("e leaves", leaving(&k, "e", t0 + 1_000), r(4, 0, 0, 0)),
        ("a, b, c, d", beat(&k, "a", QUIET, t0 + 1_000), r(4, 0, 0, 0)),
        ("", beat(&k, "b", QUIET, t0 + 1_000), r(4, 0, 0, 0)),
        ("", beat(&k, "c", QUIET, t0 + 1_000), r(4, 0, 0, 0)),
        ("", beat(&k, "d", QUIET, t0 + 1_000), r(4, 0, 0, 0)),
        // Cut off 3 s: a is back first, owing. Each of a, b, c, d (counted 4) may have sold a quarter of a full
        // bucket and of 3 s + the 2 s wait of refill: a term of (2 000 + 5 000) / 4 ms each. e left: not waited for.
        (
            "a back, owing",
            presuming(&k, "a", (true, false), 3_000, hold),
            r(4, 2_000, 0, 0),
        ),
        ("a has charged", beat(&k, "a", QUIET, t0 + 4_100), r(4, 1_900, 0, 0)),
        ("b reports", beat(&k, "b", (true, true), t0 + 4_200), r(4, 1_800, 0, 0)),
        ("c reports", beat(&k, "c", (true, true), t0 + 4_200), r(4, 1_800, 0, 0)),
        // d exited: at the hold's end its term is presumed, named by the hold's epoch.
        ("the hold waits on", beat(&k, "a", QUIET, t0 + 5_999), r(4, 1, 0, 0)),
        (
            "d is presumed",
            beat(&k, "a", QUIET, t0 + 6_000),
            r(3, 0, 1_700_000_000_000 + 4_000, 1_750),
        ),
        // Kept two refills and its own ms after the hold's end, for the processes that hear of it late.
        (
            "still kept",
            beat(&k, "a", QUIET, t0 + 11_749),
            r(1, 0, 1_700_000_000_000 + 4_000, 1_750),
        ),
        ("forgotten", beat(&k, "a", QUIET, t0 + 11_750), r(1, 0, 0, 0)),
        // Ten minutes without a beat: b, c and d, there when it began, are kept and owe, each presumed for the
        // whole outage (capped at cut + silent: 601.5 s) and the hold, over its live count when last answered (2,
        // 3 and 4: the hold above answered them 4, but should that answer have been lost, a member divides by its
        // own earlier count; over the smaller count the term charges more, never less). a divides by 4 while they
        // owe.
        (
            "a back after 10 minutes",
            presuming(&k, "a", (true, true), 600_000, t0 + 611_750),
            r(4, 2_000, 0, 0),
        ),
        (
            "b, c and d presumed",
            beat(&k, "a", QUIET, t0 + 613_750),
            r(1, 0, 1_700_000_611_750, 302_750 + 201_834 + 151_375),
        ),
    ]);
    steps
        .into_iter()
        .map(|(what, call, reply)| step(what, call, reply))
        .collect()
}

#[tokio::test]
async fn members_that_never_report_are_presumed_to_have_sold_on_every_store() {
    EveryStore::start().replay(presumed_table).await;
}

#[tokio::test]
async fn the_roster_counts_the_live_and_holds_after_an_outage_on_every_store() {
    EveryStore::start().replay(fleet_table).await;
}
