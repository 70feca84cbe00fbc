//! The fleet's calls: a rule's roster key and a member's beat (`fleet.lua`).

use super::{Call, Op};
use crate::algorithm::fleet::Beat;

/// The roster of `rule` (`fleet.lua`): `{prefix}:fleet:{rule}`. Store keys put `:{` right after the prefix and
/// rule names hold no `:`, so it is no store key of any (rule, key) pair.
pub(crate) fn roster_key(prefix: &str, rule: &str) -> String {
    format!("{prefix}:fleet:{{{rule}}}")
}

impl Call {
    /// `fleet.lua`: `beat` in the roster `key` ([`roster_key`]).
    pub(crate) fn beat(key: impl Into<String>, beat: Beat) -> Self {
        Self::new(key, Op::Fleet(beat))
    }
}
