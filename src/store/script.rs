//! The scripts of `lua/`: their names (the `script` metric label), their source, loaded once per server
//! (`redis.rs`) and mirrored by the in-process store (`memory.rs`), and the one place where a [`Call`] becomes its
//! script's `KEYS` and `ARGV` (as redis-rs's `ScriptInvocation` builds an invocation).
//!
//! One source: a script's own part is `lua/src/NAME.lua`, what the scripts share is `lua/lib/`. Each is assembled
//! here at build time, and the same text is written to `lua/NAME.lua` for services in other languages, which load
//! it as it is (`EVAL`, `SCRIPT LOAD`: the same SHA as this crate's). A test fails when those files are stale.

use super::call::{Call, Op};
use crate::algorithm::room::Lent;
use crate::algorithm::{ms, TokenBucket};
use crate::rule::Calendar;

/// The line a standalone script of `lua/` opens with.
macro_rules! generated {
    ($name:literal, $libs:literal) => {
        concat!(
            "-- lua/",
            $name,
            ".lua: GENERATED from ",
            $libs,
            " and lua/src/",
            $name,
            ".lua,\n-- whose header (below the libraries) describes KEYS, ARGV and the reply. Edit those files, then run\n",
            "-- `TOKENLEASE_WRITE_LUA=1 cargo test --lib lua_files`. Load this file as it is (EVAL or SCRIPT LOAD).\n"
        )
    };
}

/// `lua/src/NAME.lua` after `lua/lib/common.lua`.
macro_rules! script {
    ($name:literal) => {
        concat!(
            generated!($name, "lua/lib/common.lua"),
            include_str!("../../lua/lib/common.lua"),
            include_str!(concat!("../../lua/src/", $name, ".lua"))
        )
    };
}

/// A token script, `lua/src/NAME.lua`, after `lua/lib/common.lua` and `lua/lib/bucket.lua`.
macro_rules! bucket_script {
    ($name:literal) => {
        concat!(
            generated!($name, "lua/lib/common.lua, lua/lib/bucket.lua"),
            include_str!("../../lua/lib/common.lua"),
            include_str!("../../lua/lib/bucket.lua"),
            include_str!(concat!("../../lua/src/", $name, ".lua"))
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

    /// The script's source text, as `lua/NAME.lua` holds it: a line saying so, `lua/lib/common.lua` (the integer
    /// helpers and the clock), for a token script `lua/lib/bucket.lua` (the bucket's hash), then
    /// `lua/src/NAME.lua`. Redis runs each script on its own, so what they share is put in front of each rather
    /// than loaded once.
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

/// How a call becomes its script's `KEYS` and `ARGV` (the in-process store matches on [`Op`] instead).
impl Call {
    /// The script this call runs.
    pub(crate) fn script(&self) -> Script {
        match self.op {
            Op::TokenBucket { .. } => Script::TokenBucket,
            Op::TokenLease { .. } => Script::TokenLease,
            Op::TokenReturn { .. } => Script::TokenReturn,
            Op::TokenAcquire { .. } => Script::TokenAcquire,
            Op::SlidingLog { .. } => Script::SlidingLog,
            Op::FixedWindow { .. } => Script::FixedWindow,
            Op::SlidingWindow { .. } => Script::SlidingWindow,
            Op::LeakyBucket { .. } => Script::LeakyBucket,
            Op::LeakyReturn { .. } => Script::LeakyReturn,
            Op::Reset => Script::Reset,
            Op::Fleet(_) => Script::Fleet,
        }
    }

    /// `KEYS`, in the script's order: the decided key, and the ban key for the scripts that ban (a give-back's
    /// mark for a marked give-back).
    pub(crate) fn keys(&self) -> Vec<String> {
        if let Op::TokenReturn { id: Some(id), .. } = &self.op {
            return vec![self.key.clone(), self.mark_key(id)];
        }
        let banned = match &self.op {
            Op::TokenBucket { ban_ms, .. } => *ban_ms > 0,
            Op::SlidingLog { .. } | Op::FixedWindow { .. } | Op::SlidingWindow { .. } | Op::Reset => true,
            Op::TokenReturn { .. }
            | Op::TokenLease { .. }
            | Op::TokenAcquire { .. }
            | Op::LeakyBucket { .. }
            | Op::LeakyReturn { .. }
            | Op::Fleet(_) => false,
        };
        if banned {
            vec![self.key.clone(), self.ban_key()]
        } else {
            vec![self.key.clone()]
        }
    }

    /// `ARGV`, in the script's order (see each script's header), with the trailing `now_ms` when set; a token
    /// call adopted at some instant then has `now_ms` (empty when unset: the server's TIME) and `adopted_ms`.
    pub(crate) fn args(&self) -> Vec<Arg<'_>> {
        let bucket = |b: &TokenBucket| [int(b.capacity), int(b.rate), int(b.per_ms)];
        let mut args: Vec<Arg<'_>> = match &self.op {
            Op::TokenBucket {
                bucket: b,
                min,
                max,
                ban_ms,
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*min), int(*max)]);
                if *ban_ms > 0 {
                    v.push(int(*ban_ms));
                }
                v
            }
            Op::TokenLease {
                bucket: b,
                min,
                max,
                batch,
                pace,
                ..
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*min), int(*max), int(*batch), int(pace.chunk), int(pace.chunk_ms)]);
                v
            }
            Op::TokenReturn {
                bucket: b,
                tokens,
                id,
                mark_ms,
                lent,
            } => {
                let mut v = bucket(b).to_vec();
                v.push(int(*tokens));
                if id.is_some() {
                    v.push(int(*mark_ms));
                    v.push(if lent.is_empty() { Arg::Int(-1) } else { Arg::Lent(lent) });
                }
                v
            }
            Op::TokenAcquire {
                bucket: b,
                cost,
                max_wait_ms,
            } => {
                let mut v = bucket(b).to_vec();
                v.extend([int(*cost), int(*max_wait_ms)]);
                v
            }
            Op::SlidingLog {
                window_ms,
                limit,
                cost,
                member,
                ban_ms,
            } => vec![int(*window_ms), int(*limit), int(*cost), Arg::Str(member), int(*ban_ms)],
            Op::FixedWindow {
                window_ms,
                limit,
                cost,
                ban_ms,
                calendar,
            } => {
                let mut v = vec![int(*window_ms), int(*limit), int(*cost), int(*ban_ms)];
                match calendar {
                    None => v.push(Arg::Int(-1)),
                    Some(Calendar::Offset { align_ms }) => v.push(int(*align_ms)),
                    Some(Calendar::Zone(zone)) => {
                        v.push(Arg::Int(-2));
                        v.extend(self.zone_bounds(zone, *window_ms).map(Arg::Int));
                    }
                }
                v
            }
            Op::SlidingWindow {
                window_ms,
                sub_buckets,
                limit,
                cost,
                ban_ms,
            } => vec![
                int(*window_ms),
                int(*sub_buckets),
                int(*limit),
                int(*cost),
                int(*ban_ms),
            ],
            Op::LeakyBucket {
                queue,
                cost,
                max_wait_ms,
                member,
            } => vec![
                int(queue.rate),
                int(queue.per_ms),
                int(*cost),
                int(*max_wait_ms),
                Arg::Str(member),
            ],
            Op::LeakyReturn { queue, cost, member } => {
                vec![int(queue.rate), int(queue.per_ms), int(*cost), Arg::Str(member)]
            }
            Op::Reset => Vec::new(),
            Op::Fleet(beat) => vec![
                Arg::Str(&beat.member),
                int(beat.live_ms),
                int(beat.keep_ms),
                Arg::Int(i64::from(beat.leave)),
            ],
        };
        let token = matches!(
            self.op,
            Op::TokenBucket { .. } | Op::TokenLease { .. } | Op::TokenReturn { .. } | Op::TokenAcquire { .. }
        );
        let hold = match &self.op {
            Op::TokenLease { hold: Some(h), .. } => Some(h),
            _ => None,
        };
        // Optional arguments in order: now_ms, adopted_ms, then a lease's hold (each earlier one given, empty for
        // the store's TIME).
        let adopted = token && (self.adopted_ms > 0 || hold.is_some());
        match self.now_ms {
            Some(now) => args.push(int(now)),
            None if adopted => args.push(Arg::Str("")),
            None => {}
        }
        if adopted {
            args.push(int(self.adopted_ms));
        }
        if let Some(h) = hold {
            args.extend([
                Arg::Str(&h.holder),
                int(h.seq),
                int(h.held),
                int(h.want),
                int(h.hold_ms),
            ]);
        }
        args
    }

    /// The windows of `zone` around this process's clock (or the call's `now_ms`) and its neighbours: the
    /// script picks the one holding the Redis server's TIME (invariant 6).
    fn zone_bounds(&self, zone: &crate::rule::Zone, window_ms: u64) -> [i64; 4] {
        let now = self.now_ms.map_or_else(crate::rule::wall_clock_ms, ms);
        zone.bounds(window_ms, now)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::Script;

    /// `lua/`: the standalone scripts other languages load, `lib/` and `src/`.
    fn lua() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lua")
    }

    /// Every `lua/NAME.lua` is the script this crate runs, to the byte; with `TOKENLEASE_WRITE_LUA=1` the test
    /// writes them instead (after an edit of `lua/src/` or `lua/lib/`).
    #[test]
    fn lua_files_are_the_scripts_this_crate_runs() {
        let write = std::env::var_os("TOKENLEASE_WRITE_LUA").is_some_and(|v| v == "1");
        let mut stale = Vec::new();
        for script in Script::ALL {
            let path = lua().join(format!("{}.lua", script.name()));
            if write {
                std::fs::write(&path, script.source()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(script.source()) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "stale or missing: {stale:?}; run `TOKENLEASE_WRITE_LUA=1 cargo test --lib lua_files` and commit them"
        );
        // Nothing else in lua/ but the scripts, lib/ and src/.
        let mut names: Vec<String> = std::fs::read_dir(lua())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let mut expected: Vec<String> = Script::ALL.iter().map(|s| format!("{}.lua", s.name())).collect();
        expected.extend(["lib".to_string(), "src".to_string()]);
        expected.sort();
        assert_eq!(names, expected, "lua/ holds the generated scripts, lib/ and src/ only");
    }

    use super::{Arg, Call};
    use crate::algorithm::room::Lent;
    use crate::algorithm::{LeakyBucket, TokenBucket};
    use crate::store::call::store_key;

    /// A leased bucket's check is its cold key's take: no ban key and no ban, even when the rule's public fields
    /// carry a ban (`Rule::with_ban` refuses one on a leased rule, a struct literal does not).
    #[test]
    fn a_leased_buckets_check_never_bans() {
        let bucket = TokenBucket {
            capacity: 10,
            rate: 1,
            per_ms: 1_000,
        };
        let lease = crate::rule::Lease {
            min_batch: 1,
            max_batch: 5,
            ttl: std::time::Duration::from_millis(200),
            hot_after: None,
            reserve: None,
        };
        let members = crate::store::call::Members::named("m".into());
        let leased = crate::rule::Algorithm::TokenBucket {
            bucket,
            lease: Some(lease),
            ban_ms: 60_000,
        };
        let call = Call::check(&leased, "tl:{r:k}", 1, &members);
        assert_eq!(call.keys(), ["tl:{r:k}"]);
        assert_eq!(call.args(), [10, 1, 1_000, 1, 1].map(Arg::Int));
        let unleased = crate::rule::Algorithm::TokenBucket {
            bucket,
            lease: None,
            ban_ms: 60_000,
        };
        assert_eq!(
            Call::check(&unleased, "tl:{r:k}", 1, &members).keys(),
            ["tl:{r:k}", "tl:{r:k}:ban"]
        );
    }

    /// `KEYS` and `ARGV` of each call, as the scripts' headers give them.
    #[test]
    fn keys_and_argv_follow_the_script_headers() {
        let b = TokenBucket {
            capacity: 10,
            rate: 1,
            per_ms: 1_000,
        };
        let take = Call::take("tl:{r:k}", b, 2, 5).at(7);
        assert_eq!(take.keys(), ["tl:{r:k}"]);
        let ints = [10, 1, 1_000, 2, 5, 7].map(Arg::Int);
        assert_eq!(take.args(), ints);
        let banned = Call::take_or_ban("tl:{r:k}", b, 1, 60_000);
        assert_eq!(banned.keys(), ["tl:{r:k}", "tl:{r:k}:ban"]);
        assert_eq!(banned.args(), [10, 1, 1_000, 1, 1, 60_000].map(Arg::Int));
        let log = Call::sliding_log("tl:{l:u}", (60_000, 5), 1, 0, "m-1");
        assert_eq!(
            log.args(),
            [Arg::Int(60_000), Arg::Int(5), Arg::Int(1), Arg::Str("m-1"), Arg::Int(0)]
        );
        let rolling = Call::fixed_window("tl:{f:u}", (1_000, 3), 1, 0, None);
        assert_eq!(rolling.args().last(), Some(&Arg::Int(-1)));
        let queue = LeakyBucket { rate: 5, per_ms: 1_000 };
        let reserve = Call::reserve("tl:{q:j}", queue, 1, 30_000, "m-2");
        assert_eq!(
            reserve.args(),
            [
                Arg::Int(5),
                Arg::Int(1_000),
                Arg::Int(1),
                Arg::Int(30_000),
                Arg::Str("m-2")
            ]
        );
        let release = Call::release("tl:{q:j}", queue, 1, "m-2");
        assert_eq!(release.args()[3], Arg::Str("m-2"));
        assert_eq!(Call::give_back("tl:{r:k}", b, 3).args()[3], Arg::Int(3));
        let mark = std::time::Duration::from_secs(12);
        let once = Call::give_back("tl:{r:k}", b, 3).once("p.1-8", mark);
        assert_eq!(once.keys(), ["tl:{r:k}", "tl:{r:k}:return:p.1-8"]);
        assert_eq!(
            once.args(),
            [10, 1, 1_000, 3, 12_000, -1].map(Arg::Int),
            "the mark kept 12 s; no lease's stamp"
        );
        let lent =
            [(1_700_000_000_000_007, 2), (1_700_000_000_001_000, 1)].map(|(stamp, tokens)| Lent { stamp, tokens });
        let since = Call::give_back("tl:{r:k}", b, 0)
            .once("p.1-8", mark)
            .since(lent.to_vec());
        assert_eq!(since.args()[3], Arg::Int(3), "the tokens of the leases named");
        assert_eq!(since.args()[5], Arg::Lent(&lent));
        assert_eq!(Lent::encode(&lent), "1700000000000007:2,1700000000001000:1");
        assert_eq!(store_key("tl", "sku_buy", "sku:42"), "tl:{sku_buy:sku:42}");
    }
}
