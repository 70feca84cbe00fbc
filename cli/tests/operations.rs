//! Operations, end to end: the `tokenlease serve` sidecar as a separate process on real Redis, scraped by a real
//! Prometheus (Debian's `prometheus`, installed by the README's test command), with the Grafana dashboards'
//! queries and the suggested alert rules evaluated against what it scraped.
//!
//! These tests need `redis-server`, `prometheus` and `promtool` on the PATH and fail, never skip, without them.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use serve::Serve;

/// What a sidecar answered.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut response = response.expect("the HTTP call itself succeeds");
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    Answer {
        status: response.status().as_u16(),
        headers,
        body: response.body_mut().read_to_string().unwrap_or_default(),
    }
}

/// A `tokenlease serve` process on a free loopback port, SIGKILLed on drop unless stopped.
struct Sidecar {
    serve: Serve,
    port: u16,
}

impl Sidecar {
    fn start(config: &str) -> Self {
        let port = common::free_port();
        let serve = Serve::spawn(config, &[], |c| {
            c.args(["--listen", &format!("127.0.0.1:{port}")]);
        });
        let url = format!("http://127.0.0.1:{port}/healthz");
        let serve = serve.wait_up(|_| agent().get(&url).call().is_ok());
        Self { serve, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn post(&self, path: &str, body: &str) -> Answer {
        answer(
            agent()
                .post(self.url(path))
                .header("content-type", "application/json")
                .send(body),
        )
    }

    fn check(&self, rule: &str, key: &str) -> Answer {
        self.post(
            "/v1/check",
            &serde_json::json!({ "rule": rule, "key": key }).to_string(),
        )
    }

    fn get(&self, path: &str) -> Answer {
        answer(agent().get(self.url(path)).call())
    }

    fn log(&self) -> String {
        self.serve.log()
    }

    fn signal(&self, sig: &str) {
        self.serve.signal(sig);
    }

    /// SIGTERM, then waits for the process to exit by itself; returns whether it exited with success.
    fn terminate(&mut self) -> bool {
        self.serve.terminate()
    }
}

/// The rules the sidecar tests run: a leased hot key, a per-user window, a shadow rule, a paced queue.
fn rules() -> &'static str {
    r#"
[[rule]]
name = "sku_buy"
algorithm = "token_bucket"
capacity = 100
rate = 1
per = "1h"
lease = { min_batch = 10, max_batch = 10, ttl = "60s" }
# Its fleet gauge is in the dashboard.

[[rule]]
name = "like"
algorithm = "fixed_window"
limit = 2
window = "60s"

[[rule]]
name = "trial"
algorithm = "sliding_log"
limit = 1
window = "60s"
shadow = true

[[rule]]
name = "reindex"
algorithm = "leaky_bucket"
rate = 50
per = "1s"
max_wait = "1s"

[[rule]]
name = "nightly"
algorithm = "leaky_bucket"
rate = 1
per = "10s"
max_wait = "30s"
"#
}

fn redis_config(redis: &common::RedisServer) -> String {
    format!(
        "[redis]\nurl = \"{}\"\ntimeout = \"1s\"\nfail_mode = \"closed\"\n{}",
        redis.url(),
        rules()
    )
}

/// Sends the traffic the metrics and dashboard tests look for: allowed, rejected, shadowed, leased, queued.
fn traffic(sidecar: &Sidecar) {
    for _ in 0..3 {
        sidecar.check("like", "user:1");
        sidecar.check("sku_buy", "sku:42");
        sidecar.check("trial", "user:1");
    }
    let acquired = sidecar.post("/v1/acquire", r#"{"rule": "reindex", "key": "tenant:7", "cost": 2}"#);
    assert_eq!(acquired.status, 200, "{}", acquired.body);
}

#[test]
fn sidecar_answers_200_then_429_with_the_rate_limit_headers() {
    let redis = common::RedisServer::start();
    let sidecar = Sidecar::start(&redis_config(&redis));

    let first = sidecar.check("like", "user:7");
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("ratelimit-policy"), Some(r#""like";q=2;w=60"#));
    assert_eq!(first.header("ratelimit"), Some(r#""like";r=1;t=60"#));
    assert_eq!(first.header("retry-after"), None);
    let json = first.json();
    assert_eq!(json["allowed"], true);
    assert_eq!(json["remaining"], 1);
    assert_eq!(json["source"], "redis");

    assert_eq!(sidecar.check("like", "user:7").status, 200);
    let refused = sidecar.check("like", "user:7");
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.header("ratelimit"), Some(r#""like";r=0;t=60"#));
    let retry: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(refused.json()["allowed"], false);
    // Another user has a window of their own.
    assert_eq!(sidecar.check("like", "user:8").status, 200);

    // A shadow rule lets everything through and says what it would have refused.
    assert_eq!(sidecar.check("trial", "user:7").json()["shadowed"], false);
    let shadowed = sidecar.check("trial", "user:7");
    assert_eq!(shadowed.status, 200);
    assert_eq!(shadowed.json()["shadowed"], true);
    assert_eq!(
        shadowed.header("ratelimit"),
        None,
        "a shadow rule shows clients no headers"
    );

    // The leased key: its first two calls go to Redis (it is not hot yet); the third proves it hot and leases
    // a batch of 10, and the rest are answered in process.
    for n in 1..=4 {
        let bought = sidecar.check("sku_buy", "sku:42");
        assert_eq!(bought.status, 200, "{}", bought.body);
        let from = if n <= 2 { "redis" } else { "local" };
        assert_eq!(bought.json()["source"], from, "call {n}");
    }

    // The queue paces: 50 per second, cost 5 each: one job every 100 ms, so each call after the first waits
    // about 100 ms for its slot.
    let waits: Vec<u64> = (0..3)
        .map(|_| {
            let a = sidecar.post("/v1/acquire", r#"{"rule": "reindex", "key": "tenant:7", "cost": 5}"#);
            assert_eq!(a.status, 200, "{}", a.body);
            a.json()["waited_ms"].as_u64().expect("waited_ms")
        })
        .collect();
    assert!(waits[1] >= 50 && waits[2] >= 50, "waits {waits:?}");
    // A job of cost 50 fills a second of the schedule: of three at once, the third would wait about 2 s, more
    // than max_wait = 1 s, so it is refused at once with Retry-After.
    let big = r#"{"rule": "reindex", "key": "tenant:8", "cost": 50}"#;
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..3).map(|_| s.spawn(|| sidecar.post("/v1/acquire", big))).collect();
        calls.into_iter().map(|c| c.join().expect("thread")).collect()
    });
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert_eq!(
        refused.len(),
        1,
        "statuses {:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert!(refused[0].header("retry-after").is_some());
    assert!(refused[0].json()["error"]
        .as_str()
        .unwrap_or("")
        .contains("would exceed"));

    let health = sidecar.get("/healthz");
    assert_eq!(
        (health.status, health.json()["store"].clone()),
        (200, Value::from("redis"))
    );
}

/// A client hammering keys over their limits through the sidecar (a PHP page retrying a login, a bot posting):
/// each key costs Redis its allowed calls and one refusal, and the refusals after it are answered in process
/// until the window has room (invariant 4). Before `src/refusals.rs`: 406 EVALSHA for the 400 refusals.
#[test]
fn a_client_hammering_keys_over_their_limits_costs_redis_one_call_per_retry_after() {
    let redis = common::RedisServer::start();
    let config = format!(
        "[redis]\nurl = \"{}\"\ntimeout = \"1s\"\nfail_mode = \"closed\"\n{}",
        redis.url(),
        r#"
[[rule]]
name = "login"
algorithm = "fixed_window"
limit = 5
window = "60s"

[[rule]]
name = "post"
algorithm = "sliding_log"
limit = 5
window = "60s"
"#
    );
    let sidecar = Sidecar::start(&config);
    let before = redis.script_calls();
    let mut refused = 0;
    for rule in ["login", "post"] {
        for _ in 0..205 {
            let answer = sidecar.check(rule, "user:7");
            refused += u32::from(answer.status == 429);
        }
    }
    let calls = redis.script_calls() - before;
    assert_eq!(refused, 400);
    // 5 allowed and 1 refused per rule, the other 398 refusals answered in process; a script's first call may
    // be sent twice (EVALSHA, then EVAL after NOSCRIPT).
    assert!((12..=14).contains(&calls), "{calls} script calls for 410 checks");
    let metrics = sidecar.get("/metrics").body;
    let cached = metrics
        .lines()
        .filter(|l| l.starts_with("tokenlease_refusals_cached_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert_eq!(cached, 398.0, "{metrics}");
}

#[test]
fn sidecar_refuses_bad_requests_with_clear_messages() {
    let sidecar = Sidecar::start(rules());
    let cases: [(&str, u16, &str); 6] = [
        ("not json", 400, "must be JSON"),
        (r#"{"rule": "like"}"#, 400, "missing field `key`"),
        (
            r#"{"rule": "like", "key": "u", "colour": 1}"#,
            400,
            "unknown field `colour`",
        ),
        (r#"{"rule": "like", "key": "u", "cost": -1}"#, 400, "invalid value"),
        (
            r#"{"rule": "like", "key": "u", "cost": 18446744073709551615}"#,
            400,
            "can never be granted",
        ),
        (r#"{"rule": "nope", "key": "u"}"#, 404, "unknown rule `nope`"),
    ];
    for (body, status, says) in cases {
        let a = sidecar.post("/v1/check", body);
        assert_eq!(a.status, status, "{body} → {}", a.body);
        let error = a.json()["error"].as_str().expect("error message").to_owned();
        assert!(error.contains(says), "{body} → {error}");
    }
    let long_key = serde_json::json!({ "rule": "like", "key": "k".repeat(600) }).to_string();
    let a = sidecar.post("/v1/check", &long_key);
    assert_eq!(a.status, 400);
    assert!(a.body.contains("512"), "{}", a.body);
    let huge = serde_json::json!({ "rule": "like", "key": "k".repeat(64 * 1024) }).to_string();
    assert_eq!(sidecar.post("/v1/check", &huge).status, 413);
    let a = sidecar.post("/v1/acquire", r#"{"rule": "like", "key": "u"}"#);
    assert_eq!(a.status, 400, "acquire on a window rule: {}", a.body);
    // Still serving after all that.
    assert_eq!(sidecar.check("like", "u").status, 200);
}

#[test]
fn sigterm_gives_leased_tokens_back_and_healthz_follows_redis() {
    let mut redis = common::RedisServer::start();
    let mut sidecar = Sidecar::start(&redis_config(&redis));
    for _ in 0..3 {
        assert_eq!(sidecar.check("sku_buy", "sku:42").status, 200);
    }
    // A job queued for its slot (10 s away) is answered 503 at once on SIGTERM, and does not hold the exit.
    let nightly = r#"{"rule": "nightly", "key": "db"}"#;
    assert_eq!(sidecar.post("/v1/acquire", nightly).status, 200);
    let url = sidecar.url("/v1/acquire");
    let stopped = std::thread::scope(|s| {
        let waiting = s.spawn(|| answer(agent().post(&url).send(nightly)));
        // real time: waits for the sidecar process to queue the request before it is stopped.
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let exited = sidecar.terminate();
        let waiting = waiting.join().expect("thread");
        assert_eq!(waiting.status, 503, "{}", waiting.body);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
        exited
    });
    assert!(stopped, "exit status after SIGTERM: {}", sidecar.log());

    // 3 of the 10 leased tokens were spent; the other 7 went back: 97 are left, not 90 (the refill is 1 per hour).
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let rule = tokenlease::Rule::token_bucket("sku_buy", 100, 1, Duration::from_secs(3600)).expect("rule");
        let limiter = common::limiter([rule]).redis(&redis).build();
        let left = limiter.check("sku_buy", "sku:42", 97).await.expect("check");
        assert!(left.allowed, "the unspent leased tokens were not given back: {left:?}");
        assert!(!limiter.check("sku_buy", "sku:42", 1).await.expect("check").allowed);
    });

    // /healthz tells whether Redis answers, and recovers with it.
    let sidecar = Sidecar::start(&redis_config(&redis));
    redis.stop();
    let down = sidecar.get("/healthz");
    assert_eq!(down.status, 503, "{}", down.body);
    assert_eq!(down.json()["status"], "unavailable");
    redis.restart();
    let up = common::wait_for(Duration::from_secs(20), || {
        (sidecar.get("/healthz").status == 200).then_some(())
    });
    assert!(up.is_some(), "healthz did not recover with Redis");
}

#[test]
fn sighup_reloads_the_config_and_a_bad_file_keeps_the_rules() {
    let one = "[[rule]]\nname = \"like\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"60s\"\n";
    let sidecar = Sidecar::start(one);
    assert_eq!(sidecar.check("like", "u").status, 200);
    assert_eq!(sidecar.check("like", "u").status, 429);

    // Raised to 3: the same key's window goes on, with the new limit.
    std::fs::write(sidecar.serve.config(), one.replace("limit = 1", "limit = 3")).expect("write");
    sidecar.signal("-HUP");
    let reloaded = common::wait_for(Duration::from_secs(10), || {
        sidecar.log().contains("reloaded").then_some(())
    });
    assert!(reloaded.is_some(), "no reload: {}", sidecar.log());
    assert_eq!(sidecar.check("like", "u").status, 200);
    assert_eq!(sidecar.check("like", "u").status, 200);
    assert_eq!(sidecar.check("like", "u").status, 429);

    // A file that does not parse changes nothing.
    std::fs::write(sidecar.serve.config(), "[[rule]]\nname = \"like\"\nlimit = \"many\"\n").expect("write");
    sidecar.signal("-HUP");
    // The whole line: stderr is unbuffered, so a line may reach the file in several writes.
    let kept = common::wait_for(Duration::from_secs(10), || {
        let log = sidecar.log();
        let line = log
            .split_inclusive('\n')
            .find(|l| l.contains("kept the rules in force") && l.ends_with('\n'));
        line.map(str::to_owned)
    });
    let kept = kept.unwrap_or_else(|| panic!("no refusal logged: {}", sidecar.log()));
    assert!(kept.contains("config.toml:3:"), "the error names no line: {kept}");
    assert_eq!(sidecar.check("like", "v").status, 200);

    // A removed rule answers 404.
    std::fs::write(sidecar.serve.config(), one.replace("\"like\"", "\"post\"")).expect("write");
    sidecar.signal("-HUP");
    let removed = common::wait_for(Duration::from_secs(10), || {
        (sidecar.check("like", "u").status == 404).then_some(())
    });
    assert!(removed.is_some(), "the removed rule still answers: {}", sidecar.log());
    assert_eq!(sidecar.check("post", "u").status, 200);
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool must be installed (the README's test command installs Debian's prometheus)");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("promtool output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A Prometheus server on a free loopback port scraping `target` every second, with `rules` loaded.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: u16, rules: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        let yaml = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tokenlease\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
            rules.display()
        );
        std::fs::write(&config, yaml).expect("write prometheus.yml");
        let port = common::free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus must be installed (the README's test command installs Debian's prometheus)");
        Self { child, port, _dir: dir }
    }

    fn api(&self, path: &str, query: Option<&str>) -> Option<Value> {
        let mut request = agent().get(format!("http://127.0.0.1:{}/api/v1/{path}", self.port));
        if let Some(q) = query {
            request = request.query("query", q);
        }
        let mut response = request.call().ok()?;
        let mut text = String::new();
        response.body_mut().as_reader().read_to_string(&mut text).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The result vector of an instant query; panics when Prometheus refuses the expression.
    fn query(&self, expr: &str) -> Vec<Value> {
        let reply = self.api("query", Some(expr)).expect("Prometheus answers");
        assert_eq!(reply["status"], "success", "Prometheus refused `{expr}`: {reply}");
        reply["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `expr` in a Grafana dashboard (panel targets, nested rows included).
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The `tokenlease_*` metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("tokenlease_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn prometheus_scrapes_every_metric_the_dashboards_and_alerts_use() {
    let redis = common::RedisServer::start();
    let sidecar = Sidecar::start(&redis_config(&redis));
    traffic(&sidecar);

    // The exposition is valid (help texts, types, names).
    let exposition = sidecar.get("/metrics").body;
    let (ok, lint) = promtool(&["check", "metrics"], Some(&exposition));
    assert!(ok, "promtool check metrics: {lint}");

    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let alerts = root.join("grafana/alerts.yml");
    let (ok, lint) = promtool(&["check", "rules", &alerts.display().to_string()], None);
    assert!(ok, "promtool check rules: {lint}");

    let prometheus = Prometheus::start(sidecar.port, &alerts);
    // Two scrapes after the traffic, so that rate() over them has something to say.
    let scraped = common::wait_for(Duration::from_secs(60), || {
        let expr = r#"count_over_time(tokenlease_decisions_total{outcome="shadow_rejected",rule="trial"}[1m])"#;
        let reply = prometheus.api("query", Some(expr))?;
        reply["data"]["result"]
            .as_array()?
            .iter()
            .any(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()) >= Some(2.0))
            .then_some(())
    });
    assert!(
        scraped.is_some(),
        "Prometheus did not scrape the sidecar twice within 60 s"
    );
    traffic(&sidecar);

    // Every metric of the README's metrics table, with the labels the dashboards group by.
    let expected: [(&str, &[&str]); 13] = [
        (
            r#"tokenlease_decisions_total{rule="like",outcome="allowed",source="redis"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_decisions_total{rule="like",outcome="rejected",source="redis"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_decisions_total{rule="trial",outcome="shadow_rejected",source="redis"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_decisions_total{rule="sku_buy",outcome="allowed",source="local"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_leases_total{rule="sku_buy",result="granted"}"#,
            &["instance"],
        ),
        (r#"tokenlease_leased_tokens_total{rule="sku_buy"}"#, &["instance"]),
        (r#"tokenlease_outstanding_tokens{rule="sku_buy"}"#, &["instance"]),
        (
            r#"tokenlease_redis_duration_seconds_bucket{script="token_bucket",le="0.1"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_redis_duration_seconds_count{script="fixed_window"}"#,
            &["instance"],
        ),
        (r#"tokenlease_queue_wait_seconds_count{rule="reindex"}"#, &["instance"]),
        ("tokenlease_local_keys", &["instance"]),
        (
            r#"tokenlease_serve_requests_total{protocol="http",code="429"}"#,
            &["instance"],
        ),
        (
            r#"tokenlease_serve_request_duration_seconds_count{protocol="http"}"#,
            &["instance"],
        ),
    ];
    for (selector, labels) in expected {
        let series = prometheus.query(selector);
        let value = series
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no series for {selector}"));
        if !selector.starts_with("tokenlease_local_keys") {
            assert!(value >= 1.0, "{selector} = {value}");
        }
        for label in labels {
            assert!(series[0]["metric"][label].is_string(), "{selector} has no `{label}`");
        }
    }
    for (selector, label) in [
        ("tokenlease_returned_tokens_total", "rule"),
        ("tokenlease_redis_errors_total", "kind"),
        ("tokenlease_queue_depth", "rule"),
        ("tokenlease_store_clock_offset_seconds", "rule"),
    ] {
        let series = prometheus.query(selector);
        assert!(
            series.iter().any(|s| s["metric"][label].is_string()),
            "no {selector} series with `{label}`"
        );
    }

    // The store's clock against the sidecar's, read at its beats: one host, so within a second.
    let offset = prometheus.query(r#"tokenlease_store_clock_offset_seconds{rule="sku_buy"}"#);
    let offset = (offset.first())
        .and_then(|s| s["value"][1].as_str())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(offset.is_some_and(|o| o.abs() < 1.0), "store clock offset {offset:?}");

    // Every dashboard query is valid PromQL, reads only exported metrics, and has data.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("grafana/tokenlease.json")).expect("dashboard"))
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 15, "only {} queries in the dashboard", queries.len());
    for expr in &queries {
        for name in metric_names(expr) {
            assert!(
                exposition.contains(&format!("\n{name}")),
                "`{expr}` reads `{name}`, which tokenlease does not export"
            );
        }
        let concrete = expr
            .replace("$__rate_interval", "1m")
            .replace("${rule}", ".*")
            .replace("$rule", ".*")
            .replace("${instance}", ".*")
            .replace("$instance", ".*");
        assert!(!concrete.contains('$'), "unknown variable in `{expr}`");
        assert!(!prometheus.query(&concrete).is_empty(), "no data for `{concrete}`");
    }

    // The suggested alert rules load and evaluate without errors on real data.
    let evaluated = common::wait_for(Duration::from_secs(30), || {
        let rules = prometheus.api("rules", None)?;
        let all: Vec<Value> = rules["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (!all.is_empty() && all.iter().all(|r| r["health"] == "ok")).then_some(all.len())
    });
    assert!(
        evaluated.is_some(),
        "alert rules not all healthy: {:?}",
        prometheus.api("rules", None)
    );
}
