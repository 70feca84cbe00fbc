//! Errors. A refusal is a [`crate::Decision`], never an error: errors are for what went wrong.

use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong when asking the limiter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No rule of this name is configured.
    #[error("unknown rule `{0}`")]
    UnknownRule(String),
    /// The cost exceeds what the rule can ever grant at once (its capacity or limit): the call can never succeed
    /// (governor's `InsufficientCapacity`).
    #[error("rule `{rule}`: cost {cost} exceeds the capacity {capacity} tokens, so it can never be granted")]
    CostAboveCapacity {
        /// The rule asked.
        rule: String,
        /// Tokens asked for.
        cost: u64,
        /// The most the rule grants at once, in tokens.
        capacity: u64,
    },
    /// An argument is out of its range; `name` is the argument's name.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The argument's name (`cost`, `key`, ...).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The store failed and the rule's `fail_mode` is not one that answers anyway.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration is invalid (boxed: a [`ConfigError`] is large, and an `Error` is in every decision's
    /// `Result`).
    #[error(transparent)]
    Config(#[from] Box<ConfigError>),
    /// The limiter was shut down.
    #[error("the limiter is shut down")]
    ShutDown,
    /// `[redis] require_noeviction = true` and a Redis server's `maxmemory-policy` may evict limiter keys (an
    /// evicted bucket comes back full: the limit is granted again).
    #[error(
        "Redis at {node}: `maxmemory-policy` is `{policy}`, which may evict limiter keys (an evicted bucket comes back \
         full); set it to `noeviction`, or `[redis] require_noeviction = false` to run anyway"
    )]
    EvictionPolicy {
        /// The server, `host:port`.
        node: String,
        /// Its `maxmemory-policy` (`allkeys-lru`, `volatile-ttl`, ...).
        policy: String,
    },
    /// A queue's wait would exceed the longest allowed (`max_wait`, or the timeout given): refused at once,
    /// without waiting only to fail.
    #[error("rule `{rule}`: the wait would exceed {max_wait:?}; retry after {retry_after:?}")]
    QueueFull {
        /// The rule asked.
        rule: String,
        /// The longest wait allowed.
        max_wait: Duration,
        /// How long until a call would fit.
        retry_after: Duration,
    },
}

/// The kind of a store failure; also the `kind` label of `tokenlease_redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The call did not answer within the configured timeout.
    Timeout,
    /// The connection failed or dropped.
    Io,
    /// The script was missing and could not be loaded.
    NoScript,
    /// A cluster redirection or topology error.
    Cluster,
    /// The server refuses writes (`READONLY`): a master demoted to a replica by a failover. The connection is
    /// made again (behind Sentinel: to the master it names now).
    Readonly,
    /// The server is out of memory (`OOM`: `used_memory` above `maxmemory` under `noeviction`).
    Oom,
    /// Anything else (a script error, a protocol error).
    Other,
    /// The circuit breaker is open: the store was not called (never a Redis error).
    CircuitOpen,
}

impl StoreErrorKind {
    /// Every kind, in declaration order (the index of its error counter).
    pub(crate) const ALL: [Self; 7] = [
        Self::Timeout,
        Self::Io,
        Self::NoScript,
        Self::Cluster,
        Self::Readonly,
        Self::Oom,
        Self::Other,
    ];

    /// The metric label of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Io => "io",
            Self::NoScript => "noscript",
            Self::Cluster => "cluster",
            Self::Readonly => "readonly",
            Self::Oom => "oom",
            Self::Other => "other",
            Self::CircuitOpen => "circuit_open",
        }
    }
}

/// A failed store call.
#[derive(Debug, thiserror::Error)]
#[error("store call `{script}` failed ({}): {message}", kind.as_str())]
pub struct StoreError {
    /// What failed.
    pub kind: StoreErrorKind,
    /// The script that was run.
    pub script: &'static str,
    /// The store's own message.
    pub message: String,
    /// The underlying error, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A timeout after `after`.
    pub fn timeout(script: &'static str, after: Duration) -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            script,
            message: format!("no answer within {after:?}"),
            source: None,
        }
    }

    /// Whether retrying later may succeed (timeouts, connection failures, a failover under way: `READONLY`).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Timeout | StoreErrorKind::Io | StoreErrorKind::Cluster | StoreErrorKind::Readonly
        )
    }

    /// Whether the store cannot decide now (every kind but `Other`, which is one call's own failure: a script
    /// error, bad arguments, a refusal by the open circuit breaker).
    pub(crate) fn is_unavailable(&self) -> bool {
        self.kind != StoreErrorKind::Other
    }
}

/// Why a decision was made by `fail_mode` (invariant 13 of docs/ARCHITECTURE.md: only the store's own failures
/// count, never a caller's long wait for a lease in flight); the `reason` label of
/// `tokenlease_fail_mode_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailReason {
    /// The store answered with an error (connection, script, READONLY, OOM, ...).
    Error = 0,
    /// The store call did not answer within its timeout.
    Timeout = 1,
    /// The circuit breaker is open: the store was not called.
    CircuitOpen = 2,
}

impl FailReason {
    /// Every reason, in the order of their index.
    pub(crate) const ALL: [FailReason; 3] = [Self::Error, Self::Timeout, Self::CircuitOpen];

    /// The reason a store `error` gives.
    pub(crate) fn of(error: &StoreError) -> Self {
        match error.kind {
            StoreErrorKind::Timeout => Self::Timeout,
            StoreErrorKind::CircuitOpen => Self::CircuitOpen,
            _ => Self::Error,
        }
    }

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Timeout => "timeout",
            Self::CircuitOpen => "circuit_open",
        }
    }
}

/// A configuration error: where it is and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have the expected shape (unknown field, wrong type, ...).
    #[error("{}{}: {}{message}", origin(.path), at_line(*.line), quoted(.source_line))]
    Parse {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// 1-based line, when known.
        line: Option<usize>,
        /// The text of that line (which names the field), when known.
        source_line: Option<String>,
        /// toml's message.
        message: String,
    },
    /// A value is out of range.
    #[error("{}{}: {context}`{field}`: {message}", origin(.path), at_line(*.line))]
    Invalid {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// 1-based line of the table holding the value, when known.
        line: Option<usize>,
        /// `rule "sku_buy": ` or empty.
        context: String,
        /// The field's name, e.g. `lease.max_batch`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn origin(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map_or_else(|| "config".to_owned(), |p| p.display().to_string())
}

fn quoted(line: &Option<String>) -> String {
    line.as_ref().map(|l| format!("`{l}`: ")).unwrap_or_default()
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

impl From<ConfigError> for Error {
    /// Boxed: a config error is large and rare, and [`Error`] is in every decision's `Result`.
    fn from(error: ConfigError) -> Self {
        Error::Config(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::StoreErrorKind;

    #[test]
    fn every_kind_is_listed_in_declaration_order() {
        for (i, kind) in StoreErrorKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{}", kind.as_str());
        }
    }
}
