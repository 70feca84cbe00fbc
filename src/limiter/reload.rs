//! Hot reload: a new configuration's rules are compiled, checked, and swapped in whole (arc-swap), so calls in
//! flight finish under the rules they started with and a bad reload changes nothing.

use std::sync::Arc;

use super::builder::compile_keeping;
use super::Limiter;
use crate::config::Config;
use crate::error::Error;
use crate::rule;

impl Limiter {
    /// Swaps in the rules of a new configuration without dropping calls in flight (they finish under the rules
    /// they started with). A rule that is unchanged keeps its leased tokens; a changed rule applies to existing
    /// keys from the next call (the shared state in the store is kept: a new capacity or rate takes effect on
    /// it at once); a removed rule's callers get [`Error::UnknownRule`]; leased tokens of changed and removed
    /// rules go back to the shared bucket. `[redis] fail_mode` applies to the reloaded rules; rules passed to
    /// [`Limiter::check_rule`] keep the limiter's first fail mode.
    ///
    /// A config that does not parse never gets here ([`Config::from_path`] refuses it with its error), so the
    /// rules in force stay as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `rule` for duplicate rule names, or `redis` when the store's settings
    /// (all of `[redis]` but `fail_mode`) differ: those need a restart. Nothing changes then.
    /// [`Error::ShutDown`] after [`Limiter::shutdown`].
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        let engine = &self.inner.engine;
        if engine.background.is_closed() {
            return Err(Error::ShutDown);
        }
        let same_store = match (&self.inner.redis, &config.redis) {
            (Some(old), Some(new)) => old.same_store(new),
            (old, new) => old.is_none() && new.is_none(),
        };
        if !same_store {
            let why = "the store's settings (url, cluster, sentinel, key_prefix, timeout, expected_processes, \
                       require_noeviction) change only with a restart";
            return Err(rule::invalid(("redis", why.into())));
        }
        let old = self.inner.rules.load_full();
        let adopted_ms = crate::compiled::adopted_now(engine.clock.as_ref());
        let rules = compile_keeping(config.rules, config.fail_mode, &old, adopted_ms)?;
        self.inner.rules.store(Arc::new(rules));
        let current = self.inner.rules.load();
        for (name, compiled) in old.iter() {
            if !current.get(name).is_some_and(|c| Arc::ptr_eq(c, compiled)) {
                engine.retire(compiled);
            }
        }
        tracing::info!(rules = current.len(), "rules reloaded");
        Ok(())
    }
}
