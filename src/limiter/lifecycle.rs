//! The limiter's life after building: the sweeper that expires leases and evicts idle keys, and shutdown,
//! which gives every leased token back and charges what the local share admitted alone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Inner, Limiter};
use crate::fleet::{BEAT, BEAT_SOON};
use crate::lease::engine::Engine;
use crate::telemetry;

/// How long [`Limiter::shutdown`] keeps charging what `fail_mode = "local"` admitted alone, past the circuit
/// breaker, every 100 ms, before it gives the rest up (logged per key and counted in
/// `tokenlease_debt_dropped_tokens_total`): 5 s, within a Kubernetes pod's default 30 s grace period.
pub(crate) const DEBT_PATIENCE: Duration = Duration::from_secs(5);

/// How many rules beat at once ([`beats`]).
const BEAT_LANES: usize = 32;

/// How often the sweeper runs: a quarter of the shortest lease TTL, 5 ms to 1 s.
fn sweep_interval(inner: &Inner) -> Duration {
    let rules = inner.rules.load();
    let shortest = rules.values().filter_map(|c| c.rule.lease()).map(|l| l.ttl / 4).min();
    shortest
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// Gives expired leases back and evicts idle keys, every quarter of the shortest lease TTL (5 ms to 1 s), until
/// the limiter is shut down or gone.
pub(super) async fn sweeper(inner: Weak<Inner>) {
    loop {
        // Recomputed each round: a reload may bring shorter lease TTLs.
        let Some((interval, background)) = inner
            .upgrade()
            .map(|i| (sweep_interval(&i), i.engine.background.clone()))
        else {
            return;
        };
        tokio::select! {
            biased;
            _ = background.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        drop(background);
        let Some(inner) = inner.upgrade() else { return };
        Limiter { inner }.sweep();
    }
}

/// Beats for every rule that joined its fleet ([`crate::fleet`]), every second (every 100 ms while cut off from
/// the store or held), until the limiter is shut down or gone. Back from an outage and owing, a rule first beats
/// unsettled (the fleet is held from then on, whoever calls first), charges every key that owes, then reports
/// settled. The rules beat side by side: a store that hangs makes each beat wait up to a debit's timeout, and one
/// after another they would come that many timeouts apart.
pub(super) async fn beats(inner: Weak<Inner>) {
    loop {
        let Some((fallback, background)) = inner
            .upgrade()
            .map(|i| (i.engine.fallback.clone(), i.engine.background.clone()))
        else {
            return;
        };
        let fleet = fallback.fleet.clone();
        let mut pass = tokio::task::JoinSet::new();
        // At most this many rules beat at once: right after an outage every rule's beat comes at once.
        let lanes = Arc::new(tokio::sync::Semaphore::new(BEAT_LANES));
        for seen in fleet.joined() {
            let (fleet, fallback, lanes) = (fleet.clone(), fallback.clone(), lanes.clone());
            pass.spawn(async move {
                let _lane = lanes.acquire_owned().await;
                let rule = seen.rule();
                if fleet.is_back(&seen) && fallback.owes(rule) && fleet.beat(&seen, false).await.is_ok() {
                    fallback.settle_rule(rule).await;
                }
                // A failed beat counts as a store failure: the next one is back, and soon.
                let _ = fleet.beat(&seen, !fallback.owes(rule)).await;
                fleet.is_urgent(&seen)
            });
        }
        drop(fallback);
        let mut soon = false;
        loop {
            tokio::select! {
                biased;
                // Shut down: the pass's beats and charges finish on their own (shutdown charges what is left).
                _ = background.cancelled() => {
                    pass.detach_all();
                    return;
                }
                urgent = pass.join_next() => match urgent {
                    Some(urgent) => soon |= urgent.unwrap_or(true),
                    None => break,
                },
            }
        }
        let wait = if soon { BEAT_SOON } else { BEAT };
        tokio::select! {
            biased;
            _ = background.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl Limiter {
    /// One pass of the sweeper: expire overdue leases, evict idle keys, forget settled debits, update gauges.
    fn sweep(&self) {
        self.inner.engine.sweep(&self.all_compiled());
        self.inner.engine.fallback.sweep(self.inner.engine.process.idle_ttl);
    }

    /// Stops the limiter: later calls get [`crate::Error::ShutDown`]; leases in flight finish; every leased
    /// token not spent is given back to the shared bucket, and what `fail_mode = "local"` admitted alone and is
    /// not charged yet is charged to it, before this returns. Then the process leaves the rules' fleets it owes
    /// nothing (one beat each, within a debit's timeout).
    pub async fn shutdown(&self) {
        let engine = &self.inner.engine;
        engine.background.close().await;
        let mut returns = tokio::task::JoinSet::new();
        for (compiled, local, tokens) in Engine::drain(&self.all_compiled()) {
            let engine = engine.clone();
            returns.spawn(async move { engine.give_back(&compiled, &local, tokens).await });
        }
        // What the local share admitted alone and is not charged yet is charged now, so a restart right after an
        // outage is no second burst either: past the breaker (right after an outage it is still open), again and
        // again for up to DEBT_PATIENCE. What is still owed then is logged and counted as dropped.
        let fallback = Arc::clone(&engine.fallback);
        let rules = self.all_compiled();
        // The rules whose debt was given up: their fleets are not left.
        let gave_up = Arc::new(dashmap::DashSet::<String>::new());
        let gave_up_in = gave_up.clone();
        returns.spawn(async move {
            let dropped = |rule: &str, tokens: u64| {
                gave_up_in.insert(rule.to_owned());
                match rules.iter().find(|c| c.rule.name == rule) {
                    Some(compiled) => compiled.metrics.debt_dropped.increment(tokens),
                    None => telemetry::debt_dropped(rule, tokens),
                }
            };
            tokio::join!(
                fallback.settle_all(DEBT_PATIENCE, dropped),
                fallback.settle_all_windows(DEBT_PATIENCE, dropped),
                fallback.settle_all_queues(DEBT_PATIENCE)
            );
        });
        while returns.join_next().await.is_some() {}
        // Settled, this process leaves its rules' fleets: the others count it out at once, and no hold waits for
        // it or presumes it sold alone. A rule still owing, or whose debt was given up, stays, for the next hold to
        // presume its debt.
        let fallback = &engine.fallback;
        let owes = |rule: &str| fallback.owes(rule) || gave_up.contains(rule);
        fallback.fleet.leave(owes, engine.store.timeouts.debit).await;
    }
}
