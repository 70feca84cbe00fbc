//! Readiness: whether the limiter's decisions come from its store now, for `/readyz` and the gauge
//! `tokenlease_store_ready`.

use super::Limiter;

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
