//! A rule as the limiter runs it: the rule, its fail mode, its metric handles, the keys it leases into this
//! process and the order of its queues' callers. Built once per rule (and again on a reload that changes it).

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::decision::Decision;
use crate::lease::bucket::LocalBucket;
use crate::rule::{FailMode, Rule};
use crate::telemetry::RuleMetrics;

/// A map keyed by strings with a fast hasher.
pub(crate) type KeyMap<V> = DashMap<String, V, foldhash::fast::RandomState>;

/// A rule as the limiter runs it.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) rule: Rule,
    pub(crate) fail_mode: FailMode,
    pub(crate) metrics: RuleMetrics,
    /// Leased tokens per key (rules with a lease only).
    pub(crate) leases: KeyMap<Arc<LocalBucket>>,
    /// Per key, the order in which this process's callers reserve queue slots (`acquire`): tokio's mutex is
    /// fair, so waiters are served first-in first-out.
    pub(crate) queues: KeyMap<Arc<tokio::sync::Mutex<()>>>,
    /// Callers of this rule waiting in a queue now.
    pub(crate) waiting: AtomicI64,
}

impl Compiled {
    /// Compiles `rule`; its own fail mode wins over `default_mode`. Registers its metric handles.
    pub(crate) fn new(rule: Rule, default_mode: FailMode) -> Self {
        Self {
            fail_mode: rule.fail_mode.unwrap_or(default_mode),
            metrics: RuleMetrics::new(&rule.name),
            leases: KeyMap::default(),
            queues: KeyMap::default(),
            waiting: AtomicI64::new(0),
            rule,
        }
    }

    /// Counts a decision and applies shadow mode: a shadow rule's refusal is counted as `shadow_rejected` and
    /// returned as an allowance.
    #[inline]
    pub(crate) fn record(&self, mut decision: Decision) -> Decision {
        if self.rule.shadow && !decision.allowed {
            self.metrics.shadow_rejected(decision.source);
            decision.allowed = true;
            decision.shadowed = true;
            decision.retry_after = Duration::ZERO;
        } else {
            self.metrics.decision(decision.allowed, decision.source);
        }
        decision
    }
}
