//! The scripts of `lua/`: their names (the `script` metric label) and their source, loaded once per server
//! (`redis.rs`) and mirrored by the in-process store (`memory.rs`).

/// The scripts of `lua/`: one per algorithm, the give-backs, the fleet's roster and `reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Script {
    TokenBucket,
    TokenReturn,
    SlidingLog,
    FixedWindow,
    SlidingWindow,
    LeakyBucket,
    LeakyReturn,
    TokenAcquire,
    Reset,
    Fleet,
    TokenLease,
}

impl Script {
    /// Every script, in declaration order (the index of its hash and of its metric handles).
    pub(crate) const ALL: [Script; 11] = [
        Self::TokenBucket,
        Self::TokenReturn,
        Self::SlidingLog,
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::LeakyBucket,
        Self::LeakyReturn,
        Self::TokenAcquire,
        Self::Reset,
        Self::Fleet,
        Self::TokenLease,
    ];

    /// The script's name: its file name without `.lua`, and the `script` metric label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::TokenReturn => "token_return",
            Self::SlidingLog => "sliding_log",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::LeakyBucket => "leaky_bucket",
            Self::LeakyReturn => "leaky_return",
            Self::TokenAcquire => "token_acquire",
            Self::Reset => "reset",
            Self::Fleet => "fleet",
            Self::TokenLease => "token_lease",
        }
    }

    /// The script's source text.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Self::TokenBucket => include_str!("../../lua/token_bucket.lua"),
            Self::TokenReturn => include_str!("../../lua/token_return.lua"),
            Self::SlidingLog => include_str!("../../lua/sliding_log.lua"),
            Self::FixedWindow => include_str!("../../lua/fixed_window.lua"),
            Self::SlidingWindow => include_str!("../../lua/sliding_window.lua"),
            Self::LeakyBucket => include_str!("../../lua/leaky_bucket.lua"),
            Self::LeakyReturn => include_str!("../../lua/leaky_return.lua"),
            Self::TokenAcquire => include_str!("../../lua/token_acquire.lua"),
            Self::Reset => include_str!("../../lua/reset.lua"),
            Self::Fleet => include_str!("../../lua/fleet.lua"),
            Self::TokenLease => include_str!("../../lua/token_lease.lua"),
        }
    }
}
