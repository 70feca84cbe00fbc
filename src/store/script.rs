//! The scripts of `lua/`: their names (the `script` metric label) and their source, loaded once per server
//! (`redis.rs`) and mirrored by the in-process store (`memory.rs`).

/// `lua/NAME.lua` after `lua/lib/common.lua`.
macro_rules! script {
    ($name:literal) => {
        concat!(
            include_str!("../../lua/lib/common.lua"),
            include_str!(concat!("../../lua/", $name, ".lua"))
        )
    };
}

/// A token script, `lua/NAME.lua`, after `lua/lib/common.lua` and `lua/lib/bucket.lua`.
macro_rules! bucket_script {
    ($name:literal) => {
        concat!(
            include_str!("../../lua/lib/common.lua"),
            include_str!("../../lua/lib/bucket.lua"),
            include_str!(concat!("../../lua/", $name, ".lua"))
        )
    };
}

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

    /// The script's source text: `lua/lib/common.lua` (the integer helpers and the clock), for a token script
    /// `lua/lib/bucket.lua` (the bucket's hash), then `lua/NAME.lua`. Redis runs each script on its own, so
    /// what they share is put in front of each rather than loaded once.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Self::TokenBucket => bucket_script!("token_bucket"),
            Self::TokenReturn => bucket_script!("token_return"),
            Self::SlidingLog => script!("sliding_log"),
            Self::FixedWindow => script!("fixed_window"),
            Self::SlidingWindow => script!("sliding_window"),
            Self::LeakyBucket => script!("leaky_bucket"),
            Self::LeakyReturn => script!("leaky_return"),
            Self::TokenAcquire => bucket_script!("token_acquire"),
            Self::Reset => script!("reset"),
            Self::Fleet => script!("fleet"),
            Self::TokenLease => bucket_script!("token_lease"),
        }
    }
}
