//! The fail mode of window keys, the [`Fallback`]'s side of the window shares (`windows.rs`): a call decided by
//! the local share, the write-back of what it admitted before the key's next store call, and the write-backs at
//! shutdown.

use std::sync::Arc;
use std::time::Duration;

use super::windows::Charge;
use super::{Fallback, Unsettled};
use crate::error::StoreError;
use crate::store::call::{Call, ChargedWindow};

impl Fallback {
    /// Before a store call for `store_key` (whose limits are now `window`, `None` when no longer a window rule):
    /// writes back what the key's local share admitted alone, so that the call's answer counts it, then holds the
    /// key for the recovery spread. Nothing owed (the common case) costs one load.
    ///
    /// # Errors
    /// [`Unsettled::Held`] while the key is held (and right after its charge); [`Unsettled::Busy`] while
    /// another caller's charge of the key is in flight; [`Unsettled::Failed`] with the charge's store error
    /// (what it writes stays owed).
    pub(super) async fn settle_window(
        self: &Arc<Self>,
        store_key: &str,
        window: Option<&ChargedWindow>,
    ) -> Result<(), Unsettled> {
        let shares = &self.window_shares;
        if let Some(ms) = shares.held(store_key, self.now_ms()) {
            return Err(Unsettled::Held(Duration::from_millis(ms)));
        }
        if !shares.any_owed() {
            return Ok(());
        }
        let Some(window) = window else {
            tracing::warn!(key = %store_key, "admissions of a key that is no longer a window rule are dropped");
            let _ = shares.forget(store_key);
            return Ok(());
        };
        let mut charged = false;
        // What was admitted while a charge was in flight goes in the next one: a few rounds at most.
        for _ in 0..3 {
            let members = &self.members;
            let Some(charge) = shares
                .take_owed(store_key, || members.next())
                .map_err(|_| Unsettled::Busy)?
            else {
                break;
            };
            let (this, key, window) = (self.clone(), store_key.to_owned(), window.clone());
            let task = async move { this.charge_window(&key, &window, charge, false).await };
            match self.background.spawn(task).await {
                Ok(Ok(())) => charged = true,
                Ok(Err(error)) => return Err(Unsettled::Failed(error)),
                Err(_) => return Err(Unsettled::Failed(StoreError::timeout("window_charge", Duration::ZERO))),
            }
        }
        if !charged {
            return Ok(());
        }
        let hold = self.store.timeouts.recovery_spread();
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX));
        shares.hold(store_key, until);
        Err(Unsettled::Held(hold))
    }

    /// Writes `charge` of `store_key` back to its shared `window` (`window_charge.lua`); `past_breaker` sends
    /// it even while the circuit breaker is open (at shutdown, the last chance).
    pub(super) async fn charge_window(
        &self,
        store_key: &str,
        window: &ChargedWindow,
        charge: Charge,
        past_breaker: bool,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let admitted = charge
            .admitted
            .iter()
            .map(|&(at, n)| (now.saturating_sub(at), n))
            .collect();
        // As a lease: the charge's id makes a retry after a timeout harmless, but a longer wait spares one.
        let call =
            Call::charge_window(store_key, window.clone(), charge.id, admitted).with_timeout(self.store.timeouts.lease);
        let result = self.run_charge(&call, past_breaker).await;
        let now = self.now_ms();
        match result {
            Ok(reply) => {
                tracing::debug!(key = %store_key, written = reply.granted, "wrote back what fail_mode local admitted");
                self.window_shares.settled(store_key, window, Some(&reply), now);
                Ok(())
            }
            Err(error) => {
                self.window_shares.settled(store_key, window, None, now);
                Err(error)
            }
        }
    }

    /// Writes back everything the window shares owe, for shutdown: past the circuit breaker, again and again
    /// until nothing is owed or `patience` has passed. What is still owed then is given up: each key is logged
    /// (WARN, with its rule, key and tokens) and its tokens passed to `dropped(rule, tokens)`, as
    /// [`Fallback::settle_all`] does for token buckets.
    pub(crate) async fn settle_all_windows(self: &Arc<Self>, patience: Duration, dropped: impl Fn(&str, u64)) {
        let deadline = tokio::time::Instant::now() + patience;
        while self.window_shares.any_owed() {
            let mut charges = tokio::task::JoinSet::new();
            for (key, window) in self.window_shares.owing_keys() {
                let members = &self.members;
                if let Ok(Some(charge)) = self.window_shares.take_owed(&key, || members.next()) {
                    let this = self.clone();
                    charges.spawn(async move { this.charge_window(&key, &window, charge, true).await });
                }
            }
            while charges.join_next().await.is_some() {}
            if !self.window_shares.any_owed() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                for (key, _) in self.window_shares.owing_keys() {
                    let tokens = self.window_shares.forget(&key);
                    let (rule, user_key) = super::split_store_key(&key);
                    tracing::warn!(
                        rule,
                        key = user_key,
                        tokens,
                        waited = ?patience,
                        "shut down owing what fail_mode local admitted alone on a window rule: the store did not \
                         take the write-back, so its window may have admitted this many over the limit"
                    );
                    dropped(rule, tokens);
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
