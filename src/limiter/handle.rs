//! A [`RuleHandle`]: a rule resolved once, for callers who check it often (the hot path then costs one hash
//! lookup, the key's, and no load of the rules snapshot).

use std::sync::Arc;

use super::Limiter;
use crate::compiled::Compiled;
use crate::decision::Decision;
use crate::error::Error;

/// A configured rule of a [`Limiter`], from [`Limiter::rule`]. Cheap to clone.
///
/// After a reload that changes or removes the rule, the handle looks the rule up by name on each call (as
/// [`Limiter::check`] does): it keeps working, at the cost of that lookup; take a new handle to drop it.
#[derive(Debug, Clone)]
pub struct RuleHandle {
    pub(super) limiter: Limiter,
    pub(super) compiled: Arc<Compiled>,
}

impl RuleHandle {
    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.compiled.rule.name
    }

    /// [`Limiter::check`] on this rule: takes `cost` tokens of `key`.
    ///
    /// # Errors
    /// As [`Limiter::check`]; [`Error::UnknownRule`] once a reload removed the rule.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        if self.compiled.is_retired() {
            return self.limiter.check(self.name(), key, cost).await;
        }
        let engine = &self.limiter.inner.engine;
        if let Some(decision) = engine.decide_now(&self.compiled, key, cost)? {
            return Ok(decision);
        }
        engine.decide(&self.compiled, key, cost).await
    }
}

impl Limiter {
    /// A handle on `rule` that checks without looking the rule up by name: [`RuleHandle::check`] costs one
    /// hash lookup (the key's). It follows reloads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::token_bucket("sku_buy", 2000, 1000, Duration::from_secs(1))?)
    ///     .build()?;
    /// let sku_buy = limiter.rule("sku_buy")?;
    /// assert!(sku_buy.check("sku:42", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRule`].
    pub fn rule(&self, rule: &str) -> Result<RuleHandle, Error> {
        let compiled = self.inner.rules.load().get(rule).cloned();
        let compiled = compiled.ok_or_else(|| Error::UnknownRule(rule.to_owned()))?;
        Ok(RuleHandle {
            limiter: self.clone(),
            compiled,
        })
    }
}
