//! The fleet's calls: a rule's roster key and a member's beat (`fleet.lua`).

use super::{Call, Op};
use crate::algorithm::fleet::Beat;

impl Call {
    /// `fleet.lua`: `beat` in the roster `key` ([`super::roster_key`]).
    pub(crate) fn beat(key: impl Into<String>, beat: Beat) -> Self {
        Self::new(key, Op::Fleet(beat))
    }
}
