//! A rule's report to its fleet after an outage (invariant 19): whether any of its keys owes what
//! `fail_mode = "local"` admitted alone, and one pass charging every such key, whether or not a caller asks for
//! it again. The beats (`limiter/lifecycle.rs`) report the rule settled once nothing is owed.

use std::sync::Arc;

use super::{split_store_key, Fallback};

impl Fallback {
    /// Whether any key of `rule` owes what its local share admitted alone and no charge has taken to the store
    /// yet (a token bucket's debit, a window's write-back, a queue's slots): what the fleet's hold waits for. A
    /// token bucket's debt carried past the bucket's floor (−capacity) does not count: the bucket charged to its
    /// floor makes up for it, and waiting for the refill that lets it land would hold the fleet, and presume
    /// this live member, over and over.
    pub(crate) fn owes(&self, rule: &str) -> bool {
        let of_rule = |key: &str| split_store_key(key).0 == rule;
        (self.buckets.any_owed() && self.buckets.uncharged_keys().iter().any(|key| of_rule(key)))
            || (self.window_shares.any_owed() && self.window_shares.owing_keys().iter().any(|(key, _)| of_rule(key)))
            || (self.queues.any_owed() && self.queues.owing_keys().iter().any(|key| of_rule(key)))
    }

    /// Charges every key of `rule` that owes, once each, concurrently, through the circuit breaker: a key whose
    /// charge is in flight already is left to it, a failed charge stays owed (the next beat tries again).
    pub(crate) async fn settle_rule(self: &Arc<Self>, rule: &str) {
        let of_rule = |key: &str| split_store_key(key).0 == rule;
        let mut charges = tokio::task::JoinSet::new();
        for (key, _) in self.buckets.owing_keys() {
            if !of_rule(&key) {
                continue;
            }
            let members = &self.members;
            if let Ok(Some(debit)) = self.buckets.take_owed(&key, || members.next()) {
                let this = self.clone();
                charges.spawn(async move { this.charge(&key, debit.bucket, &debit, false).await });
            }
        }
        for (key, window) in self.window_shares.owing_keys() {
            if !of_rule(&key) {
                continue;
            }
            let members = &self.members;
            if let Ok(Some(charge)) = self.window_shares.take_owed(&key, || members.next()) {
                let this = self.clone();
                charges.spawn(async move { this.charge_window(&key, &window, charge, false).await });
            }
        }
        for key in self.queues.owing_keys() {
            if !of_rule(&key) {
                continue;
            }
            if let Ok(Some((queue, until_ms))) = self.queues.take_owed(&key, self.now_ms()) {
                let this = self.clone();
                charges.spawn(async move { this.charge_queue(&key, queue, until_ms, false).await });
            }
        }
        while let Some(done) = charges.join_next().await {
            if let Ok(Err(error)) = done {
                tracing::debug!(rule, %error, "a charge after the outage failed; the next beat tries again");
            }
        }
    }
}
