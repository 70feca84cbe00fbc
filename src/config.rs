//! `config.toml`: parsed with serde + toml, durations with humantime, unknown fields refused, every invalid value
//! reported with its file, line and field (the README, "Configuration").

mod serve;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

mod lines;
mod redact;
mod redis;
mod rls;
mod tls;
mod window;

use self::lines::{field_line, LineStarts, Place};
pub(crate) use self::redact::redact_text;
pub use self::redact::redact_url;
pub(crate) use self::redis::{
    check_expected_processes, check_key_prefix, DEFAULT_EXPECTED_PROCESSES, DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT,
};
pub use self::redis::{RedisConfig, SentinelConfig};
pub use self::rls::{rls_match, RlsRoute};
use self::window::Reset;
use crate::error::ConfigError;
use crate::rule::{
    self, check_name, check_sub_buckets, positive, whole_ms, Algorithm, FailMode, FieldError, Lease, Rule,
};

pub use serve::ServeConfig;

/// The whole configuration, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The Redis store; `None` uses the in-process store.
    pub redis: Option<RedisConfig>,
    /// Where the binary serves `/metrics`.
    pub metrics: Option<MetricsConfig>,
    /// Settings of this process (`[process]`; `[local]` is still read as its old name).
    pub process: ProcessConfig,
    /// The sidecar's bounds on connections (`[serve]`).
    pub serve: ServeConfig,
    /// The rules, in file order, names unique.
    pub rules: Vec<Rule>,
    /// The rules' `[rule.rls]` routes for Envoy's Rate Limit Service, in file order.
    pub rls: Vec<RlsRoute>,
    /// The limiter-wide fail mode (from `[redis] fail_mode`, default `closed`).
    pub fail_mode: FailMode,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` the Prometheus exporter listens on.
    pub listen: std::net::SocketAddr,
}

/// `[process]` (formerly `[local]`, still accepted): settings of this process: the keys it accepts, and how
/// many keys hold leased tokens and for how long when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// Keys longer than this many bytes are refused with [`crate::Error::InvalidArgument`] (1 to 1 MiB;
    /// default 512).
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
    /// Keys holding leased tokens at most; the idlest are evicted (their tokens given back) beyond it.
    #[serde(default = "default_max_local_keys")]
    pub max_local_keys: usize,
    /// A leased key untouched this long is evicted (its tokens are given back first).
    #[serde(default = "default_idle_ttl", with = "humantime_serde")]
    pub idle_ttl: Duration,
    /// Keys whose last refusal by the store this process remembers, over all rules: such a key is refused
    /// locally until the refusal's `retry_after` (invariant 4). The oldest are evicted beyond it (S3-FIFO);
    /// 0 remembers none. Default 100 000 (about 100 bytes each, plus the key).
    #[serde(default = "default_max_refused_keys")]
    pub max_refused_keys: usize,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            max_key_bytes: default_max_key_bytes(),
            max_local_keys: default_max_local_keys(),
            idle_ttl: default_idle_ttl(),
            max_refused_keys: default_max_refused_keys(),
        }
    }
}

/// The largest `max_key_bytes` allowed.
const MAX_KEY_BYTES_LIMIT: usize = 1 << 20;

fn default_max_key_bytes() -> usize {
    512
}
fn default_max_local_keys() -> usize {
    100_000
}
fn default_max_refused_keys() -> usize {
    100_000
}
fn default_idle_ttl() -> Duration {
    Duration::from_secs(60)
}

impl ProcessConfig {
    /// Checks the settings: one check for the config file and for [`crate::LimiterBuilder::process`].
    ///
    /// # Errors
    /// The field out of range and why.
    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        if !(1..=MAX_KEY_BYTES_LIMIT).contains(&self.max_key_bytes) {
            let why = format!("must be between 1 and {MAX_KEY_BYTES_LIMIT} (1 MiB)");
            return Err(("max_key_bytes", why));
        }
        positive(u64::try_from(self.max_local_keys).unwrap_or(u64::MAX), "max_local_keys")?;
        if self.idle_ttl.is_zero() {
            return Err(("idle_ttl", "must be longer than zero".into()));
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<Spanned<RedisConfig>>,
    metrics: Option<MetricsConfig>,
    #[serde(default, alias = "local")]
    process: ProcessConfig,
    #[serde(default)]
    serve: ServeConfig,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum AlgorithmName {
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    LeakyBucket,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    #[serde(default = "one")]
    min_batch: u64,
    max_batch: u64,
    #[serde(with = "humantime_serde")]
    ttl: Duration,
    #[serde(default)]
    hot_after: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    reserve: Option<Duration>,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    algorithm: AlgorithmName,
    capacity: Option<u64>,
    rate: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    per: Option<Duration>,
    lease: Option<RawLease>,
    limit: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    window: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    ban: Option<Duration>,
    reset: Option<Reset>,
    utc_offset: Option<String>,
    timezone: Option<String>,
    sub_buckets: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    max_wait: Option<Duration>,
    fail_mode: Option<FailMode>,
    #[serde(default)]
    shadow: bool,
    #[serde(default, rename = "override")]
    overrides: Vec<RawOverride>,
    rls: Option<rls::RawRls>,
}

/// `[[rule.override]]`: other limits for keys matching `pattern`; the algorithm stays the rule's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    pattern: String,
    capacity: Option<u64>,
    rate: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    per: Option<Duration>,
    lease: Option<RawLease>,
    limit: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    window: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    ban: Option<Duration>,
    sub_buckets: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    max_wait: Option<Duration>,
}

impl RawOverride {
    /// The rule's fields with this override's on top.
    fn merged(&self, base: &RawRule) -> RawRule {
        let mut r = base.clone();
        r.overrides = Vec::new();
        macro_rules! take {
            ($($f:ident),*) => { $( if self.$f.is_some() { r.$f = self.$f.clone(); } )* };
        }
        take!(capacity, rate, per, lease, limit, window, ban, sub_buckets, max_wait);
        r
    }
}

impl Config {
    /// Reads and validates a config file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, line and field of the first problem.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, Some(path))
    }

    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the line and field of the first problem.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, None)
    }

    /// A configuration with no Redis (the in-process store) and these rules.
    pub fn in_memory(rules: Vec<Rule>) -> Self {
        Self {
            redis: None,
            metrics: None,
            process: ProcessConfig::default(),
            serve: ServeConfig::default(),
            rules,
            rls: Vec::new(),
            fail_mode: FailMode::default(),
        }
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }

    fn parse(text: &str, path: Option<&Path>) -> Result<Self, ConfigError> {
        let lines = LineStarts::new(text);
        let line_of = |offset: usize| Some(lines.line_of(offset));
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().and_then(|s| line_of(s.start));
            let source_line = line
                .and_then(|l| text.lines().nth(l - 1))
                .map(|l| redact_text(&l.trim().chars().take(120).collect::<String>()))
                .filter(|l| !l.is_empty() && !l.starts_with('['));
            ConfigError::Parse {
                path: path.map(Path::to_owned),
                line,
                source_line,
                message: redact_text(e.message().trim()),
            }
        })?;
        // A refused field is shown at its own line, else at its table's (`line`: the header's).
        let invalid = |(place, line): (Place, Option<usize>), context: String, field: &str, message: String| {
            ConfigError::Invalid {
                path: path.map(Path::to_owned),
                line: field_line(text, &lines, place, field).or(line),
                context,
                field: field.to_owned(),
                message,
            }
        };

        let mut fail_mode = FailMode::default();
        let redis = match raw.redis {
            None => None,
            Some(spanned) => {
                let line = line_of(spanned.span().start);
                let r = spanned.into_inner();
                let at = (Place::Table(&["redis"]), line);
                r.validate()
                    .map_err(|(field, why)| invalid(at, "[redis] ".into(), field, why))?;
                fail_mode = r.fail_mode;
                Some(r)
            }
        };
        raw.process.validate().map_err(|(field, why)| {
            invalid(
                (Place::Table(&["process", "local"]), None),
                "[process] ".into(),
                field,
                why,
            )
        })?;
        raw.serve
            .validate()
            .map_err(|(field, why)| invalid((Place::Table(&["serve"]), None), "[serve] ".into(), field, why))?;

        let mut rules: Vec<Rule> = Vec::with_capacity(raw.rule.len());
        let mut names: HashSet<String> = HashSet::with_capacity(raw.rule.len());
        let mut routes = Vec::new();
        for (n, spanned) in raw.rule.into_iter().enumerate() {
            // The rule's `[[rule]]` header.
            let line = (Place::Rule(n), line_of(spanned.span().start));
            let mut raw_rule = spanned.into_inner();
            let ctx = format!("rule \"{}\": ", raw_rule.name);
            if !names.insert(raw_rule.name.clone()) {
                return Err(invalid(line, ctx, "name", "is used by an earlier rule".into()));
            }
            if let Some(rls) = raw_rule.rls.take() {
                let route = rls.route(&raw_rule.name);
                routes.push(route.map_err(|(field, message)| invalid(line, ctx.clone(), field, message))?);
            }
            let rule = build_rule(raw_rule).map_err(|((field, message), within)| {
                let place = within.map_or(Place::Rule(n), |i| Place::Override(n, i));
                invalid((place, line.1), ctx, field, message)
            })?;
            rules.push(rule);
        }
        Ok(Self {
            redis,
            metrics: raw.metrics,
            process: raw.process,
            serve: raw.serve,
            rules,
            rls: routes,
            fail_mode,
        })
    }
}

fn required<T>(v: Option<T>, field: &'static str, algorithm: &str) -> Result<T, FieldError> {
    v.ok_or_else(|| (field, format!("is required by algorithm {algorithm}")))
}

/// The rule `r` with its overrides.
///
/// # Errors
/// The field refused and why, with the index of the `[[rule.override]]` it is in (`None`: the rule's own).
fn build_rule(r: RawRule) -> Result<Rule, (FieldError, Option<usize>)> {
    let overrides = r.overrides.clone();
    let mut rule = build_base(r.clone()).map_err(|e| (e, None))?;
    for (i, o) in overrides.iter().enumerate() {
        let in_override =
            |(field, message): FieldError| ((field, format!("in override `{}`: {message}", o.pattern)), Some(i));
        let limits = build_base(o.merged(&r)).map_err(in_override)?;
        rule = rule.with_override(o.pattern.clone(), limits).map_err(|e| match e {
            crate::Error::InvalidArgument { name, reason } => ((name, reason), Some(i)),
            other => (("override", other.to_string()), Some(i)),
        })?;
    }
    Ok(rule)
}

fn build_base(r: RawRule) -> Result<Rule, FieldError> {
    let name = r.algorithm;
    let algo = match name {
        AlgorithmName::TokenBucket => "token_bucket",
        AlgorithmName::FixedWindow => "fixed_window",
        AlgorithmName::SlidingLog => "sliding_log",
        AlgorithmName::SlidingWindow => "sliding_window",
        AlgorithmName::LeakyBucket => "leaky_bucket",
    };
    check_name(&r.name, "name")?;
    // Fields that belong to other algorithms are errors, not silently ignored.
    let allowed: &[&str] = match name {
        AlgorithmName::TokenBucket => &["capacity", "rate", "per", "lease", "ban"],
        AlgorithmName::FixedWindow => &["limit", "window", "ban", "reset", "utc_offset", "timezone"],
        AlgorithmName::SlidingLog => &["limit", "window", "ban"],
        AlgorithmName::SlidingWindow => &["limit", "window", "ban", "sub_buckets"],
        AlgorithmName::LeakyBucket => &["rate", "per", "max_wait"],
    };
    let present = [
        ("capacity", r.capacity.is_some()),
        ("rate", r.rate.is_some()),
        ("per", r.per.is_some()),
        ("lease", r.lease.is_some()),
        ("limit", r.limit.is_some()),
        ("window", r.window.is_some()),
        ("ban", r.ban.is_some()),
        ("reset", r.reset.is_some()),
        ("utc_offset", r.utc_offset.is_some()),
        ("timezone", r.timezone.is_some()),
        ("sub_buckets", r.sub_buckets.is_some()),
        ("max_wait", r.max_wait.is_some()),
    ];
    if let Some((field, _)) = present.iter().find(|(f, p)| *p && !allowed.contains(f)) {
        return Err((field, format!("is not used by algorithm {algo}")));
    }
    let ban_ms = match r.ban {
        None => 0,
        Some(d) => whole_ms(d, "ban")?,
    };

    let algorithm = match name {
        AlgorithmName::TokenBucket => {
            let capacity = required(r.capacity, "capacity", algo)?;
            let rate = required(r.rate, "rate", algo)?;
            let per = required(r.per, "per", algo)?;
            let bucket = rule::token_bucket_params(capacity, rate, per)?;
            let lease = match r.lease {
                None => None,
                Some(l) => {
                    let lease = Lease {
                        min_batch: l.min_batch,
                        max_batch: l.max_batch,
                        ttl: l.ttl,
                        hot_after: l.hot_after,
                        reserve: l.reserve,
                    };
                    rule::validate_lease(&lease, capacity)?;
                    Some(lease)
                }
            };
            if lease.is_some() && ban_ms > 0 {
                return Err(("ban", rule::NO_BAN_WITH_LEASE.into()));
            }
            Algorithm::TokenBucket { bucket, lease, ban_ms }
        }
        AlgorithmName::FixedWindow => {
            let limit = positive(required(r.limit, "limit", algo)?, "limit")?;
            let window_ms = whole_ms(required(r.window, "window", algo)?, "window")?;
            let calendar = window::calendar(window_ms, r.reset, r.utc_offset.as_deref(), r.timezone.as_deref())?;
            Algorithm::FixedWindow {
                limit,
                window_ms,
                calendar,
                ban_ms,
            }
        }
        AlgorithmName::SlidingLog => Algorithm::SlidingLog {
            limit: positive(required(r.limit, "limit", algo)?, "limit")?,
            window_ms: whole_ms(required(r.window, "window", algo)?, "window")?,
            ban_ms,
        },
        AlgorithmName::SlidingWindow => {
            let window_ms = whole_ms(required(r.window, "window", algo)?, "window")?;
            let sub_buckets = positive(r.sub_buckets.unwrap_or(10), "sub_buckets")?;
            check_sub_buckets(window_ms, sub_buckets)?;
            Algorithm::SlidingWindow {
                limit: positive(required(r.limit, "limit", algo)?, "limit")?,
                window_ms,
                sub_buckets,
                ban_ms,
            }
        }
        AlgorithmName::LeakyBucket => {
            let per = required(r.per, "per", algo)?;
            let (rate, per_ms, max_wait_ms) = rule::leaky_params(
                required(r.rate, "rate", algo)?,
                per,
                r.max_wait.unwrap_or(Duration::ZERO),
            )?;
            Algorithm::LeakyBucket {
                rate,
                per_ms,
                max_wait_ms,
            }
        }
    };
    Ok(Rule {
        name: r.name,
        algorithm,
        fail_mode: r.fail_mode,
        overrides: Vec::new(),
        shadow: r.shadow,
    })
}
