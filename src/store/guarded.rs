//! The store as the limiter calls it: every call counted, refused at once while the circuit breaker is open,
//! and bounded by the limiter's timeouts. The Redis latency and error metrics are recorded by the Redis store
//! itself, where the script and the error kind are known.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::breaker::{Admit, Breaker};
use super::script::Script;
use super::{Call, Store};
use crate::algorithm::Reply;
use crate::clock::Clock;
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry;
use crate::timings::Timings;

/// A store behind a circuit breaker, with a count of its calls and the outcome of the last.
#[derive(Debug)]
pub(crate) struct Guarded {
    store: Arc<dyn Store>,
    breaker: Breaker,
    clock: Arc<dyn Clock>,
    calls: AtomicU64,
    /// Calls made, per script in [`Script::ALL`]'s order.
    by_script: [AtomicU64; Script::ALL.len()],
    /// The last call that reached the store succeeded (or none has failed yet); the gauge `store_ready`.
    answered: AtomicBool,
    /// The error of the last call that failed while the store was unavailable.
    last_error: Mutex<Option<String>>,
    pub(crate) timings: Timings,
}

impl Guarded {
    /// Guards `store`; the breaker reads `clock`.
    pub(crate) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, timings: Timings) -> Self {
        // Registered now, so a scrape shows it before the first call: no call has failed yet.
        telemetry::store_ready(true);
        Self {
            store,
            breaker: Breaker::new(Timings::BREAKER_FAILURES, timings.breaker_open),
            clock,
            calls: AtomicU64::new(0),
            by_script: std::array::from_fn(|_| AtomicU64::new(0)),
            answered: AtomicBool::new(true),
            last_error: Mutex::new(None),
            timings,
        }
    }

    /// Notes how a call that reached the store ended, for readiness: a store error (not one call's own, such
    /// as a script error) makes the store unavailable until a call succeeds.
    fn note<T>(&self, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => {
                if !self.answered.swap(true, Ordering::AcqRel) {
                    telemetry::store_ready(true);
                }
            }
            Err(e) if e.is_unavailable() => {
                *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                if self.answered.swap(false, Ordering::AcqRel) {
                    telemetry::store_ready(false);
                }
            }
            Err(_) => {}
        }
    }

    /// Whether the store decides now: the breaker is closed (or lets this probe through) and the store's probe
    /// succeeds (for Redis: it answers and accepts writes). The probe counts as a call for the breaker.
    ///
    /// # Errors
    /// The probe's error, or one of kind `Other` naming the last store error when the breaker is open.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        if self.breaker.admit(self.clock.now_ns()) == Admit::No {
            let last = self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
            return Err(StoreError {
                kind: StoreErrorKind::Other,
                script: "probe",
                message: format!(
                    "circuit open: the store failed repeatedly; last error: {}",
                    last.as_deref().unwrap_or("none")
                ),
                source: None,
            });
        }
        let result = self.store.probe().await;
        self.breaker
            .record(result.as_ref().err().map(StoreError::is_transient), self.clock.now_ns());
        self.note(&result);
        result
    }

    /// The unsafe `maxmemory-policy` the store reported, if any.
    pub(crate) fn eviction_policy(&self) -> Option<String> {
        self.store.eviction_policy()
    }

    /// Runs a call unless the breaker is open.
    ///
    /// # Errors
    /// The store's error, or one of kind `CircuitOpen` when the breaker is open (the store was not called).
    pub(crate) async fn run(&self, call: &Call) -> Result<Reply, StoreError> {
        if self.breaker.admit(self.clock.now_ns()) == Admit::No {
            return Err(StoreError {
                kind: StoreErrorKind::CircuitOpen,
                script: call.script().name(),
                message: "circuit open: the store failed repeatedly; not called".into(),
                source: None,
            });
        }
        self.run_past_breaker(call).await
    }

    /// Runs a call even while the breaker is open (a beat: it never holds the breaker's probe); the result is
    /// recorded as any call's, by the breaker and for readiness.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) async fn run_past_breaker(&self, call: &Call) -> Result<Reply, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.by_script[call.script() as usize].fetch_add(1, Ordering::Relaxed);
        let result = self.store.run(call).await;
        self.breaker
            .record(result.as_ref().err().map(StoreError::is_transient), self.clock.now_ns());
        self.note(&result);
        result
    }

    /// Calls made so far (leases, returns, beats and direct checks).
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls made so far per script, by name, in [`Script::ALL`]'s order.
    pub(crate) fn calls_by_script(&self) -> Vec<(&'static str, u64)> {
        Script::ALL
            .iter()
            .zip(&self.by_script)
            .map(|(script, n)| (script.name(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// The `source` label of the store's decisions.
    pub(crate) fn source(&self) -> Source {
        self.store.source()
    }

    /// Whether the store answers now.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    /// Whether the breaker is open (or half-open) now.
    pub(crate) fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }
}
