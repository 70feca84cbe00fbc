//! A script's `ARGV` entries, typed: integers (tokens and milliseconds) and strings.

use crate::algorithm::ms;
use crate::algorithm::room::Lent;

/// An argument of a script, in `ARGV` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg<'a> {
    Int(i64),
    Str(&'a str),
    /// A give-back's tokens by lease, sent as `stamp:tokens` pairs joined by commas ([`Lent::encode`]).
    Lent(&'a [Lent]),
}

/// An integer argument (tokens or ms), saturating at `i64::MAX`.
pub(crate) fn int(v: u64) -> Arg<'static> {
    Arg::Int(ms(v))
}
