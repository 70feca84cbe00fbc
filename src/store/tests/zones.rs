//! Calendar windows in IANA time zones, replayed with exact `now_ms` against a real Redis and the in-process
//! store: a daily quota is full again exactly at each local midnight around the daylight-saving changes of 2026
//! in Berlin and New York, the 23- and 25-hour days admit exactly the limit, hourly windows follow the wall
//! clock through the repeated hour, and a fixed `utc_offset` keeps its 24-hour days.

use std::time::Duration;

use super::harness::{r, step, EveryStore, Step};
use crate::rule::{Calendar, Zone};
use crate::store::script::Script;
use crate::store::Call;

const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// Milliseconds since the epoch of an RFC 3339 instant.
fn at(s: &str) -> u64 {
    let ms = s.parse::<jiff::Timestamp>().expect("timestamp").as_millisecond();
    u64::try_from(ms).expect("after 1970")
}

fn zone(name: &str) -> Option<Calendar> {
    Some(Calendar::Zone(Zone::iana(name).expect("zone")))
}

/// fixed_window.lua in a zone: `cost` of `limit` per `window_ms`, at `now`.
fn take(key: &str, window_ms: u64, limit: u64, calendar: Option<Calendar>, now: u64) -> Call {
    Call::fixed_window(format!("tl:{{z:{key}}}"), (window_ms, limit), 1, 0, calendar).at(now)
}

/// A daily quota of 3 over a day of `hours` local hours starting at `midnight`: 3 granted, the 4th refused up to
/// the day's last millisecond, and the quota full again at the next midnight.
fn day(steps: &mut Vec<Step>, key: &str, tz: &str, midnight: &str, hours: u64) {
    let start = at(midnight);
    let end = start + hours * HOUR;
    let cal = || zone(tz);
    let what = |s: &str| format!("{tz} {midnight} ({hours} h): {s}");
    steps.push(step(
        what("first at midnight"),
        take(key, DAY, 3, cal(), start),
        r(1, 2, 0, (hours * HOUR) as i64),
    ));
    // Through the change of offset (02:00–03:00 local is skipped or repeated).
    for (i, t) in [start + HOUR + HOUR / 2, start + 3 * HOUR + HOUR / 2]
        .into_iter()
        .enumerate()
    {
        steps.push(step(
            what("across the change"),
            take(key, DAY, 3, cal(), t),
            r(1, 1 - i as u64, 0, (end - t) as i64),
        ));
    }
    steps.push(step(
        what("4th at the day's last ms"),
        take(key, DAY, 3, cal(), end - 1),
        r(0, 0, 1, 1),
    ));
    steps.push(step(
        what("full again at the next midnight"),
        take(key, DAY, 3, cal(), end),
        r(1, 2, 0, DAY as i64),
    ));
}

fn table(p: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let k = |n: &str| format!("{p}-{n}");
    // Berlin: 2026-03-29 has 23 hours (02:00 CET → 03:00 CEST), 2026-10-25 has 25 (03:00 CEST → 02:00 CET).
    day(
        &mut steps,
        &k("berlin-spring"),
        "Europe/Berlin",
        "2026-03-28T23:00:00Z",
        23,
    );
    day(
        &mut steps,
        &k("berlin-fall"),
        "Europe/Berlin",
        "2026-10-24T22:00:00Z",
        25,
    );
    // New York: 2026-03-08 has 23 hours, 2026-11-01 has 25.
    day(
        &mut steps,
        &k("ny-spring"),
        "America/New_York",
        "2026-03-08T05:00:00Z",
        23,
    );
    day(
        &mut steps,
        &k("ny-fall"),
        "America/New_York",
        "2026-11-01T04:00:00Z",
        25,
    );

    // The day before a change: the quota used up at its last millisecond is full again at midnight.
    let eve = k("berlin-eve");
    steps.push(step(
        "Berlin 2026-03-28 23:59:59.999",
        take(&eve, DAY, 1, zone("Europe/Berlin"), at("2026-03-28T22:59:59.999Z")),
        r(1, 0, 0, 1),
    ));
    steps.push(step(
        "Berlin 2026-03-29 00:00",
        take(&eve, DAY, 1, zone("Europe/Berlin"), at("2026-03-28T23:00:00Z")),
        r(1, 0, 0, 23 * HOUR as i64),
    ));

    // Hourly in New York through the fall-back: 01:00–02:00 is shown twice, each an hour's window of its own.
    let hourly = k("ny-hourly");
    let ny = || zone("America/New_York");
    steps.push(step(
        "01:30 EDT",
        take(&hourly, HOUR, 1, ny(), at("2026-11-01T05:30:00Z")),
        r(1, 0, 0, 30 * 60_000),
    ));
    steps.push(step(
        "01:59:59.999 EDT",
        take(&hourly, HOUR, 1, ny(), at("2026-11-01T05:59:59.999Z")),
        r(0, 0, 1, 1),
    ));
    steps.push(step(
        "01:00 EST, the repeated hour",
        take(&hourly, HOUR, 1, ny(), at("2026-11-01T06:00:00Z")),
        r(1, 0, 0, HOUR as i64),
    ));
    steps.push(step(
        "01:30 EST",
        take(&hourly, HOUR, 1, ny(), at("2026-11-01T06:30:00Z")),
        r(0, 0, 30 * 60_000, 30 * 60_000),
    ));
    // Hourly in Berlin through the spring-forward: 01:00 CET is followed by 03:00 CEST an hour later.
    let spring = k("berlin-hourly");
    let berlin = || zone("Europe/Berlin");
    steps.push(step(
        "01:30 CET",
        take(&spring, HOUR, 1, berlin(), at("2026-03-29T00:30:00Z")),
        r(1, 0, 0, 30 * 60_000),
    ));
    steps.push(step(
        "03:00 CEST",
        take(&spring, HOUR, 1, berlin(), at("2026-03-29T01:00:00Z")),
        r(1, 0, 0, HOUR as i64),
    ));
    // Two-hour windows: 00:00–02:00 CET, then 03:00–04:00 CEST (cut at the change), then 04:00–06:00 CEST.
    let two = k("berlin-2h");
    steps.push(step(
        "01:30 CET",
        take(&two, 2 * HOUR, 1, berlin(), at("2026-03-29T00:30:00Z")),
        r(1, 0, 0, 30 * 60_000),
    ));
    steps.push(step(
        "03:30 CEST",
        take(&two, 2 * HOUR, 1, berlin(), at("2026-03-29T01:30:00Z")),
        r(1, 0, 0, 30 * 60_000),
    ));
    steps.push(step(
        "04:00 CEST",
        take(&two, 2 * HOUR, 1, berlin(), at("2026-03-29T02:00:00Z")),
        r(1, 0, 0, 2 * HOUR as i64),
    ));

    // utc_offset = "+01:00" is Berlin's winter time all year: its 2026-03-29 has 24 hours.
    let fixed = k("fixed");
    let plus1 = || Some(Calendar::Offset { align_ms: HOUR });
    steps.push(step(
        "+01:00 midnight",
        take(&fixed, DAY, 1, plus1(), at("2026-03-28T23:00:00Z")),
        r(1, 0, 0, DAY as i64),
    ));
    steps.push(step(
        "+01:00 at Berlin's midnight",
        take(&fixed, DAY, 1, plus1(), at("2026-03-29T22:00:00Z")),
        r(0, 0, HOUR as i64, HOUR as i64),
    ));
    steps
}

#[tokio::test]
async fn zoned_days_reset_at_local_midnight_on_every_store() {
    let stores = EveryStore::start();
    stores.replay(table).await;
}

/// Without `now_ms` the Redis server's clock picks among the three windows the client sent; a server clock
/// outside them is an error, not a wrong window.
#[tokio::test]
async fn the_server_clock_picks_the_window() {
    let stores = EveryStore::start();
    let tokyo = zone("Asia/Tokyo").expect("zone");
    for (name, store) in stores.each() {
        let call = Call::fixed_window(format!("tl:{{z:{name}-now}}"), (DAY, 2), 1, 0, Some(tokyo.clone()));
        let reply = store.run(&call).await.expect("store");
        assert_eq!((reply.granted, reply.remaining), (1, 1), "{name}");
        // Tokyo's next midnight by this machine's wall clock (the in-process store's clock is monotonic: it
        // cuts calendar windows on the wall clock too); 10 s of slack for a slow machine, no more.
        let now = crate::rule::wall_clock_ms();
        let until_midnight = tokyo.window(DAY, now).1 - now;
        assert!(
            (reply.reset_after_ms - until_midnight).abs() < 10_000,
            "{name}: {reply:?} vs {until_midnight}"
        );
    }
    let mut conn = redis::Client::open(stores.server.url())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connection");
    let script = Script::FixedWindow.source();
    let stale: Result<redis::Value, _> = redis::cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg(&["tl:{z:stale}", "tl:{z:stale}:ban"][..])
        .arg(&[DAY, 2, 1, 0][..])
        .arg(&[-2_i64, 0, 1, 2, 3][..])
        .query(&mut conn);
    let err = stale.expect_err("the server's clock is after b3").to_string();
    assert!(err.contains("outside the windows sent"), "{err}");
    // The window holding now_ms is used, whichever of the three: [2000, 3000), [1000, 2000), then back.
    let mut eval = |now: i64| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(script)
            .arg(2)
            .arg(&["tl:{z:pick}", "tl:{z:pick}:ban"][..])
            .arg(&[DAY, 2, 1, 0][..])
            .arg(&[-2_i64, 0, 1000, 2000, 3000, now][..])
            .query(&mut conn)
            .expect("eval")
    };
    assert_eq!(eval(2500), [1, 1, 0, 500]);
    assert_eq!(eval(1500), [1, 1, 0, 500]);
    assert_eq!(eval(1600), [1, 0, 0, 400]);
    assert_eq!(eval(2600), [1, 1, 0, 400]);
}
