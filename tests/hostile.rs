//! Hostile input never panics: proptest over config text, keys, costs and durations. Each gives a decision or
//! a clear error.

mod common;

use std::time::Duration;

use proptest::prelude::*;
use tokenlease::{Config, Error, Limiter, Rule};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

const FIELDS: &[&str] = &[
    "capacity",
    "rate",
    "per",
    "limit",
    "window",
    "ban",
    "reset",
    "utc_offset",
    "timezone",
    "sub_buckets",
    "max_wait",
    "lease",
    "fail_mode",
    "pattern",
    "name",
    "algorithm",
    "timeout",
    "url",
];
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "18446744073709551615",
    "9007199254740993",
    "\"1s\"",
    "\"0ms\"",
    "\"1.5ms\"",
    "\"10000000d\"",
    "\"midnight\"",
    "\"+08:00\"",
    "\"+99:99\"",
    "\"Europe/Berlin\"",
    "\"../../etc/passwd\"",
    "\"\"",
    "\"{x}\"",
    "\"token_bucket\"",
    "\"leaky_bucket\"",
    "\"fixed_window\"",
    "{ min_batch = 0, max_batch = 1, ttl = \"1s\" }",
    "[1, 2]",
    "true",
    "\"ü\u{1F600}\"",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary text: an error naming a place, never a panic.
    #[test]
    fn any_text_parses_or_errs(text in ".{0,400}") {
        let _ = Config::from_toml(&text);
    }

    /// Valid rule tables with some fields replaced by hostile values: each parses or errs, and a parsed rule
    /// holds what the file said.
    #[test]
    fn hostile_rules_parse_or_err(picks in proptest::collection::vec((0..FIELDS.len(), 0..VALUES.len()), 0..4), algo in 0..5usize) {
        let valid: [&[(&str, &str)]; 5] = [
            &[("algorithm", "\"token_bucket\""), ("capacity", "10"), ("rate", "1"), ("per", "\"1s\"")],
            &[("algorithm", "\"fixed_window\""), ("limit", "10"), ("window", "\"1d\"")],
            &[("algorithm", "\"sliding_log\""), ("limit", "10"), ("window", "\"1s\"")],
            &[("algorithm", "\"sliding_window\""), ("limit", "10"), ("window", "\"1s\"")],
            &[("algorithm", "\"leaky_bucket\""), ("rate", "10"), ("per", "\"1s\"")],
        ];
        let mut fields: std::collections::BTreeMap<&str, &str> = valid[algo].iter().copied().collect();
        for (f, v) in &picks {
            fields.insert(FIELDS[*f], VALUES[*v]);
        }
        fields.insert("name", "\"r\"");
        let text = fields.iter().fold("[[rule]]\n".to_owned(), |t, (f, v)| format!("{t}{f} = {v}\n"));
        match Config::from_toml(&text) {
            Ok(config) => {
                prop_assert_eq!(config.rules.len(), 1);
                prop_assert_eq!(config.rules[0].name.as_str(), "r");
            }
            Err(e) => prop_assert!(e.to_string().starts_with("config"), "{}", e),
        }
        if picks.is_empty() {
            prop_assert!(Config::from_toml(&text).is_ok(), "the valid table must parse: {}", text);
        }
    }

    /// Keys (empty, huge, unicode, braces), costs (0 to u64::MAX) and durations (0 to huge) through the API.
    #[test]
    fn hostile_calls_decide_or_err(key in "\\PC{0,40}|\\{.*\\}", long in 0usize..3, cost in prop_oneof![Just(0u64), Just(u64::MAX), 0u64..20], secs in prop_oneof![Just(0u64), Just(u64::MAX / 2), 0u64..100_000]) {
        let rt = runtime();
        rt.block_on(async {
            let limiter = Limiter::builder()
                .rule(Rule::token_bucket("tb", 10, 1, Duration::from_secs(1)).expect("rule"))
                .rule(Rule::sliding_log("log", 10, Duration::from_secs(60)).expect("rule"))
                .build()
                .expect("limiter");
            let key = if long == 2 { key.repeat(100_000) } else { key };
            for rule in ["tb", "log", "missing"] {
                match limiter.check(rule, &key, cost).await {
                    Ok(_) => {}
                    Err(Error::InvalidArgument { .. } | Error::CostAboveCapacity { .. } | Error::UnknownRule(_)) => {}
                    Err(other) => panic!("unexpected {other}"),
                }
            }
            let period = Duration::from_secs(secs);
            let _ = limiter.is_action_allowed(&key, "act", period, cost).await;
            let _ = Rule::sliding_log("x", cost, period);
            let _ = Rule::token_bucket("x", cost, cost, period);
            let _ = Rule::leaky_bucket("x", cost, period, period);
            let _ = Rule::fixed_window("x", cost, period).and_then(|r| r.with_ban(period));
        });
    }
}

#[tokio::test]
async fn a_one_mebibyte_key_is_refused_with_its_name() {
    let limiter = Limiter::builder()
        .rule(Rule::sliding_log("log", 1, Duration::from_secs(1)).expect("rule"))
        .build()
        .expect("limiter");
    let key = "k".repeat(1 << 20);
    match limiter.check("log", &key, 1).await {
        Err(Error::InvalidArgument { name: "key", reason }) => assert!(reason.contains("1048576 bytes"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_key_bound_is_configurable() {
    let config = tokenlease::Config::from_toml(
        "[local]\nmax_key_bytes = 8\n[[rule]]\nname = \"log\"\nalgorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1s\"\n",
    )
    .expect("config");
    assert_eq!(config.process.max_key_bytes, 8);
    let limiter = Limiter::from_config(config).expect("limiter");
    assert!(limiter.check("log", "12345678", 1).await.expect("8 bytes").allowed);
    match limiter.check("log", "123456789", 1).await {
        Err(Error::InvalidArgument { name: "key", reason }) => assert!(reason.contains("more than the 8"), "{reason}"),
        other => panic!("{other:?}"),
    }
    for bad in ["0", "1048577"] {
        let err = tokenlease::Config::from_toml(&format!("[local]\nmax_key_bytes = {bad}\n")).expect_err(bad);
        assert!(err.to_string().contains("`max_key_bytes`"), "{err}");
    }
    let local = tokenlease::ProcessConfig {
        max_key_bytes: 0,
        ..Default::default()
    };
    let built = Limiter::builder().process(local).build();
    assert!(matches!(
        built,
        Err(Error::InvalidArgument {
            name: "max_key_bytes",
            ..
        })
    ));
}

/// Invariant 14: a rule name holding anything but ASCII letters, digits, `_`, `.` and `-` is refused, naming the
/// field and the character, from the API as from a config file (`tests/config.rs`).
#[tokio::test]
async fn rule_names_hold_only_letters_digits_and_three_marks() {
    for (name, found) in [("a:b", "`:`"), ("a/b", "`/`"), ("a}", "`}`"), ("a\nb", "`\\n`")] {
        match Rule::token_bucket(name, 3, 1, Duration::from_secs(1)) {
            Err(Error::InvalidArgument { name: "name", reason }) => {
                assert!(reason.contains(found), "{name:?}: {reason}")
            }
            other => panic!("{name:?} gave {other:?}"),
        }
    }
    assert!(Rule::token_bucket("Sku_buy.v2-eu", 3, 1, Duration::from_secs(1)).is_ok());
    let limiter = Limiter::builder().build().expect("limiter");
    let refused = limiter
        .is_action_allowed("u", "reply:v2", Duration::from_secs(60), 5)
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument { name: "action_key", .. })),
        "{refused:?}"
    );
    // `Rule::name` is a public field: a name set after the constructor is checked when the rule is used.
    let mut renamed = Rule::token_bucket("ok", 3, 1, Duration::from_secs(1)).expect("rule");
    renamed.name = "a:b".into();
    let refused = limiter.check_rule(&renamed, "c", 1).await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument { name: "name", .. })),
        "{refused:?}"
    );
    let built = Limiter::builder().rule(renamed).build();
    assert!(
        matches!(built, Err(Error::InvalidArgument { name: "name", .. })),
        "{built:?}"
    );
}

/// Invariant 14 on a real Redis: rules `a` and `a.b` (3 per hour each) with keys `b:c` and `c` (one key,
/// `tl:{a:b:c}`, while a rule could be named `a:b`), keys holding `:` and braces, and a rule that bans (its ban
/// key `tl:{w:b}:ban` beside the key `b}:ban` of the same rule): each pair drains a bucket of its own, admitting
/// its 3, and Redis holds exactly the pairs' keys and the two ban keys.
#[tokio::test]
async fn rules_and_keys_never_share_a_redis_key() {
    let server = common::RedisServer::start();
    let hour = Duration::from_secs(3600);
    let mut rules = ["a", "a.b"]
        .map(|name| Rule::token_bucket(name, 3, 3, hour).expect("rule"))
        .to_vec();
    rules.push(
        Rule::fixed_window("w", 3, hour)
            .and_then(|r| r.with_ban(hour))
            .expect("rule"),
    );
    let limiter = common::limiter(rules).redis(&server).build();
    let pairs = [
        ("a", "b:c"),
        ("a.b", "c"),
        ("a", "b}:c"),
        ("a.b", "{c}"),
        ("a", "{a.b:c}"),
        ("a", "b"),
        ("w", "b"),
        ("w", "b}:ban"),
    ];
    for (rule, key) in pairs {
        let mut admitted = 0;
        for _ in 0..4 {
            admitted += usize::from(limiter.check(rule, key, 1).await.expect("check").allowed);
        }
        assert_eq!(
            admitted, 3,
            "rule {rule:?}, key {key:?} shares its bucket with an earlier pair"
        );
    }
    let mut expected: Vec<String> = pairs.iter().map(|(rule, key)| limiter.store_key(rule, key)).collect();
    expected.extend(["b", "b}:ban"].map(|key| format!("{}:ban", limiter.store_key("w", key))));
    // None of these rules leases, so none has a roster (`tl:fleet:{rule}`, a key of its own, never a pair's:
    // `src/store/call.rs::roster_key`).
    expected.sort();
    let keys = server.cmd(&["KEYS", "*"]).expect("KEYS");
    let mut keys: Vec<String> = keys.lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(keys, expected, "one Redis key per (rule, key) pair and per ban");
    limiter.shutdown().await;
}
