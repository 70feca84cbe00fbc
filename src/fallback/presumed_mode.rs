//! What the fleet presumed of members that never reported after an outage (invariant 19,
//! [`crate::algorithm::fleet`]), charged to each key of the rule before the key's next store call.
//!
//! A member presumed to have sold alone may have exited with its debt; waiting for the bucket to refill what it
//! sold does not make up for it, since the refill of a bucket below its cap is banked during the wait and sold
//! after it (the others charged their own debts first, so the bucket is below its cap). So the key is charged:
//! - a token bucket is debited the presumption's ms of its refill (`ms × rate / per_ms` tokens, down to
//!   −capacity as every debit). Every process sends the same debit, its mark named by the hold's epoch
//!   (`fleet.{epoch}`), so the store applies it once per key whoever sends it first;
//! - a leaky-bucket queue has no burst to bank: it waits the presumption's ms from when this process heard it
//!   (its releases alone were paced; the wait keeps the shared schedule behind them).
//!
//! Window rules presume nothing (a window's limit is per window). A key untouched for two refills and the
//! presumption's ms after this process heard of it is not charged: from any level down to −capacity, its bucket
//! is full by then with the charge or without it, so the charge changes nothing any window can see.

use std::time::Duration;

use super::presumed::debit_id;
use super::{split_store_key, Fallback, Unsettled};
use crate::algorithm::MAX_EXACT;
use crate::fleet::refill_ms;
use crate::rule::Algorithm;
use crate::store::call::Call;

impl Fallback {
    /// Before a store call for `store_key` (whose limits are now `algorithm`) of a `local` rule: charges the
    /// latest presumption of the rule's fleet to the key, unless this process did already or it no longer
    /// matters (see the module's docs).
    ///
    /// # Errors
    /// [`Unsettled::Held`] while a leaky queue waits out the presumption; [`Unsettled::Failed`] with the debit's
    /// store error (the caller's call would most likely fail too; the next call sends the debit again).
    pub(super) async fn presume(&self, store_key: &str, algorithm: &Algorithm) -> Result<(), Unsettled> {
        let rule = split_store_key(store_key).0;
        let Some(presumed) = self.fleet.presumed(rule) else {
            return Ok(());
        };
        let now = self.now_ms();
        match (algorithm, refill_ms(algorithm)) {
            (Algorithm::TokenBucket { bucket, .. }, Some(refill)) => {
                let until = presumed.kept_until(refill);
                if now >= until || self.charged.charged(store_key, presumed.epoch) {
                    return Ok(());
                }
                // Beyond two capacities the debit would charge nothing more (it stops at −capacity).
                let tokens = (presumed.ms.saturating_mul(bucket.rate).div_ceil(bucket.per_ms))
                    .clamp(1, bucket.capacity.saturating_mul(2).min(MAX_EXACT));
                // No hold: the fleet's hold has ended, and nobody else owes this.
                let call = Call::debit(store_key, *bucket, tokens, debit_id(presumed.epoch), 0)
                    .with_timeout(self.store.timeouts.debit);
                let reply = self.store.run(&call).await.map_err(Unsettled::Failed)?;
                tracing::debug!(key = %store_key, tokens, charged = reply.granted, "charged what the fleet presumed");
                self.report(store_key, *bucket, reply.remaining);
                self.charged.record(store_key, presumed.epoch, until);
                Ok(())
            }
            (Algorithm::LeakyBucket { .. }, _) => {
                // A queue refills nothing (its refill_ms is 0): the presumption's own ms.
                let until = presumed.kept_until(0);
                match until.checked_sub(now) {
                    Some(left) if left > 0 => Err(Unsettled::Held(Duration::from_millis(left))),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}
