//! The scripts of `lua/`: their names (the `script` metric label) and their source, loaded once per server
//! (`redis.rs`) and mirrored by the in-process store (`memory.rs`).
//!
//! One source: a script's own part is `lua/src/NAME.lua`, what the scripts share is `lua/lib/`. Each is assembled
//! here at build time, and the same text is written to `lua/NAME.lua` for services in other languages, which load
//! it as it is (`EVAL`, `SCRIPT LOAD`: the same SHA as this crate's). A test fails when those files are stale.

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
}
