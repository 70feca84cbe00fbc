//! Looking at a key without deciding it, and forgetting it: [`Limiter::peek`] (cost 0) and [`Limiter::reset`].

use super::Limiter;
use crate::decision::Decision;
use crate::error::Error;
use crate::store::call::{store_key, Call};

impl Limiter {
    /// The state of `key` under `rule`, taking nothing (a peek; `check` with cost 0 is the same).
    ///
    /// `remaining` is what the shared state has left (tokens, or the window's room) plus, for a key this
    /// process leases, the tokens it holds (tokens other processes hold are theirs until their leases end);
    /// `allowed` says whether a call of one token would be admitted now, `retry_after` how long until it
    /// would, `reset_after` how long until the key is back to its full allowance. Nothing is recorded or
    /// banned, no decision is counted in the metrics, and a leaky bucket's queue is not joined. The peek is
    /// one store call (with the store's timeout); the fail mode does not answer for it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::fixed_window("post", 3, Duration::from_secs(60))?)
    ///     .build()?;
    /// limiter.check("post", "user:7", 1).await?;
    /// let state = limiter.peek("post", "user:7").await?;
    /// assert_eq!((state.allowed, state.remaining), (true, 2));
    /// assert_eq!(limiter.check("post", "user:7", 0).await?.remaining, 2); // the same peek
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRule`]; [`Error::InvalidArgument`] for an empty or oversized key; [`Error::Store`] when
    /// the store fails or times out; [`Error::ShutDown`] after [`Limiter::shutdown`].
    pub async fn peek(&self, rule: &str, key: &str) -> Result<Decision, Error> {
        let compiled = self.compiled(rule)?;
        let engine = &self.inner.engine;
        engine.validate(&compiled, key, 0)?;
        engine.peek(&compiled, key).await
    }

    /// Forgets `key` under `rule`: its shared state (bucket, log, window or queue) and its ban are deleted, so
    /// the key starts afresh (a token bucket full, a window empty), and the tokens this process holds for it
    /// are dropped (not given back: the bucket is full again). Other processes keep the tokens they hold for
    /// the key until their leases end (at most the lease `ttl`): after a reset the key may admit up to that
    /// much more than a full bucket.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::fixed_window("post", 1, Duration::from_secs(60))?)
    ///     .build()?;
    /// assert!(limiter.check("post", "user:7", 1).await?.allowed);
    /// assert!(!limiter.check("post", "user:7", 1).await?.allowed);
    /// limiter.reset("post", "user:7").await?; // a moderator lifts the limit
    /// assert!(limiter.check("post", "user:7", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Limiter::peek`].
    pub async fn reset(&self, rule: &str, key: &str) -> Result<(), Error> {
        let compiled = self.compiled(rule)?;
        self.inner.engine.validate(&compiled, key, 0)?;
        if let Some((_, local)) = compiled.leases.remove(key) {
            // Retired: a lease in flight that lands later goes straight back.
            local.drain();
            compiled.flush(local.unflushed());
        }
        let engine = &self.inner.engine;
        let call = Call::reset(store_key(&engine.key_prefix, &compiled.rule.name, key));
        engine.store.run(&call).await?;
        engine.refusals.forget(compiled.generation, key);
        Ok(())
    }
}
