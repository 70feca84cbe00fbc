//! A [`Scenario`] run on the real engine: its processes are limiters of this crate on one paused tokio runtime,
//! each calling the shared in-process store through its own link of a [`Faults`], which the schedule breaks and
//! mends. What each process admitted is counted per millisecond at the time its caller learned it.

use std::cell::Cell;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokenlease::{Clock, Config, Error, Faults, Limiter, LinkFault, RuleHandle, StoreFault, TokioClock};

use super::scenario::{Event, Fault, Limit, Scenario};

/// What a run gave the checks.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Tokens admitted in each ms since the start, at the ms the caller learned it.
    pub(super) admitted_ms: Vec<u64>,
    /// The limit from each ms on: the first at 0, then each reload's. A lowered one from when the store can have
    /// applied every call sent before the reload: the reload plus the longest such a call takes to reach the
    /// store (the request's half of the round trip and the millisecond tokio's timer may round it up by, or a
    /// caller's store timeout where a slow link or a stopped process delays calls), or the thaw of a store frozen
    /// at the reload, which applies the calls queued before it first (they carry the old rule). A raised one from
    /// the reload plus the request's half: the first a call made after it can reach the store.
    pub(super) limits: Vec<(u64, Limit)>,
    /// What faults no limiter on that store can mask added, from a ms on: (ms, tokens).
    pub(super) unmaskable: Vec<(u64, u64)>,
    /// The longest a granted answer takes to reach its caller, in ms: a caller counts it that much after the store
    /// granted it (the reply's half of the round trip and the millisecond tokio's timer may round it up by; a caller's store timeout where a slow link or a stopped
    /// process delays replies, as a later one is a timeout).
    pub(super) reply_ms: usize,
    pub(super) decisions: u64,
    pub(super) errors: u64,
    pub(super) store_calls: u64,
    /// Processes alive at the end (started and not killed).
    pub(super) alive: usize,
}

/// The store timeout of every process: a call answered later fails.
const CALL_TIMEOUT: Duration = Duration::from_millis(50);

/// A process's life, as its callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Its callers decide.
    Running,
    /// Stopped (`SIGSTOP`): its callers decide nothing until it goes on.
    Paused,
    /// Gone: nothing it decides from now on reaches a client.
    Killed,
}

/// Shared by the drivers: the tally and each process's life.
struct Tally {
    start: tokio::time::Instant,
    admitted: RefCell<Vec<u64>>,
    decisions: RefCell<(u64, u64)>,
}

impl Tally {
    /// Counts a decision: whether it was allowed, or its error.
    fn record(&self, life: &Cell<Life>, result: Result<bool, Error>) {
        // A killed process admitted nothing after its death: a decision it finished then never reached a client.
        if life.get() == Life::Killed {
            return;
        }
        let mut d = self.decisions.borrow_mut();
        d.0 += 1;
        match result {
            Ok(true) => {
                let ms = usize::try_from(self.start.elapsed().as_millis()).unwrap_or(usize::MAX);
                let mut admitted = self.admitted.borrow_mut();
                if admitted.len() <= ms {
                    admitted.resize(ms + 1, 0);
                }
                admitted[ms] += 1;
            }
            Ok(false) => {}
            Err(_) => d.1 += 1,
        }
    }
}

struct Process {
    limiter: Option<Limiter>,
    life: Rc<Cell<Life>>,
}

/// Runs `scenario` to its end on a paused current-thread runtime.
pub(super) fn run(scenario: &Scenario) -> Result<Outcome, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    runtime.block_on(local.run_until(simulate(scenario)))
}

async fn simulate(scenario: &Scenario) -> Result<Outcome, String> {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let faults = Faults::new(clock.clone(), Duration::from_millis(scenario.rtt_ms), CALL_TIMEOUT);
    let tally = Rc::new(Tally {
        start: tokio::time::Instant::now(),
        admitted: RefCell::new(vec![0; usize::try_from(scenario.duration_ms).unwrap_or(0) + 1000]),
        decisions: RefCell::new((0, 0)),
    });
    // Processes started and not killed (the demand is spread over them).
    let alive = Rc::new(Cell::new(0_usize));
    let mut limit = scenario.limit.clone();
    let mut outcome = Outcome {
        limits: vec![(0, limit.clone())],
        ..Outcome::default()
    };
    let delayed = scenario
        .faults
        .iter()
        .any(|e| matches!(e.fault, Fault::Slow(..) | Fault::Paused(_)));
    outcome.reply_ms = if delayed {
        usize::try_from(CALL_TIMEOUT.as_millis()).unwrap_or(usize::MAX)
    } else {
        // The reply's half of the round trip, and the millisecond tokio's timer may round a sleep up by.
        usize::try_from(scenario.rtt_ms - scenario.rtt_ms / 2 + 1).unwrap_or(0)
    };
    let request_ms = if delayed {
        u64::try_from(CALL_TIMEOUT.as_millis()).unwrap_or(u64::MAX)
    } else {
        scenario.rtt_ms / 2 + 1
    };
    let mut fleet: Vec<Process> = Vec::new();
    let total = scenario.processes + scenario.joiners.iter().map(|(_, n)| n).sum::<usize>();
    let start = |fleet: &mut Vec<Process>, limit: &Limit| -> Result<(), String> {
        let i = fleet.len();
        let limiter = Limiter::builder()
            .rule(limit.rule(scenario.mode)?)
            .store(faults.link(i))
            .clock(clock.clone())
            .expected_processes(scenario.expected)
            .timeout(CALL_TIMEOUT)
            .member(format!("p{i}"))
            .build()
            .map_err(|e| e.to_string())?;
        let handle = limiter.rule("r").map_err(|e| e.to_string())?;
        let queue = matches!(limit, Limit::LeakyQueue { .. }).then(|| limiter.clone());
        let life = Rc::new(Cell::new(Life::Running));
        alive.set(alive.get() + 1);
        let driver = Driver {
            handle,
            life: life.clone(),
            tally: tally.clone(),
            alive: alive.clone(),
            weight: weight(scenario, i, total),
            index: i,
            queue,
        };
        tokio::task::spawn_local(driver.run(scenario.clone()));
        fleet.push(Process {
            limiter: Some(limiter),
            life,
        });
        Ok(())
    };
    for _ in 0..scenario.processes {
        start(&mut fleet, &limit)?;
    }

    let mut store_faults: Vec<(usize, StoreFault)> = Vec::new();
    for (at, action) in actions(scenario) {
        tokio::time::sleep_until(tally.start + Duration::from_millis(at)).await;
        match action {
            Action::Join(n) => {
                for _ in 0..n {
                    start(&mut fleet, &limit)?;
                }
            }
            Action::Begin(i, event) => match event.fault {
                Fault::StoreRefusing | Fault::StoreHanging | Fault::StoreFrozen | Fault::StoreLosingReplies => {
                    store_faults.push((i, store_fault(event.fault)));
                    faults.set_store(store_fault(event.fault));
                }
                Fault::Partitioned(p) => faults.set_link(p, LinkFault::Partitioned),
                Fault::Refused(p) => faults.set_link(p, LinkFault::Refused),
                Fault::Slow(p, ms) => faults.set_latency(p, Duration::from_millis(ms)),
                Fault::Paused(p) => {
                    if let Some(process) = fleet.get(p).filter(|p| p.life.get() == Life::Running) {
                        process.life.set(Life::Paused);
                    }
                    faults.set_paused(p, true);
                }
                Fault::Killed(p) => {
                    if let Some(process) = fleet.get_mut(p) {
                        if process.life.replace(Life::Killed) != Life::Killed {
                            alive.set(alive.get() - 1);
                        }
                        // Dropped without a shutdown: nothing is given back or charged.
                        process.limiter = None;
                    }
                    faults.kill(p);
                }
                Fault::ClockStep(ms) => {
                    faults.step_clock(Duration::from_millis(ms));
                    outcome.unmaskable.push((at, step_adds(&limit, ms)));
                }
                Fault::Rollback => faults.snapshot(),
                Fault::Reload(factor) => {
                    let scaled = limit.scaled(factor);
                    let raised = scaled.rate_per_s() > limit.rate_per_s();
                    limit = scaled;
                    // A lowered limit binds once the store can have applied every call sent before the reload: a
                    // frozen store applies the calls queued before it first, at the thaw. A raised one from the
                    // first moment a call made after it can reach the store. In between, either rule's calls may
                    // arrive: the higher limit counts.
                    let thaw = (scenario.faults.iter())
                        .filter(|e| e.fault == Fault::StoreFrozen && e.from_ms <= at && at < e.until_ms)
                        .map(|e| e.until_ms)
                        .max()
                        .unwrap_or(0);
                    let from = if raised {
                        at.saturating_add(scenario.rtt_ms / 2)
                    } else {
                        at.saturating_add(request_ms).max(thaw)
                    };
                    // Reloads switch in the order they came.
                    let from = from.max(outcome.limits.last().map_or(0, |(ms, _)| *ms));
                    outcome.limits.push((from, limit.clone()));
                    let mut config = Config::in_memory(vec![limit.rule(scenario.mode)?]);
                    config.fail_mode = scenario.mode;
                    for limiter in fleet.iter().filter_map(|p| p.limiter.as_ref()) {
                        limiter.reload(config.clone()).map_err(|e| e.to_string())?;
                    }
                }
            },
            Action::End(i, event) => match event.fault {
                Fault::StoreRefusing | Fault::StoreHanging | Fault::StoreFrozen | Fault::StoreLosingReplies => {
                    store_faults.retain(|(j, _)| *j != i);
                    faults.set_store(store_faults.last().map_or(StoreFault::Healthy, |(_, f)| *f));
                }
                Fault::Partitioned(p) | Fault::Refused(p) => faults.set_link(p, LinkFault::Up),
                Fault::Slow(p, _) => faults.set_latency(p, Duration::ZERO),
                Fault::Paused(p) => {
                    if let Some(process) = fleet.get(p).filter(|p| p.life.get() == Life::Paused) {
                        process.life.set(Life::Running);
                    }
                    faults.set_paused(p, false);
                }
                Fault::Rollback => outcome.unmaskable.push((at, faults.rollback())),
                Fault::Killed(_) | Fault::ClockStep(_) | Fault::Reload(_) => {}
            },
        }
    }
    tokio::time::sleep_until(tally.start + Duration::from_millis(scenario.duration_ms)).await;
    // The callers stop at the end; what they still wait for finishes within the store's timeouts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    outcome.store_calls = fleet
        .iter()
        .filter_map(|p| p.limiter.as_ref())
        .map(|l| l.stats().store_calls)
        .sum();
    outcome.alive = alive.get();
    let (decisions, errors) = *tally.decisions.borrow();
    outcome.decisions = decisions;
    outcome.errors = errors;
    outcome.admitted_ms = tally.admitted.borrow().clone();

    Ok(outcome)
}

/// What a step of the store's clock by `ms` may let through: `min(capacity, rate × step)` of a token bucket; a
/// window rule's limit for each window the step skips, `limit × ⌈step / window⌉` (a span of W on the callers'
/// clock is W + step on the store's, which a longer step spreads over more windows).
fn step_adds(limit: &Limit, ms: u64) -> u64 {
    match limit {
        Limit::TokenBucket { capacity, .. } => (*capacity).min((limit.rate_per_s() * ms as f64 / 1000.0).ceil() as u64),
        // The schedule's slots come the step earlier.
        Limit::LeakyQueue { .. } => (limit.rate_per_s() * ms as f64 / 1000.0).ceil() as u64,
        Limit::SlidingLog { limit, window }
        | Limit::SlidingWindow { limit, window, .. }
        | Limit::FixedWindow { limit, window } => {
            let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
            limit.saturating_mul(ms.div_ceil(window_ms))
        }
    }
}

fn store_fault(fault: Fault) -> StoreFault {
    match fault {
        Fault::StoreRefusing => StoreFault::Refusing,
        Fault::StoreHanging => StoreFault::Hanging,
        Fault::StoreFrozen => StoreFault::Frozen,
        Fault::StoreLosingReplies => StoreFault::LosingReplies,
        _ => StoreFault::Healthy,
    }
}

/// A step of the schedule.
#[derive(Debug, Clone, Copy)]
enum Action {
    Join(usize),
    Begin(usize, Event),
    End(usize, Event),
}

/// The schedule's steps in time order (ties in the order drawn, beginnings before ends).
fn actions(scenario: &Scenario) -> Vec<(u64, Action)> {
    let mut steps: Vec<(u64, u8, usize, Action)> = Vec::new();
    for (j, (at, n)) in scenario.joiners.iter().enumerate() {
        steps.push((*at, 0, j, Action::Join(*n)));
    }
    for (i, e) in scenario.faults.iter().enumerate() {
        steps.push((e.from_ms, 1, i, Action::Begin(i, *e)));
        if !matches!(e.fault, Fault::Killed(_) | Fault::ClockStep(_) | Fault::Reload(_)) {
            steps.push((e.until_ms, 2, i, Action::End(i, *e)));
        }
    }
    steps.sort_by_key(|(at, order, i, _)| (*at, *order, *i));
    steps.into_iter().map(|(at, _, _, a)| (at, a)).collect()
}

/// Process `i`'s weight in the demand, 1 on average: with a skew, the first tenth (at least one) carries half of
/// it, the others the other half.
fn weight(scenario: &Scenario, i: usize, total: usize) -> f64 {
    match super::skewed_half(i, total, scenario.skewed) {
        Some(sharing) => total as f64 / 2.0 / sharing as f64,
        None => 1.0,
    }
}

/// One process's callers.
struct Driver {
    handle: RuleHandle,
    life: Rc<Cell<Life>>,
    tally: Rc<Tally>,
    alive: Rc<Cell<usize>>,
    weight: f64,
    index: usize,
    /// A leaky-bucket rule's limiter: each decision is an `acquire`, released when its slot comes.
    queue: Option<Limiter>,
}

impl Driver {
    /// Decides at its share of the demand until the end or its death; a decision that waits finishes on a task
    /// of its own.
    async fn run(self, scenario: Scenario) {
        let end = self.tally.start + Duration::from_millis(scenario.duration_ms);
        // Processes out of phase (spread by the golden ratio, whatever their number): in phase, a fleet deciding
        // slowly would ask all at once, once every few seconds, a burst no limit sells in full.
        let mut owed = (self.index as f64 * 0.618_034).fract();
        let mut last = tokio::time::Instant::now();
        // The decisions a second in force since `last`: the driver wakes at every change of the demand, so what it
        // owes is the demand's integral, and a step keeps each process's phase. (Charging the time since the last
        // wake at the new demand squeezed the phases: after 3610/s fell to 397/s, 64 processes decided within
        // 18 ms of each other every 161 ms, a burst no small bucket sells: seed 69.)
        let mut owed_per_s = 0.0;
        loop {
            let now = tokio::time::Instant::now();
            if now >= end || self.life.get() == Life::Killed {
                return;
            }
            let at_ms = u64::try_from((now - self.tally.start).as_millis()).unwrap_or(u64::MAX);
            let mut alive = self.alive.get().max(1);
            let mut per_s = scenario.demand_at(at_ms) as f64;
            if let Some(n) = scenario.deciders_at(at_ms) {
                alive = alive.min(n).max(1);
                if self.index >= n {
                    per_s = 0.0;
                }
            }
            let per_s = per_s * self.weight / alive as f64;
            if self.life.get() == Life::Running {
                owed += owed_per_s * (now - last).as_secs_f64();
            }
            (last, owed_per_s) = (now, per_s);
            while owed >= 1.0 {
                owed -= 1.0;
                let (handle, life, tally) = (self.handle.clone(), self.life.clone(), self.tally.clone());
                let queue = self.queue.clone();
                tokio::task::spawn_local(async move {
                    let result = match queue {
                        Some(limiter) => match limiter.acquire("r", "k", 1).await {
                            Ok(_) => Ok(true),
                            // A full queue turns the job away: a refusal, not a failure.
                            Err(Error::QueueFull { .. }) => Ok(false),
                            Err(e) => Err(e),
                        },
                        None => handle.check("k", 1).await.map(|d| d.allowed),
                    };
                    tally.record(&life, result);
                });
            }
            // The next decision's time, at least a ms away, or the demand's next change if sooner.
            let wait = if per_s > 0.0 { (1.0 - owed) / per_s } else { 0.1 };
            let mut wake = now + Duration::from_secs_f64(wait.clamp(0.001, 0.1));
            if let Some(change) = scenario.next_change_after(at_ms) {
                wake = wake.min(self.tally.start + Duration::from_millis(change));
            }
            tokio::time::sleep_until(wake).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use tokenlease::FailMode;

    use super::super::scenario::Overrides;
    use super::*;

    #[test]
    fn a_skewed_fleet_puts_half_the_demand_on_a_tenth_and_the_whole_demand_on_all() {
        let scenario = Scenario {
            skewed: true,
            ..Scenario::draw(1, FailMode::Closed, &Overrides::default())
        };
        for total in [2, 8, 10, 64] {
            let weights: Vec<f64> = (0..total).map(|i| weight(&scenario, i, total)).collect();
            let heavy = (total / 10).max(1);
            let sum: f64 = weights.iter().sum();
            assert!((sum - total as f64).abs() < 1e-9, "{total}: {weights:?}");
            let heavy_sum: f64 = weights[..heavy].iter().sum();
            assert!((heavy_sum - total as f64 / 2.0).abs() < 1e-9, "{total}: {weights:?}");
        }
    }

    /// A step of the store's clock lets a window rule sell its limit again in each window it skips (seed 10206:
    /// a sliding window of 1 s through a 1.5 s step sold 361 where one limit more allowed 290).
    #[test]
    fn a_clock_step_adds_a_windows_limit_for_each_window_it_skips() {
        let window = Limit::SlidingWindow {
            limit: 145,
            window: Duration::from_secs(1),
            sub_buckets: 1,
        };
        assert_eq!(
            [500, 1_000, 1_500, 3_000].map(|ms| step_adds(&window, ms)),
            [145, 145, 290, 435]
        );
        let bucket = Limit::TokenBucket {
            capacity: 2_000,
            rate: 1_000,
            per: Duration::from_secs(1),
            lease: None,
        };
        assert_eq!([500, 5_000].map(|ms| step_adds(&bucket, ms)), [500, 2_000]);
    }
}
