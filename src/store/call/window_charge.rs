//! The typed arguments of `window_charge.lua`: which window a charge writes to, and its `ARGV` (see the
//! script's header).

use super::arg::{int, Arg};
use crate::algorithm::ms;
use crate::rule::{Algorithm, Calendar};

/// The window rule a [`Op::WindowCharge`] writes to, with the parameters of its decisions (ms and tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChargedWindow {
    FixedWindow {
        window_ms: u64,
        limit: u64,
        calendar: Option<Calendar>,
    },
    SlidingWindow {
        window_ms: u64,
        sub_buckets: u64,
        limit: u64,
    },
    SlidingLog {
        window_ms: u64,
        limit: u64,
    },
}

impl ChargedWindow {
    /// The window of a window rule's `algorithm`; `None` for the buckets.
    pub(crate) fn of(algorithm: &Algorithm) -> Option<Self> {
        match algorithm {
            Algorithm::FixedWindow {
                limit,
                window_ms,
                calendar,
                ..
            } => Some(Self::FixedWindow {
                window_ms: *window_ms,
                limit: *limit,
                calendar: calendar.clone(),
            }),
            Algorithm::SlidingWindow {
                limit,
                window_ms,
                sub_buckets,
                ..
            } => Some(Self::SlidingWindow {
                window_ms: *window_ms,
                sub_buckets: *sub_buckets,
                limit: *limit,
            }),
            Algorithm::SlidingLog { limit, window_ms, .. } => Some(Self::SlidingLog {
                window_ms: *window_ms,
                limit: *limit,
            }),
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => None,
        }
    }

    /// Window length in ms.
    pub(crate) fn window_ms(&self) -> u64 {
        match self {
            Self::FixedWindow { window_ms, .. }
            | Self::SlidingWindow { window_ms, .. }
            | Self::SlidingLog { window_ms, .. } => *window_ms,
        }
    }

    /// `ARGV` of a charge `id` of `admitted` (`(age_ms, tokens)`) to this window, without the trailing `now_ms`:
    /// algorithm, window_ms, limit, sub_buckets, align_ms, b0..b3 (`bounds`, a time zone's windows), id, n, then
    /// n pairs of age_ms and tokens.
    pub(super) fn args<'a>(&self, bounds: [i64; 4], id: &'a str, admitted: &[(u64, u64)]) -> Vec<Arg<'a>> {
        let (name, limit, sub_buckets, align) = match self {
            Self::FixedWindow { limit, calendar, .. } => {
                let align = match calendar {
                    None => -1,
                    Some(Calendar::Offset { align_ms }) => ms(*align_ms),
                    Some(Calendar::Zone(_)) => -2,
                };
                ("fixed_window", *limit, 0, align)
            }
            Self::SlidingWindow { limit, sub_buckets, .. } => ("sliding_window", *limit, *sub_buckets, 0),
            Self::SlidingLog { limit, .. } => ("sliding_log", *limit, 0, 0),
        };
        let mut v = vec![
            Arg::Str(name),
            int(self.window_ms()),
            int(limit),
            int(sub_buckets),
            Arg::Int(align),
        ];
        v.extend(bounds.map(Arg::Int));
        let n = u64::try_from(admitted.len()).unwrap_or(u64::MAX);
        v.extend([Arg::Str(id), int(n)]);
        v.extend(admitted.iter().flat_map(|&(age, tokens)| [int(age), int(tokens)]));
        v
    }
}
