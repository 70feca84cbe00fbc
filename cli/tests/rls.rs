//! `tokenlease serve --grpc-listen` answers Envoy's Rate Limit Service (RLS v3; issue 13, item 1) to a real client
//! of another ecosystem: Python grpcio with the Envoy API stubs the gRPC authors publish (cli/tests/rls_client.py,
//! installed into a venv by scripts/rls-client.sh), against the real binary on the in-process store and on a real
//! redis-server with a leased rule.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};
use serve::Serve;

/// The venv's python with grpcio and Envoy's stubs, installed once per test binary (tests run in parallel).
fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let installed = PYTHON.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/rls-client.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run scripts/rls-client.sh: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout.lines().last() {
            Some(path) if out.status.success() => Ok(PathBuf::from(root).join(path.trim())),
            _ => Err(format!(
                "scripts/rls-client.sh could not install the Python gRPC client (python3, python3-venv, grpcio, \
                 xds-protos; see tests/rls_requirements.txt): {}\n{stdout}",
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    });
    match installed {
        Ok(path) => path.clone(),
        Err(why) => panic!("the RLS test needs its Python client and it is not there: {why}"),
    }
}

/// A `tokenlease serve --grpc-listen` process on free loopback ports, SIGKILLed on drop.
struct Rls {
    serve: Serve,
    http: u16,
    grpc: u16,
}

impl Rls {
    fn start(config: &str) -> Self {
        let (http, grpc) = (common::free_port(), common::free_port());
        let serve = Serve::spawn(config, &[], |c| {
            c.args(["--listen", &format!("127.0.0.1:{http}")]);
            c.args(["--grpc-listen", &format!("127.0.0.1:{grpc}")]);
        });
        let serve = serve.wait_up(|_| {
            get(http, "/livez").is_some_and(|answer| answer.starts_with("HTTP/1.1 200"))
                && TcpStream::connect(("127.0.0.1", grpc)).is_ok()
        });
        Self { serve, http, grpc }
    }

    /// The whole answer (status line, headers, body) to `GET path` on the HTTP port.
    fn get(&self, path: &str) -> Option<String> {
        get(self.http, path)
    }

    /// Sends `requests` (see cli/tests/rls_client.py) one after the other with the Python client; its answers.
    fn ask(&self, requests: &Value) -> Vec<Value> {
        let mut client = Command::new(python())
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rls_client.py"))
            .arg(format!("127.0.0.1:{}", self.grpc))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the Python client");
        let mut stdin = client.stdin.take().expect("stdin");
        stdin
            .write_all(requests.to_string().as_bytes())
            .expect("write requests");
        drop(stdin);
        let out = client.wait_with_output().expect("the Python client");
        assert!(
            out.status.success(),
            "the Python client failed: {}\nserver: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(
            answers.len(),
            requests.as_array().map_or(0, Vec::len),
            "one answer per request"
        );
        answers
    }

    /// One request, its answer.
    fn ask_one(&self, request: Value) -> Value {
        self.ask(&json!([request])).remove(0)
    }

    /// Writes `config` over the file and reloads it (SIGHUP); waits until the sidecar says it reloaded.
    fn reload(&self, config: &str) {
        std::fs::write(self.serve.config(), config).expect("write config");
        let reloads = self.log().matches("tokenlease serve: reloaded").count();
        self.serve.signal("-HUP");
        let done = common::wait_for(Duration::from_secs(20), || {
            (self.log().matches("tokenlease serve: reloaded").count() > reloads).then_some(())
        });
        assert!(done.is_some(), "no reload: {}", self.log());
    }

    fn log(&self) -> String {
        self.serve.log()
    }
}

/// The whole answer (status line, headers, body) to `GET path` on `port`.
fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// A request of one descriptor with these entries.
fn one(domain: &str, entries: &[(&str, &str)], hits_addend: u32) -> Value {
    json!({"domain": domain, "hits_addend": hits_addend, "descriptors": [{"entries": entries}]})
}

fn checkout(ip: &str) -> Value {
    one("shop", &[("generic_key", "checkout"), ("remote_address", ip)], 0)
}

/// The rules both stores serve: `checkout` (a fixed window of 3 per minute per client address, only for
/// `generic_key = checkout`) and `api` (a token bucket of 10 refilling 1 per hour per API key; leased on Redis).
fn rules(lease: &str) -> String {
    format!(
        r#"
[[rule]]
name = "checkout"
algorithm = "fixed_window"
limit = 3
window = "1m"
[rule.rls]
domain = "shop"
match = {{ generic_key = "checkout" }}
key = ["remote_address"]

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
rate = 1
per = "1h"
{lease}
[rule.rls]
domain = "shop"
key = ["api_key"]
"#
    )
}

fn code(answer: &Value, i: usize) -> &str {
    answer["statuses"][i]["code"].as_str().unwrap_or("?")
}

/// The descriptor-level assertions both stores must pass.
fn answers_envoy(serve: &Rls) {
    // Capacity 3: exactly 3 OK (remaining 2, 1, 0), then OVER_LIMIT, each with the rule's limit in its unit.
    let answers = serve.ask(&json!([
        checkout("10.0.0.1"),
        checkout("10.0.0.1"),
        checkout("10.0.0.1"),
        checkout("10.0.0.1")
    ]));
    for (i, a) in answers.iter().enumerate() {
        let status = &a["statuses"][0];
        let limit = json!({"name": "checkout", "requests_per_unit": 3, "unit": "MINUTE"});
        assert_eq!(status["current_limit"], limit, "{a}");
        let reset = status["duration_until_reset_ms"].as_u64().unwrap_or(0);
        assert!(reset > 0 && reset <= 60_000, "the window resets within a minute: {a}");
        assert_eq!(a["headers"]["ratelimit-policy"], "\"checkout\";q=3;w=60", "{a}");
        if i < 3 {
            assert_eq!(
                (a["overall_code"].as_str(), code(a, 0)),
                (Some("OK"), "OK"),
                "call {i}: {a}"
            );
            assert_eq!(status["limit_remaining"], 2 - i, "{a}");
            assert_eq!(
                a["headers"]["ratelimit"],
                format!("\"checkout\";r={};t=60", 2 - i),
                "{a}"
            );
            assert!(a["headers"].get("retry-after").is_none(), "{a}");
        } else {
            assert_eq!(
                (a["overall_code"].as_str(), code(a, 0)),
                (Some("OVER_LIMIT"), "OVER_LIMIT"),
                "{a}"
            );
            assert_eq!(status["limit_remaining"], 0, "{a}");
            let retry: u64 = a["headers"]["retry-after"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            assert!((1..=60).contains(&retry), "Retry-After in seconds: {a}");
        }
    }
    // Another client address is another key.
    assert_eq!(serve.ask_one(checkout("10.0.0.2"))["statuses"][0]["limit_remaining"], 2);

    // hits_addend is the cost: the request's, or the descriptor's own; a cost that does not fit is refused and
    // takes nothing.
    let ip3 = [("generic_key", "checkout"), ("remote_address", "10.0.0.3")];
    let a = serve.ask_one(one("shop", &ip3, 2));
    assert_eq!(
        (code(&a, 0), &a["statuses"][0]["limit_remaining"]),
        ("OK", &json!(1)),
        "{a}"
    );
    let a = serve.ask_one(one("shop", &ip3, 2));
    assert_eq!(code(&a, 0), "OVER_LIMIT", "2 tokens with 1 left: {a}");
    let a = serve.ask_one(one("shop", &ip3, 1));
    assert_eq!(
        (code(&a, 0), &a["statuses"][0]["limit_remaining"]),
        ("OK", &json!(0)),
        "{a}"
    );
    let own = json!({"domain": "shop", "hits_addend": 1, "descriptors": [
        {"entries": [["generic_key", "checkout"], ["remote_address", "10.0.0.4"]], "hits_addend": 3}]});
    let a = serve.ask_one(own);
    assert_eq!(
        (code(&a, 0), &a["statuses"][0]["limit_remaining"]),
        ("OK", &json!(0)),
        "the descriptor's 3: {a}"
    );
    let a = serve.ask_one(one("shop", &[("api_key", "big")], 11));
    assert_eq!(
        code(&a, 0),
        "OVER_LIMIT",
        "a cost above the capacity can never pass: {a}"
    );
    assert!(a["statuses"][0].get("duration_until_reset_ms").is_none(), "{a}");

    // Descriptors no rule answers are OK, without a limit: another generic_key, a missing key entry, another
    // domain (the checkout of 10.0.0.1 is over its limit in domain `shop` only).
    let unmatched = [
        one("shop", &[("generic_key", "cart"), ("remote_address", "10.0.0.1")], 0),
        one("shop", &[("generic_key", "checkout")], 0),
        one(
            "other",
            &[("generic_key", "checkout"), ("remote_address", "10.0.0.1")],
            0,
        ),
    ];
    for a in serve.ask(&json!(unmatched)) {
        assert_eq!(a["overall_code"], "OK", "{a}");
        assert_eq!(a["statuses"][0], json!({"code": "OK", "limit_remaining": 0}), "{a}");
        assert_eq!(a["headers"], json!({}), "{a}");
    }

    // Several descriptors: each its own status, OVER_LIMIT overall when one is; the headers of both rules.
    let both = json!({"domain": "shop", "descriptors": [
        {"entries": [["generic_key", "checkout"], ["remote_address", "10.0.0.1"]]},
        {"entries": [["api_key", "k1"]]},
        {"entries": [["path", "/"]]}]});
    let a = serve.ask_one(both);
    assert_eq!(a["overall_code"], "OVER_LIMIT", "{a}");
    assert_eq!(
        (code(&a, 0), code(&a, 1), code(&a, 2)),
        ("OVER_LIMIT", "OK", "OK"),
        "{a}"
    );
    // A bucket of 10 refilling 1 an hour is back in 10 h: 24 a day.
    let api = json!({"name": "api", "requests_per_unit": 24, "unit": "DAY"});
    assert_eq!(a["statuses"][1]["current_limit"], api, "{a}");
    assert_eq!(
        a["headers"]["ratelimit-policy"], "\"checkout\";q=3;w=60, \"api\";q=10;w=36000",
        "{a}"
    );

    // Too many descriptors in one request: a typed gRPC error.
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"entries": [["api_key", format!("m{i}")]]}))
        .collect();
    let a = serve.ask_one(json!({"domain": "shop", "descriptors": many}));
    assert_eq!(a["error"], "INVALID_ARGUMENT", "{a}");
}

/// The token bucket `api` of capacity 10 admits exactly 10 calls of a key, then refuses.
fn admits_exactly_the_capacity(serve: &Rls, key: &str) {
    let calls: Vec<Value> = (0..12).map(|_| one("shop", &[("api_key", key)], 0)).collect();
    let answers = serve.ask(&json!(calls));
    let codes: Vec<&str> = answers.iter().map(|a| code(a, 0)).collect();
    assert_eq!(
        codes,
        [["OK"; 10].as_slice(), &["OVER_LIMIT"; 2]].concat(),
        "{answers:?}"
    );
    for (i, a) in answers.iter().enumerate().take(10) {
        let remaining = a["statuses"][0]["limit_remaining"].as_u64().unwrap_or(u64::MAX);
        assert!(remaining <= 9 - i as u64, "call {i}: at most what is left: {a}");
        assert!(
            a["statuses"][0]["duration_until_reset_ms"].as_u64().unwrap_or(0) > 0,
            "{a}"
        );
    }
}

#[test]
fn rls_answers_envoy_on_the_in_process_store() {
    let serve = Rls::start(&rules(""));
    answers_envoy(&serve);
    admits_exactly_the_capacity(&serve, "k2");
    // In process, `remaining` is the bucket's: exact.
    let answers = serve.ask(&json!([
        one("shop", &[("api_key", "k3")], 0),
        one("shop", &[("api_key", "k3")], 4)
    ]));
    let left: Vec<&Value> = answers.iter().map(|a| &a["statuses"][0]["limit_remaining"]).collect();
    assert_eq!(left, [&json!(9), &json!(5)], "{answers:?}");
    // Its requests are counted and timed apart from HTTP's, by their answer.
    let metrics = serve.get("/metrics").expect("metrics");
    for series in [
        r#"tokenlease_serve_requests_total{protocol="grpc",code="ok"}"#,
        r#"tokenlease_serve_requests_total{protocol="grpc",code="over_limit"}"#,
        r#"tokenlease_serve_request_duration_seconds_count{protocol="grpc"}"#,
        r#"tokenlease_serve_requests_total{protocol="http",code="200"}"#,
    ] {
        let count = (metrics.lines())
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok());
        assert!(count.is_some_and(|n| n >= 1.0), "{series}: {count:?} in {metrics}");
    }

    // SIGHUP reloads the routes with the rules: `checkout` now answers domain `store`, and `shop` no more.
    serve.reload(&rules("").replacen("domain = \"shop\"", "domain = \"store\"", 1));
    let moved = [("generic_key", "checkout"), ("remote_address", "10.0.0.9")];
    let answers = serve.ask(&json!([one("store", &moved, 0), one("shop", &moved, 0)]));
    assert_eq!(
        answers[0]["statuses"][0]["current_limit"]["name"], "checkout",
        "{answers:?}"
    );
    assert_eq!(
        answers[1]["statuses"][0],
        json!({"code": "OK", "limit_remaining": 0}),
        "{answers:?}"
    );
}

#[test]
fn rls_answers_envoy_on_redis_from_leased_tokens() {
    let mut redis = common::RedisServer::start();
    let lease = "lease = { min_batch = 2, max_batch = 5, ttl = \"30s\", hot_after = 1 }";
    let config = format!(
        "[redis]\nurl = \"{}\"\n{}\n[[rule]]\nname = \"closed\"\nalgorithm = \"fixed_window\"\nlimit = 5\n\
         window = \"1m\"\nfail_mode = \"closed\"\n[rule.rls]\ndomain = \"fail\"\nkey = [\"k\"]\n",
        redis.url(),
        rules(lease)
    );
    let serve = Rls::start(&config);
    answers_envoy(&serve);
    let before = redis.script_calls();
    admits_exactly_the_capacity(&serve, "k2");
    let calls = redis.script_calls() - before;
    assert!(
        calls < 10,
        "10 decisions from leased batches of 2 to 5 took {calls} script calls"
    );

    // The store down: the rule's fail_mode answers (closed: refused), knowing nothing of the shared bucket.
    redis.stop();
    let a = serve.ask_one(one("fail", &[("k", "x")], 0));
    assert_eq!(
        (a["overall_code"].as_str(), code(&a, 0)),
        (Some("OVER_LIMIT"), "OVER_LIMIT"),
        "{a}"
    );
    assert_eq!(a["statuses"][0]["limit_remaining"], 0, "{a}");
    assert!(a["statuses"][0].get("duration_until_reset_ms").is_none(), "{a}");
    assert!(a["headers"].get("ratelimit").is_none(), "no state from a fallback: {a}");
}
