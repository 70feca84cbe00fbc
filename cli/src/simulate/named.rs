//! Named scenarios (`simulate --scenario NAME`): the paths over the bound that reviews of the engine found by
//! reading it (issue "sim"), each written as a schedule the simulator runs and checks as it does a seed's, and
//! outages of 1, 5 and 30 s, which show what the fleet sells while the store is away (issue "escrow"). The
//! shipped `sku_buy` rule (2000 tokens, 1000 a second, leased 10-500 for 200 ms) unless a path needs another.

use std::time::Duration;

use tokenlease::{FailMode, Lease};

use super::scenario::{Event, Fault, Limit, Scenario};

/// Every named scenario: its name and what it tries.
pub(super) const NAMES: [(&str, &str); 17] = [
    (
        "cut-off",
        "one process of four black-holed for 10 s while the others lease at 1.5x the rate",
    ),
    (
        "cut-off-blip",
        "one process refused 100 ms on a full key, then 1.5x the rate",
    ),
    (
        "join-before-freeze",
        "four processes join 0.3 s before the store freezes for 10 s, at 10x the rate",
    ),
    (
        "stale-shares",
        "three processes saw the key full 20 s ago, the fourth drained it, then the store is down",
    ),
    ("short-blip", "three of four cut off 0.8 s while the fourth leases"),
    (
        "short-blip-cold",
        "three of four cut off 0.3 s on a key that turns hot as the blip starts",
    ),
    (
        "stale-settled-beat",
        "the store freezes 3 s; a process that sold alone is killed just before the thaw",
    ),
    (
        "second-outage",
        "a process cut off again 0.5 s after a freeze's thaw, then killed",
    ),
    (
        "paused-across-hold",
        "a process stopped from inside a 2 s freeze until after the hold",
    ),
    (
        "window-never-presumed",
        "a fixed window of 100 a day, four processes, the store down 2 s, one killed owing",
    ),
    (
        "reload-undone",
        "the rate lowered tenfold while the key is quiet 1.5 s, leases given back late",
    ),
    (
        "reload-then-idle",
        "a burst drains the key, the rate is lowered tenfold, the key idles until its hash expired, a burst",
    ),
    (
        "clock-step",
        "the store's clock steps 1 s ahead (bound widened by min(capacity, rate x step))",
    ),
    (
        "rollback",
        "the store fails over to a copy 1 s old (bound widened by the grants lost)",
    ),
    (
        "outage-1s",
        "the store refuses every call for 1 s under four processes at 1.5x the rate: what an outage sells",
    ),
    (
        "outage-5s",
        "the store refuses every call for 5 s under four processes at 1.5x the rate",
    ),
    (
        "outage-30s",
        "the store refuses every call for 30 s under four processes at 1.5x the rate",
    ),
];

/// The shipped `sku_buy` rule.
fn sku_buy() -> Limit {
    Limit::TokenBucket {
        capacity: 2000,
        rate: 1000,
        per: Duration::from_secs(1),
        lease: Some(Lease {
            min_batch: 10,
            max_batch: 500,
            ttl: Duration::from_millis(200),
            hot_after: None,
            reserve: None,
        }),
    }
}

fn at(from_ms: u64, until_ms: u64, fault: Fault) -> Event {
    Event {
        from_ms,
        until_ms,
        fault,
    }
}

/// Four processes selling `sku_buy` at 1.5 times its rate for `duration_ms`, with `faults`.
fn sale(name: &'static str, mode: FailMode, duration_ms: u64, faults: Vec<Event>) -> Scenario {
    Scenario {
        name: Some(name),
        seed: 0,
        mode,
        limit: sku_buy(),
        processes: 4,
        joiners: Vec::new(),
        expected: 4,
        demand: vec![(0, 1500)],
        deciders: Vec::new(),
        skewed: false,
        rtt_ms: 1,
        duration_ms,
        faults,
        overrides: String::new(),
    }
}

/// The scenario `name` under `mode`.
pub(super) fn scenario(name: &str, mode: FailMode) -> Result<Scenario, String> {
    let Some(&(name, _)) = NAMES.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        return Err(format!("--scenario {name}: one of {}", names.join(", ")));
    };
    Ok(match name {
        "cut-off" => sale(name, mode, 16_000, vec![at(2_000, 12_000, Fault::Partitioned(0))]),
        "cut-off-blip" => {
            let mut s = sale(name, mode, 14_000, vec![at(2_000, 2_100, Fault::Refused(0))]);
            s.demand = vec![(0, 500), (2_100, 1500)];
            s
        }
        "join-before-freeze" => {
            let mut s = sale(name, mode, 16_000, vec![at(3_000, 13_000, Fault::StoreFrozen)]);
            s.joiners = vec![(2_700, 4)];
            s.demand = vec![(0, 10_000)];
            s
        }
        "stale-shares" => {
            let mut s = sale(name, mode, 28_000, vec![at(21_000, 26_000, Fault::StoreRefusing)]);
            s.demand = vec![(0, 400), (500, 2000)];
            s.deciders = vec![(500, 1), (21_000, 4)];
            s
        }
        "short-blip" => sale(
            name,
            mode,
            10_000,
            (1..4).map(|p| at(3_000, 3_800, Fault::Partitioned(p))).collect(),
        ),
        "short-blip-cold" => {
            let mut s = sale(
                name,
                mode,
                10_000,
                (1..4).map(|p| at(3_000, 3_300, Fault::Partitioned(p))).collect(),
            );
            s.demand = vec![(0, 0), (2_990, 1500)];
            s
        }
        "stale-settled-beat" => sale(
            name,
            mode,
            10_000,
            vec![at(3_000, 6_000, Fault::StoreFrozen), at(5_900, 5_900, Fault::Killed(1))],
        ),
        "second-outage" => sale(
            name,
            mode,
            10_000,
            vec![
                at(3_000, 5_000, Fault::StoreFrozen),
                at(5_600, 6_100, Fault::Partitioned(1)),
                at(6_100, 6_100, Fault::Killed(1)),
            ],
        ),
        "paused-across-hold" => sale(
            name,
            mode,
            10_000,
            vec![at(3_000, 5_000, Fault::StoreFrozen), at(4_500, 7_000, Fault::Paused(1))],
        ),
        "window-never-presumed" => {
            let mut s = sale(
                name,
                mode,
                10_000,
                vec![
                    at(1_000, 3_000, Fault::StoreRefusing),
                    at(2_500, 2_500, Fault::Killed(0)),
                ],
            );
            s.limit = Limit::FixedWindow {
                limit: 100,
                window: Duration::from_secs(86_400),
            };
            s.demand = vec![(0, 40)];
            s.rtt_ms = 0;
            s
        }
        "reload-undone" => {
            let mut s = sale(name, mode, 10_000, vec![at(3_000, 3_000, Fault::Reload(0.1))]);
            s.deciders = vec![(3_000, 0), (4_500, 4)];
            s
        }
        "reload-then-idle" => {
            let mut s = sale(name, mode, 10_000, vec![at(3_000, 3_000, Fault::Reload(0.1))]);
            s.demand = vec![(0, 0), (2_000, 100_000), (2_200, 0), (6_000, 100_000), (6_300, 0)];
            s
        }
        "clock-step" => sale(name, mode, 10_000, vec![at(3_000, 3_000, Fault::ClockStep(1_000))]),
        "outage-1s" | "outage-5s" | "outage-30s" => {
            let down_ms = match name {
                "outage-1s" => 1_000,
                "outage-5s" => 5_000,
                _ => 30_000,
            };
            let faults = vec![at(3_000, 3_000 + down_ms, Fault::StoreRefusing)];
            sale(name, mode, 3_000 + down_ms + 5_000, faults)
        }
        _ => sale(name, mode, 10_000, vec![at(3_000, 4_000, Fault::Rollback)]),
    })
}
