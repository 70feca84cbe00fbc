//! `fleet.lua` replayed with exact `now_ms` sequences on both stores: the live count (invariant 17) and the time
//! the store ran the beat at.

use super::harness::{r, step, EveryStore, Step};
use crate::algorithm::fleet::Beat;
use crate::store::call::roster_key;
use crate::store::Call;

/// A beat of `member` at `now` (live 3 s, kept 60 s), leaving when `leave`.
fn beat(key: &str, member: &str, leave: bool, now: u64) -> Call {
    let beat = Beat {
        member: member.to_owned(),
        live_ms: 3_000,
        keep_ms: 60_000,
        leave,
    };
    Call::beat(key, beat).at(now)
}

fn fleet_table(p: &str) -> Vec<Step> {
    let k = roster_key("tl", &format!("sale-{p}"));
    let t0 = 1_700_000_000_000;
    // Replies: { processes, now_ms, 0, 0 }.
    let steps = [
        ("a joins", beat(&k, "a", false, t0), r(1, t0, 0, 0)),
        ("b joins", beat(&k, "b", false, t0 + 500), r(2, t0 + 500, 0, 0)),
        ("c joins", beat(&k, "c", false, t0 + 1_000), r(3, t0 + 1_000, 0, 0)),
        (
            "a again: three live",
            beat(&k, "a", false, t0 + 1_000),
            r(3, t0 + 1_000, 0, 0),
        ),
        // b was last heard at t0 + 500: live until t0 + 3 500 (exclusive).
        ("b still live", beat(&k, "a", false, t0 + 3_499), r(3, t0 + 3_499, 0, 0)),
        ("b no longer", beat(&k, "a", false, t0 + 3_500), r(2, t0 + 3_500, 0, 0)),
        // An outage: the first member back finds the others unheard for longer than the live window.
        ("c back first", beat(&k, "c", false, t0 + 9_000), r(1, t0 + 9_000, 0, 0)),
        ("a back", beat(&k, "a", false, t0 + 9_100), r(2, t0 + 9_100, 0, 0)),
        // A member that leaves is counted out at once, and answered without itself.
        ("c leaves", beat(&k, "c", true, t0 + 9_200), r(1, t0 + 9_200, 0, 0)),
        ("a beats", beat(&k, "a", false, t0 + 9_300), r(1, t0 + 9_300, 0, 0)),
        // b, unheard for keep_ms, is forgotten: it does not come back as live if it beats again late.
        (
            "b forgotten, back",
            beat(&k, "b", false, t0 + 61_000),
            r(1, t0 + 61_000, 0, 0),
        ),
        ("a back too", beat(&k, "a", false, t0 + 61_100), r(2, t0 + 61_100, 0, 0)),
        // The last member leaves an empty roster: answered 0.
        ("a leaves", beat(&k, "a", true, t0 + 61_200), r(1, t0 + 61_200, 0, 0)),
        ("b leaves", beat(&k, "b", true, t0 + 61_300), r(0, t0 + 61_300, 0, 0)),
    ];
    steps
        .into_iter()
        .map(|(what, call, reply)| step(what, call, reply))
        .collect()
}

#[tokio::test]
async fn the_roster_counts_the_live_on_every_store() {
    EveryStore::start().replay(fleet_table).await;
}
