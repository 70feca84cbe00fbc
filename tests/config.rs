//! config.toml: the shipped file is valid; each bad file gives an error naming its field and line.

use std::time::Duration;

use tokenlease::{Algorithm, Calendar, Config, FailMode};

#[test]
fn the_shipped_config_is_valid() {
    let config = Config::from_path(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).expect("config.toml");
    let redis = config.redis.as_ref().expect("[redis]");
    assert_eq!(redis.timeout, Duration::from_millis(50));
    assert_eq!(config.fail_mode, FailMode::Closed);
    assert_eq!(config.serve, tokenlease::ServeConfig::default());
    assert_eq!(
        (config.serve.header_read_timeout, config.serve.idle_timeout),
        (Duration::from_secs(10), Duration::from_secs(5))
    );
    let names: Vec<_> = config.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["sku_buy", "like", "upload", "reindex"]);
    let sku = config.rule("sku_buy").expect("sku_buy");
    assert_eq!(sku.fail_mode, Some(FailMode::Closed));
    let lease = sku.lease().expect("lease");
    assert_eq!(
        (lease.min_batch, lease.max_batch, lease.ttl),
        (10, 500, Duration::from_millis(200))
    );
    match &config.rule("upload").expect("upload").algorithm {
        Algorithm::FixedWindow {
            limit,
            window_ms,
            calendar,
            ban_ms,
        } => {
            assert_eq!(
                (*limit, *window_ms, calendar.clone(), *ban_ms),
                (100, 86_400_000, Some(Calendar::Offset { align_ms: 28_800_000 }), 0)
            );
        }
        other => panic!("upload is {other:?}"),
    }
}

/// (file, what the error must say).
const BAD: &[(&str, &[&str])] = &[
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nburst = 5\n", &["unknown field `burst`", ":7"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrate = 1\nper = \"1s\"\n", &["rule \"a\"", "`capacity`", "config:4:", "at least 1"]),
    ("\n\n[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"soon\"\n", &["per", ":8"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nlease = { min_batch = 5, max_batch = 50, ttl = \"1s\" }\n", &["`lease.max_batch`", "capacity"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nlease = { min_batch = 0, max_batch = 5, ttl = \"1s\" }\n", &["`lease.min_batch`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nlease = { min_batch = 1, max_batch = 5, ttl = \"0s\" }\n", &["`lease.ttl`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\nrate = 1\nper = \"1s\"\n", &["`capacity`", "required"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nwindow = \"1s\"\n", &["`window`", "not used by algorithm token_bucket"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"gcra\"\n", &["unknown variant `gcra`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = -3\nrate = 1\nper = \"1s\"\n", &["capacity", ":4"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1d\"\nreset = \"midnight\"\nutc_offset = \"8\"\n", &["`utc_offset`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"90m\"\nreset = \"hour\"\n", &["`window`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1d\"\nreset = \"midnight\"\ntimezone = \"Europe/Berlín\"\n", &["rule \"a\"", "`timezone`", "`Europe/Berlín` is not an IANA time zone"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1d\"\nreset = \"midnight\"\ntimezone = \"Europe/Berlin\"\nutc_offset = \"+01:00\"\n", &["`timezone`", "`utc_offset` exclude each other"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1d\"\ntimezone = \"Europe/Berlin\"\n", &["`timezone`", "needs `reset`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"sliding_log\"\nlimit = 10\nwindow = \"1d\"\ntimezone = \"UTC\"\n", &["`timezone`", "not used by algorithm sliding_log"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1s\"\n[[rule]]\nname = \"a\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`", "config:7:", "earlier rule"]),
    ("[redis]\nurl = \"http://localhost\"\n", &["[redis]", "`url`"]),
    ("# the store\n[redis]\ntimeout = \"50ms\"\nurl = \"http://localhost\"\n", &["config:4:", "[redis]", "`url`"]),
    ("[serve]\nheader_read_timeout = \"1s\"\n\nidle_timeout = \"30s\"\n", &["config:4:", "[serve]", "`idle_timeout`"]),
    ("[redis]\ntimeout = \"5ms\"\n", &["[redis]", "`url`", "is required", "cluster"]),
    ("[redis]\nurl = \"redis://a\"\ncluster = [\"redis://b:7000\"]\n", &["`url`", "together with `cluster`"]),
    ("[redis]\nurl = \"redis://a\"\nsentinel = { master_name = \"m\", nodes = [\"redis://s:26379\"] }\n", &["`url`", "together with `sentinel`"]),
    ("[redis]\ncluster = [\"redis://b:7000\"]\nsentinel = { master_name = \"m\", nodes = [\"redis://s:26379\"] }\n", &["`cluster`", "together with `sentinel`"]),
    ("[redis]\nsentinel = { master_name = \"\", nodes = [\"redis://s:26379\"] }\n", &["`sentinel.master_name`", "empty"]),
    ("[redis]\nsentinel = { master_name = \"m\", nodes = [] }\n", &["`sentinel.nodes`", "at least one"]),
    ("[redis]\nsentinel = { master_name = \"m\", nodes = [\"s:26379\"] }\n", &["`sentinel.nodes`", "`s:26379` is not a redis:// URL"]),
    ("[redis]\nsentinel = { master_name = \"m\", nodes = [\"redis://s:26379\"], quorum = 2 }\n", &["unknown field `quorum`"]),
    ("[redis]\ncluster = [\"redis://b:7000\", \"b:7001\"]\n", &["`cluster`", "`b:7001` is not a redis:// URL"]),
    ("[redis]\nurl = \"redis://127.0.0.1\"\nfail_mode = \"sometimes\"\n", &["sometimes", ":3"]),
    ("[redis]\nurl = \"redis://127.0.0.1\"\ntimeout = \"0ms\"\n", &["`timeout`"]),
    ("[redis]\nurl = \"redis://127.0.0.1\"\ntimeout = \"2m\"\n", &["`timeout`", "at most 60s"]),
    ("[redis]\nurl = \"redis://127.0.0.1\"\nkey_prefix = \"a{b\"\n", &["`key_prefix`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10000000000\nrate = 1\nper = \"1d\"\n", &["2^53"]),
    ("[[rule]]\nname = \"\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`"]),
    ("[[rule]]\nname = \"a:b\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["config:2:", "rule \"a:b\"", "`name`", "holds `:`", "`_`, `.` and `-`"]),
    ("[[rule]]\nname = \"tenant/7\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`", "holds `/`"]),
    ("[[rule]]\nname = \"a{b\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`", "holds `{`"]),
    ("[[rule]]\nname = \"sku buy\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`", "holds ` `"]),
    ("[[rule]]\nname = \"café\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n", &["`name`", "holds `é`"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 1\nwindow = \"1s\"\nsub_buckets = 7\n", &["`sub_buckets`"]),
        ("[metrics]\nlisten = \"not an address\"\n", &["listen", ":2"]),
    ("[serve]\nidle_timeout = \"30s\"\n", &["[serve]", "`idle_timeout`", "header_read_timeout"]),
    ("[serve]\nheader_read_timeout = \"0s\"\n", &["[serve]", "`header_read_timeout`"]),
    ("[serve]\nmax_connections = 0\n", &["[serve]", "`max_connections`"]),
    ("[serve]\nkeep_alive = \"5s\"\n", &["unknown field `keep_alive`", ":2"]),
    ("[serve]\nlisten = \"localhost\"\n", &["listen", "socket address", ":2"]),
    ("[serve]\nlisten = \"127.0.0.1:8080\"\ngrpc_listen = \"127.0.0.1:8080\"\n", &["[serve]", "`grpc_listen`", "differ"]),
    ("[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\nban = \"1h\"\nlease = { min_batch = 1, max_batch = 5, ttl = \"1s\" }\n", &["`ban`", "leased rule cannot ban"]),
    ("this is not toml", &["config:1"]),
];

#[test]
fn serve_holds_the_listen_addresses() {
    let config =
        Config::from_toml("[serve]\nlisten = \"0.0.0.0:9000\"\ngrpc_listen = \"[::1]:9001\"\n").expect("config");
    assert_eq!(config.serve.listen, "0.0.0.0:9000".parse().expect("addr"));
    assert_eq!(config.serve.grpc_listen, Some("[::1]:9001".parse().expect("addr")));
    let default = tokenlease::ServeConfig::default();
    assert_eq!(
        (default.listen, default.grpc_listen),
        ("127.0.0.1:8080".parse().expect("addr"), None)
    );
}

#[test]
fn each_bad_file_gives_a_clear_error() {
    for (text, expected) in BAD {
        let err = Config::from_toml(text).expect_err(text).to_string();
        for part in *expected {
            assert!(err.contains(part), "error for\n{text}\nis `{err}`, missing `{part}`");
        }
    }
}

#[test]
fn errors_from_a_file_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrate = 1\nper = \"1s\"\n",
    )
    .expect("write");
    let err = Config::from_path(&path).expect_err("invalid").to_string();
    // At the refused field's own line, not its `[[rule]]` header's.
    assert!(err.starts_with(&format!("{}:4:", path.display())), "{err}");
    let missing = Config::from_path(dir.path().join("missing.toml"))
        .expect_err("missing")
        .to_string();
    assert!(
        missing.contains("missing.toml") && missing.contains("cannot read"),
        "{missing}"
    );
}

/// `timezone` gives an IANA zone's calendar, overrides keep it; `utc_offset` still gives a fixed offset.
#[test]
fn a_timezone_gives_a_zoned_calendar() {
    let config = Config::from_toml(
        r#"
[[rule]]
name = "report"
algorithm = "fixed_window"
limit = 10
window = "1d"
reset = "midnight"
timezone = "america/new_york"

[[rule.override]]
pattern = "vip:*"
limit = 100
"#,
    )
    .expect("config");
    let rule = config.rule("report").expect("report");
    for algorithm in [&rule.algorithm, &rule.overrides[0].algorithm] {
        match algorithm {
            Algorithm::FixedWindow {
                calendar: Some(Calendar::Zone(zone)),
                ..
            } => assert_eq!(zone.name(), "America/New_York"),
            other => panic!("report is {other:?}"),
        }
    }
    let zone = tokenlease::Zone::iana("America/New_York").expect("zone");
    let api = tokenlease::Rule::calendar_window_in_zone("report", 10, Duration::from_secs(86_400), "America/New_York")
        .expect("rule");
    assert_eq!(api.algorithm, rule.algorithm);
    assert!(matches!(&api.algorithm, Algorithm::FixedWindow { calendar: Some(Calendar::Zone(z)), .. } if *z == zone));
}

#[test]
fn overrides_give_matching_keys_other_limits_but_not_another_algorithm() {
    let config = Config::from_toml(
        r#"
[[rule]]
name = "post"
algorithm = "sliding_log"
limit = 10
window = "1m"
[[rule.override]]
pattern = "vip:*"
limit = 100
[[rule.override]]
pattern = "partner:acme"
limit = 1000
window = "1s"
"#,
    )
    .expect("config");
    let rule = config.rule("post").expect("post");
    let limit = |key| rule.algorithm_for(key).capacity();
    assert_eq!(
        (limit("user:1"), limit("vip:1"), limit("partner:acme")),
        (10, 100, 1000)
    );

    let err = Config::from_toml("[[rule]]\nname = \"p\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n[[rule.override]]\npattern = \"vip:*\"\nalgorithm = \"fixed_window\"\n")
        .expect_err("an override cannot change the algorithm")
        .to_string();
    assert!(err.contains("unknown field `algorithm`"), "{err}");
    let err = Config::from_toml("[[rule]]\nname = \"p\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n[[rule.override]]\npattern = \"vip:*\"\nlimit = 0\n")
        .expect_err("limit 0")
        .to_string();
    assert!(
        err.contains("`limit`") && err.contains("override `vip:*`") && err.contains("config:8:"),
        "{err}"
    );
}

#[test]
fn a_cluster_is_a_list_of_nodes() {
    let config = Config::from_toml("[redis]\ncluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n")
        .expect("cluster config");
    let redis = config.redis.expect("[redis]");
    assert_eq!(redis.cluster, ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
    assert!(redis.url.is_empty());
}

#[test]
fn sentinel_names_the_master_and_its_sentinels() {
    let text = "[redis]\nsentinel = { master_name = \"mymaster\", nodes = [\"redis://127.0.0.1:26379\"] }\nrequire_noeviction = true\n";
    let redis = Config::from_toml(text)
        .expect("sentinel config")
        .redis
        .expect("[redis]");
    let sentinel = redis.sentinel.expect("sentinel");
    assert_eq!(sentinel.master_name, "mymaster");
    assert_eq!(sentinel.nodes, ["redis://127.0.0.1:26379"]);
    assert!(redis.url.is_empty() && redis.cluster.is_empty() && redis.require_noeviction);
}

#[test]
fn process_settings_are_read_under_their_name_and_their_old_one() {
    for section in ["process", "local"] {
        let text = format!("[{section}]\nmax_key_bytes = 64\nmax_local_keys = 7\nidle_ttl = \"2s\"\n");
        let config = Config::from_toml(&text).expect(section);
        assert_eq!(config.process.max_key_bytes, 64, "[{section}]");
        assert_eq!(config.process.max_local_keys, 7, "[{section}]");
        assert_eq!(
            config.process.idle_ttl,
            std::time::Duration::from_secs(2),
            "[{section}]"
        );
    }
    let err = Config::from_toml("[process]\nmax_local_keys = 0\n")
        .expect_err("zero keys")
        .to_string();
    assert!(err.contains("[process] `max_local_keys`"), "{err}");
}

#[test]
fn an_error_far_down_a_large_file_names_its_line() {
    // 5 000 rules of 6 lines, then one whose name is taken: its `name` is on line 30 002.
    let rule = |name: &str| {
        format!("[[rule]]\nname = \"{name}\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n\n")
    };
    let mut text: String = (0..5_000).map(|i| rule(&format!("r{i}"))).collect();
    text.push_str(&rule("r17"));
    let err = Config::from_toml(&text).expect_err("duplicate").to_string();
    assert!(err.contains(":30002:") && err.contains("earlier rule"), "{err}");
    // A syntax error there too.
    text.push_str("limit = \n");
    let err = Config::from_toml(&text).expect_err("syntax").to_string();
    assert!(err.contains(":30007"), "{err}");
}

/// A config written when `local` sold on credit still loads, with the stricter meaning (it decides as `closed`),
/// and `closed` is what a config that says nothing gets.
#[test]
fn fail_mode_local_still_loads_and_closed_is_the_default() {
    let local = Config::from_toml("[redis]\nurl = \"redis://127.0.0.1:6379\"\nfail_mode = \"local\"\n").expect("local");
    assert_eq!(local.fail_mode, FailMode::Local);
    let unsaid = Config::from_toml("[redis]\nurl = \"redis://127.0.0.1:6379\"\n").expect("unsaid");
    assert_eq!(unsaid.fail_mode, FailMode::Closed);
}
