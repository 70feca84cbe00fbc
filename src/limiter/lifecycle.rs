//! The limiter's life after building: the sweeper that expires leases and evicts idle keys, the fleet's beats,
//! readiness, and shutdown, which gives every leased token back. Readiness says whether the limiter's decisions
//! come from its store now, for `/readyz` and the gauge `tokenlease_store_ready`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Inner, Limiter};
use crate::lease::engine::Engine;
use crate::timings::Timings;

/// How many rules beat at once ([`beats`]).
const BEAT_LANES: usize = 32;

/// How often the sweeper runs: a quarter of the shortest lease TTL, 5 ms to 1 s ([`Timings::sweep_every`]).
fn sweep_interval(inner: &Inner) -> Duration {
    let rules = inner.rules.load();
    Timings::sweep_every(rules.values().filter_map(|c| c.rule.lease()).map(|l| l.ttl).min())
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

/// Beats for every rule that joined its fleet ([`crate::fleet`]), every second (every 100 ms while its beats
/// fail), until the limiter is shut down or gone. The rules beat side by side: a store that hangs makes each
/// beat wait up to its timeout, and one after another they would come that many timeouts apart.
pub(super) async fn beats(inner: Weak<Inner>) {
    loop {
        let Some((fleet, background)) = inner
            .upgrade()
            .map(|i| (i.engine.fallback.fleet.clone(), i.engine.background.clone()))
        else {
            return;
        };
        let mut pass = tokio::task::JoinSet::new();
        // At most this many rules beat at once: right after an outage every rule's beat comes at once.
        let lanes = Arc::new(tokio::sync::Semaphore::new(BEAT_LANES));
        for seen in fleet.joined() {
            let (fleet, lanes) = (fleet.clone(), lanes.clone());
            pass.spawn(async move {
                let _lane = lanes.acquire_owned().await;
                // A failed beat counts as a store failure: the next one is back, and soon.
                let _ = fleet.beat(&seen).await;
                fleet.is_urgent(&seen)
            });
        }
        let mut soon = false;
        loop {
            tokio::select! {
                biased;
                // Shut down: the pass's beats finish on their own.
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
        let wait = if soon { Timings::BEAT_SOON } else { Timings::BEAT };
        tokio::select! {
            biased;
            _ = background.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl Limiter {
    /// One pass of the sweeper: expire overdue leases, evict idle keys, update gauges.
    fn sweep(&self) {
        self.inner.engine.sweep(&self.all_compiled());
    }

    /// Stops the limiter: later calls get [`crate::Error::ShutDown`]; leases in flight finish; every leased
    /// token not spent is given back to the shared bucket before this returns. Then the process leaves the rules'
    /// fleets (one beat each, within a beat's timeout).
    pub async fn shutdown(&self) {
        let engine = &self.inner.engine;
        engine.background.close().await;
        let mut returns = tokio::task::JoinSet::new();
        for (compiled, local, tokens) in Engine::drain(&self.all_compiled()) {
            let engine = engine.clone();
            returns.spawn(async move { engine.give_back(&compiled, &local, tokens).await });
        }
        while returns.join_next().await.is_some() {}
        // The others count this process out at once.
        let fallback = &engine.fallback;
        fallback.fleet.leave(engine.store.timings.beat).await;
    }
}

/// Whether the store is deciding ([`Limiter::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct Readiness {
    /// The store decides: the circuit breaker is closed, the last store call succeeded and the store accepts
    /// writes.
    pub ready: bool,
    /// Why not, when not ready: the store's error (`READONLY`, `OOM`, a timeout, an open breaker).
    pub reason: Option<String>,
    /// A `maxmemory-policy` of the store's Redis that may evict limiter keys, when one was reported (a warning:
    /// not ready only under `[redis] require_noeviction = true`).
    pub eviction_policy: Option<String>,
}

impl Limiter {
    /// Whether the store is deciding now: the circuit breaker is closed (or lets this probe through), and a
    /// probe of the store succeeds — for Redis a script that writes nothing but is refused as a write would be,
    /// so a server demoted to a replica (`READONLY`) or out of memory (`OOM`) is not ready. The probe is a store
    /// call: it counts for the breaker and sets `tokenlease_store_ready`, as every store call does. Under
    /// `[redis] require_noeviction = true`, a server whose `maxmemory-policy` may evict limiter keys (seen after
    /// a failover, since start-up refuses it) is not ready either.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// let limiter = tokenlease::Limiter::builder().build()?; // the in-process store is always ready
    /// assert!(limiter.readiness().await.ready);
    /// # Ok(()) }
    /// ```
    pub async fn readiness(&self) -> Readiness {
        let store = &self.inner.engine.store;
        let probed = store.probe().await;
        let eviction_policy = store.eviction_policy();
        let required = self.inner.redis.as_ref().is_some_and(|r| r.require_noeviction);
        let reason = match (probed, &eviction_policy) {
            (Err(e), _) => Some(e.to_string()),
            (Ok(()), Some(policy)) if required => Some(format!(
                "Redis `maxmemory-policy` is `{policy}`, which may evict limiter keys, and \
                 `[redis] require_noeviction = true`"
            )),
            (Ok(()), _) => None,
        };
        Readiness {
            ready: reason.is_none(),
            reason,
            eviction_policy,
        }
    }
}
