//! The checks of a seeded run, on what its callers were told, to the millisecond:
//!
//! - **Safety**, on every window from 0.2 s to the whole run: a token bucket's `capacity + ∫ rate` over the
//!   window and the lease TTL before it (`capacity + rate × (W + ttl)` when no reload changed the rate; the
//!   largest capacity across reloads; a reload's rate from the reload plus the longest a call sent before it
//!   takes to reach the store, [`Outcome::limits`]); a sliding log's `limit` in any window; a sliding-window counter's `limit`
//!   in any `sub_buckets` consecutive sub-buckets; a rolling fixed window's `limit` in each window, so at most
//!   `2 × limit` in any window's length and `limit × ⌈L / window⌉` in the first L of the run; a leaky-bucket
//!   queue's `rate × W + 1` releases (a job of one token). A fault no limiter on that
//!   store can mask widens the bound of the windows that end after it by what it adds, and no more: a rollback
//!   of the store by the grants it lost, a step of its clock by `min(capacity, rate × step)` (a window rule's
//!   `limit × ⌈step / window⌉`: each window the step skips).
//!   A caller counts a grant when its answer arrives, up to [`Outcome::reply_ms`] after the store made it: a
//!   token bucket's windows take that as part of the TTL before them, a window rule's windows start that much
//!   later.
//! - **Liveness**, apart (as TigerBeetle's VOPR does): from 2 s after the last fault healed to the end, when that
//!   is at least 3 s, the share sold of what could sell, judged each millisecond: what one token bucket of the
//!   rule's capacity and rate, empty at the tail's start, sells of the demand (or what the whole run's bound
//!   leaves after what was sold before, where lower); another limit's `min(demand, rate)` (a window rule's less
//!   one window's limit, which a tail may miss by its phase).

use std::time::Duration;

use tokenlease_timeline::{prefix, worst, Worst};

use super::fleet::Outcome;
use super::scenario::{in_force, Limit, Scenario};

/// The shortest window checked, in ms.
pub(super) const SHORTEST_MS: usize = 200;

/// A millisecond: the slot of a seed's admissions.
const MS: Duration = Duration::from_millis(1);

/// A healthy tail shorter than this is not judged for liveness, in ms.
const TAIL_MS: u64 = 3_000;

/// How long after the last fault heals the fleet may take to find its pace again, in ms.
const SETTLE_MS: u64 = 2_000;

/// When [`check`] finds the worst window in full, a search over every window and the costliest check (a run
/// over its bound always has it found).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Find {
    /// Every run: one printed in full, or tried while reducing.
    Always,
    /// A run that went over, or sold under `min_sell` of what could sell after healing: the ones a search prints.
    Failing { min_sell: f64 },
}

/// What the checks found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Verdict {
    /// Whether some window admitted more than its bound.
    pub(super) over: bool,
    /// The worst window (found in full only when `over`, or as [`Find`] asked).
    pub(super) worst: Worst,
    /// Sold over what could sell in the healthy tail; `None` without one.
    pub(super) sell: Option<f64>,
}

/// Checks `outcome` of `scenario`; `worst` finds the worst window even when none is over.
pub(super) fn check(scenario: &Scenario, outcome: &Outcome, find: Find) -> Verdict {
    let prefix = prefix(&outcome.admitted_ms);
    let over = match &scenario.limit {
        Limit::TokenBucket { .. } | Limit::LeakyQueue { .. } => bucket_excess(&prefix, outcome) > 1e-9,
        _ => window_worst(scenario, &prefix, outcome).ratio > 1.0,
    };
    let sell = sell_through(scenario, outcome, &prefix);
    let wanted = match find {
        Find::Always => true,
        Find::Failing { min_sell } => sell.is_some_and(|s| s < min_sell),
    };
    let worst = if over || wanted {
        match &scenario.limit {
            Limit::TokenBucket { .. } | Limit::LeakyQueue { .. } => bucket_worst(outcome),
            _ => window_worst(scenario, &prefix, outcome),
        }
    } else {
        Worst::default()
    };
    Verdict { over, worst, sell }
}

/// A token bucket's bound over `[from, to)` ms: the largest capacity, the refill from `from − ttl` to `to` at
/// the rates in force, and what unmaskable faults added before `to`.
struct BucketBound {
    capacity: f64,
    ttl_ms: usize,
    /// Refill from 0 to each ms (index: ms), in tokens.
    refill: Vec<f64>,
    /// Unmaskable tokens added up to each ms.
    added: Vec<f64>,
}

impl BucketBound {
    fn new(outcome: &Outcome, len: usize) -> Self {
        let (mut capacity, mut ttl_ms) = (0.0_f64, 0);
        for (_, limit) in &outcome.limits {
            match limit {
                Limit::TokenBucket { capacity: c, lease, .. } => {
                    capacity = capacity.max(*c as f64);
                    ttl_ms = ttl_ms.max(lease.map_or(0, |l| usize::try_from(l.ttl.as_millis()).unwrap_or(0)));
                }
                // A queue releases at its rate: one job's token is its burst (`rate × W + 1`).
                Limit::LeakyQueue { .. } => capacity = capacity.max(1.0),
                _ => {}
            }
        }
        // Counted when the caller learns it, a grant may be that much later than the store's.
        ttl_ms += outcome.reply_ms;
        let mut refill = vec![0.0; len + 1];
        let mut added = vec![0.0; len + 1];
        for ms in 1..=len {
            let rate = rate_at(outcome, ms as u64 - 1);
            refill[ms] = refill[ms - 1] + rate / 1000.0;
            added[ms] = added_before(outcome, ms as u64);
        }
        Self {
            capacity,
            ttl_ms,
            refill,
            added,
        }
    }

    /// The refill before ms 0 counts at the first rate (the bucket may have been full then: the capacity).
    fn refill_at(&self, ms: isize, first_rate: f64) -> f64 {
        if ms >= 0 {
            self.refill[usize::try_from(ms).unwrap_or(0).min(self.refill.len() - 1)]
        } else {
            ms as f64 * first_rate / 1000.0
        }
    }

    fn bound(&self, from: usize, to: usize, first_rate: f64) -> f64 {
        let start = from as isize - self.ttl_ms as isize;
        self.capacity + self.refill_at(to as isize, first_rate) - self.refill_at(start, first_rate) + self.added[to]
    }
}

fn rate_at(outcome: &Outcome, ms: u64) -> f64 {
    in_force(&outcome.limits, ms).map_or(0.0, Limit::rate_per_s)
}

/// What unmaskable faults added before `ms`, in tokens.
fn added_before(outcome: &Outcome, ms: u64) -> f64 {
    outcome
        .unmaskable
        .iter()
        .filter(|(at, _)| *at < ms)
        .map(|(_, n)| *n as f64)
        .sum()
}

/// The most any window of at least [`SHORTEST_MS`] admitted over its bound, in tokens (above 0: over), in one
/// pass: admitted(a, b) − bound(a, b) splits into a part of b minus a part of a.
fn bucket_excess(prefix: &[u64], outcome: &Outcome) -> f64 {
    let len = prefix.len() - 1;
    let bound = BucketBound::new(outcome, len);
    let first = rate_at(outcome, 0);
    let mut best_start = f64::INFINITY;
    let mut excess = f64::NEG_INFINITY;
    for to in SHORTEST_MS..=len {
        let from = to - SHORTEST_MS;
        let start = prefix[from] as f64 - bound.refill_at(from as isize - bound.ttl_ms as isize, first);
        best_start = best_start.min(start);
        let end = prefix[to] as f64 - bound.refill_at(to as isize, first) - bound.added[to];
        excess = excess.max(end - best_start - bound.capacity);
    }
    excess
}

/// The window of a token bucket with the largest admitted over bound, every window to the ms.
fn bucket_worst(outcome: &Outcome) -> Worst {
    let bound = BucketBound::new(outcome, outcome.admitted_ms.len());
    let first = rate_at(outcome, 0);
    let ms = |d: Duration| usize::try_from(d.as_millis()).unwrap_or(usize::MAX);
    let shortest = MS * u32::try_from(SHORTEST_MS).unwrap_or(u32::MAX);
    worst(&outcome.admitted_ms, MS, shortest, |start, end| {
        bound.bound(ms(start), ms(end), first)
    })
}

/// A window rule's worst window against its limit.
fn window_worst(scenario: &Scenario, prefix: &[u64], outcome: &Outcome) -> Worst {
    let len = prefix.len() - 1;
    let mut worst = Worst::default();
    // What a caller counted in [from + reply, to) the store granted in [from, to).
    let mut consider = |from: usize, to: usize, bound: f64| {
        let (from, to) = ((from + outcome.reply_ms).min(len), to.min(len));
        if from >= to {
            return;
        }
        worst.keep_if_worse(
            (
                MS * u32::try_from(from).unwrap_or(u32::MAX),
                MS * u32::try_from(to - from).unwrap_or(u32::MAX),
            ),
            prefix[to] - prefix[from],
            bound + added_before(outcome, to as u64),
        );
    };
    match &scenario.limit {
        Limit::SlidingLog { limit, window } => {
            let w = usize::try_from(window.as_millis()).unwrap_or(usize::MAX);
            for from in 0..len {
                consider(from, from + w, *limit as f64);
            }
        }
        Limit::SlidingWindow {
            limit,
            window,
            sub_buckets,
        } => {
            let w = usize::try_from(window.as_millis()).unwrap_or(usize::MAX);
            let sub = w / usize::try_from(*sub_buckets).unwrap_or(1).max(1);
            for from in (0..len).step_by(sub.max(1)) {
                consider(from, from + w, *limit as f64);
            }
        }
        Limit::FixedWindow { limit, window } => {
            let w = usize::try_from(window.as_millis()).unwrap_or(usize::MAX);
            for from in 0..len {
                consider(from, from + w, 2.0 * *limit as f64);
            }
            // Windows open at a first hit at 0 or later, each a window after the last: at most ⌈L / window⌉ of
            // them in the first L of the run.
            for to in (w.min(len)..=len).step_by(10) {
                consider(0, to, to.div_ceil(w.max(1)) as f64 * *limit as f64);
            }
        }
        Limit::TokenBucket { .. } | Limit::LeakyQueue { .. } => {}
    }
    worst
}

/// Sold over what could sell, from [`SETTLE_MS`] after the last fault healed to the end of the run.
///
/// What could sell is judged each millisecond, not over the tail's sums: a tail of 5 s at 3 times the rate and
/// 5 s at a tenth of it could sell 5.5 s of the rate, not 10 s. A token bucket could sell what one bucket of its
/// capacity and rate, empty at the tail's start, admits of the demand (the tokens it saves while the demand is
/// low sell later); the other limits `min(demand, rate)` each millisecond.
fn sell_through(scenario: &Scenario, outcome: &Outcome, prefix: &[u64]) -> Option<f64> {
    let from = scenario.healed_ms() + SETTLE_MS;
    let to = scenario.duration_ms;
    // A fleet whose every process was killed sells nothing, rightly.
    if to < from + TAIL_MS || outcome.alive == 0 {
        return None;
    }
    let at = |ms: u64| prefix[usize::try_from(ms).unwrap_or(usize::MAX).min(prefix.len() - 1)];
    let mut could = 0.0;
    let mut stock = 0.0;
    for ms in from..to {
        let demand = scenario.demand_at(ms) as f64 / 1000.0;
        let rate = rate_at(outcome, ms) / 1000.0;
        match in_force(&outcome.limits, ms) {
            Some(Limit::TokenBucket { capacity, .. }) => {
                stock = (stock + rate).min((*capacity as f64).max(rate));
                let sold = demand.min(stock);
                stock -= sold;
                could += sold;
            }
            _ => could += demand.min(rate),
        }
    }
    if let Limit::SlidingLog { limit, .. } | Limit::SlidingWindow { limit, .. } | Limit::FixedWindow { limit, .. } =
        scenario.limit
    {
        // A window sells its limit in a burst: the tail may start just after one and end just before the next.
        could = (could - limit as f64).max(0.0);
    }
    if let Limit::TokenBucket { .. } = scenario.limit {
        // What the whole run's bound leaves once what was sold before the tail is counted (a fleet that sold on
        // credit during an outage repays it now).
        let bound = BucketBound::new(outcome, prefix.len() - 1);
        let left = bound.bound(0, usize::try_from(to).unwrap_or(0), rate_at(outcome, 0)) - at(from) as f64;
        could = could.min(left.max(0.0));
    }
    let sold = (at(to) - at(from)) as f64;
    (could >= 1.0).then(|| sold / could)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokenlease::FailMode;

    use super::super::scenario::Overrides;
    use super::*;

    fn outcome(admitted_ms: Vec<u64>, limit: Limit) -> Outcome {
        Outcome {
            admitted_ms,
            limits: vec![(0, limit)],
            ..Outcome::default()
        }
    }

    fn bucket(capacity: u64, rate_per_s: u64) -> Limit {
        Limit::TokenBucket {
            capacity,
            rate: rate_per_s,
            per: Duration::from_secs(1),
            lease: None,
        }
    }

    /// Every window of at least 0.2 s, one by one.
    fn brute_over(admitted: &[u64], capacity: f64, rate_per_s: f64) -> bool {
        let prefix = prefix(admitted);
        (0..admitted.len()).any(|from| {
            (from + SHORTEST_MS..=admitted.len()).any(|to| {
                (prefix[to] - prefix[from]) as f64 > capacity + rate_per_s * (to - from) as f64 / 1000.0 + 1e-9
            })
        })
    }

    #[test]
    fn the_one_pass_check_finds_what_every_window_one_by_one_finds() {
        let mut x: u64 = 7;
        let mut disagreements = 0;
        let mut overs = 0;
        for round in 0..60 {
            let admitted: Vec<u64> = (0..900)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    u64::from((x >> 33) % 100 < 12 + round % 5)
                })
                .collect();
            let run = outcome(admitted.clone(), bucket(20, 100));
            let fast = bucket_excess(&prefix(&admitted), &run) > 1e-9;
            let brute = brute_over(&admitted, 20.0, 100.0);
            disagreements += u32::from(fast != brute);
            overs += u32::from(brute);
        }
        assert_eq!(disagreements, 0);
        assert!(overs > 5 && overs < 55, "both outcomes tried: {overs} of 60 over");
    }

    #[test]
    fn a_burst_over_capacity_plus_refill_is_over_and_the_worst_window_is_found() {
        let mut admitted = vec![0; 3000];
        admitted[1000] = 30; // capacity 20, 100/s: 0.2 s may hold 40
        admitted[1100] = 15;
        let run = outcome(admitted, bucket(20, 100));
        let scenario = Scenario::draw(1, FailMode::Closed, &Overrides::default());
        let scenario = Scenario {
            limit: bucket(20, 100),
            ..scenario
        };
        let verdict = check(&scenario, &run, Find::Always);
        assert!(verdict.over);
        assert_eq!(verdict.worst.admitted, 45);
        assert!((verdict.worst.ratio - 45.0 / 40.0).abs() < 1e-6, "{:?}", verdict.worst);
    }

    #[test]
    fn a_sliding_log_may_hold_its_limit_in_any_window_and_no_more() {
        let limit = Limit::SlidingLog {
            limit: 3,
            window: Duration::from_secs(1),
        };
        let scenario = Scenario {
            limit: limit.clone(),
            ..Scenario::draw(1, FailMode::Closed, &Overrides::default())
        };
        let mut admitted = vec![0; 3000];
        for at in [0, 500, 999, 1000, 1999] {
            admitted[at] = 1;
        }
        assert!(
            !check(
                &scenario,
                &outcome(admitted.clone(), limit.clone()),
                Find::Failing { min_sell: 0.0 }
            )
            .over
        );
        admitted[1200] = 1; // 500, 999, 1000, 1200 in [500, 1500)
        assert!(check(&scenario, &outcome(admitted, limit), Find::Failing { min_sell: 0.0 }).over);
    }

    #[test]
    fn a_rollback_widens_only_the_windows_that_end_after_it() {
        let mut admitted = vec![0; 2000];
        admitted[500] = 40; // 0.2 s after capacity 20 at 100/s holds 40: exactly the bound
        admitted[1500] = 45;
        let mut run = outcome(admitted, bucket(20, 100));
        assert!(bucket_excess(&prefix(&run.admitted_ms), &run) > 0.0);
        run.unmaskable = vec![(1400, 5)];
        assert!(bucket_excess(&prefix(&run.admitted_ms), &run) <= 1e-9);
        run.unmaskable = vec![(1600, 5)];
        assert!(
            bucket_excess(&prefix(&run.admitted_ms), &run) > 0.0,
            "added after the burst"
        );
    }

    #[test]
    fn what_could_sell_is_judged_each_millisecond_not_over_the_tails_sums() {
        // 3 s at 3 times the rate, then 5 s at a tenth of it: a fleet that sells the rate, then the demand, sold
        // all it could (the sums would say it could have sold the rate for 8 s).
        let limit = bucket(10, 100);
        let scenario = Scenario {
            limit: limit.clone(),
            demand: vec![(0, 300), (5_000, 10)],
            joiners: Vec::new(),
            faults: Vec::new(),
            duration_ms: 10_000,
            ..Scenario::draw(1, FailMode::Closed, &Overrides::default())
        };
        let mut admitted = vec![0; 11_000];
        for ms in (0..5_000).step_by(10) {
            admitted[ms] = 1;
        }
        for ms in (5_000..10_000).step_by(100) {
            admitted[ms] = 1;
        }
        let run = Outcome {
            alive: 4,
            ..outcome(admitted.clone(), limit.clone())
        };
        let sold = check(&scenario, &run, Find::Failing { min_sell: 0.0 })
            .sell
            .expect("a healthy tail");
        assert!(sold > 0.97, "{sold}");
        // Selling nothing in the slow part is selling under what could sell.
        admitted[5_000..].fill(0);
        let run = Outcome {
            alive: 4,
            ..outcome(admitted, limit)
        };
        let sold = check(&scenario, &run, Find::Failing { min_sell: 0.0 })
            .sell
            .expect("a healthy tail");
        assert!(sold < 0.9, "{sold}");
    }
}
