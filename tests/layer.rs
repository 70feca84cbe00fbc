//! `RateLimitLayer` in an axum `Router`, driven with `oneshot`: keys from a header, the client IP and the path;
//! 429 with the IETF `RateLimit` headers and `Retry-After` without reaching the inner service; 400/404/500 for
//! requests without a key and limiter errors; costs; shadow rules (and their metrics); `insert_headers` alone.
//! Long windows throughout, so no test depends on time passing.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::Router;
use common::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tokenlease::http::{insert_headers, HeaderName, KeySource, RateLimitLayer, RATELIMIT, RATELIMIT_POLICY};
use tokenlease::{Decision, Limiter, Quota, Rule, Source};
use tower::ServiceExt;

const HOUR: Duration = Duration::from_secs(3600);

fn api_key() -> KeySource {
    KeySource::Header(HeaderName::from_static("x-api-key"))
}

/// A router answering every path with "inner" behind `layer`, counting the requests that reach it.
struct App {
    router: Router,
    calls: Arc<AtomicUsize>,
}

/// A response with its body read.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl App {
    fn new(layer: RateLimitLayer) -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let handler = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "inner" }
        };
        let router = Router::new().fallback(handler).layer(layer);
        Self { router, calls }
    }

    /// Requests that reached the inner service so far.
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.router.clone().oneshot(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 16).await.expect("body");
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
        }
    }

    /// Sends `GET uri` with `x-api-key: key`.
    async fn send_keyed(&self, uri: &str, key: &str) -> Reply {
        let mut req = request(uri);
        let key = HeaderValue::from_str(key).expect("a header value");
        req.headers_mut().insert("x-api-key", key);
        self.send(req).await
    }

    /// Sends `GET /` from `peer` (what `into_make_service_with_connect_info` records).
    async fn send_from(&self, peer: &str) -> Reply {
        let mut req = request("/");
        let addr: SocketAddr = peer.parse().expect("socket address");
        req.extensions_mut().insert(ConnectInfo(addr));
        self.send(req).await
    }
}

/// `GET uri` without a body.
fn request(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).expect("request")
}

impl Reply {
    fn header(&self, name: impl axum::http::header::AsHeaderName) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("visible ASCII header"))
    }

    /// The integer parameter `param` of the `RateLimit` header (`"api";r=1;t=60`).
    fn ratelimit(&self, param: &str) -> Option<u64> {
        let value = self.header(RATELIMIT).expect("a RateLimit header");
        param_of(value, param)
    }

    fn retry_after(&self) -> Option<u64> {
        self.header(header::RETRY_AFTER)
            .map(|v| v.parse().expect("Retry-After in whole seconds"))
    }

    /// Asserts a JSON `{"error": ...}` answer of `status` and returns the message.
    #[track_caller]
    fn error(&self, status: StatusCode) -> String {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header(header::CONTENT_TYPE), Some("application/json"), "{self:?}");
        let json: serde_json::Value = serde_json::from_str(&self.body).expect("a JSON body");
        json["error"].as_str().expect("a string `error`").to_owned()
    }

    /// Asserts the request went through: 200 with the inner service's body.
    #[track_caller]
    fn assert_passed(&self) {
        assert_eq!(self.status, StatusCode::OK, "{self:?}");
        assert_eq!(self.body, "inner");
        assert_eq!(self.header(header::RETRY_AFTER), None, "{self:?}");
    }
}

/// The integer parameter `param` of a structured header value like `"api";r=1;t=60`.
fn param_of(value: &str, param: &str) -> Option<u64> {
    value
        .split(';')
        .skip(1)
        .find_map(|p| p.strip_prefix(param)?.strip_prefix('='))
        .map(|v| v.parse().expect("an integer parameter"))
}

async fn limits_by_header(limiter: Limiter) {
    let app = App::new(RateLimitLayer::new(limiter, "api", api_key()));
    for remaining in [1, 0] {
        let reply = app.send_keyed("/", "k1").await;
        reply.assert_passed();
        assert_eq!(reply.header(RATELIMIT_POLICY), Some("\"api\";q=2;w=60"));
        assert!(reply.header(RATELIMIT).expect("RateLimit").starts_with("\"api\";"));
        assert_eq!(reply.ratelimit("r"), Some(remaining), "{reply:?}");
        let reset = reply.ratelimit("t").expect("t");
        assert!((1..=60).contains(&reset), "{reply:?}");
    }
    assert_eq!(app.calls(), 2);

    let refused = app.send_keyed("/", "k1").await;
    let message = refused.error(StatusCode::TOO_MANY_REQUESTS);
    assert!(message.contains("rate limited by `api`"), "{message}");
    assert_eq!(refused.header(RATELIMIT_POLICY), Some("\"api\";q=2;w=60"));
    assert_eq!(refused.ratelimit("r"), Some(0));
    let retry = refused.retry_after().expect("Retry-After on a refusal");
    assert!((1..=60).contains(&retry), "{refused:?}");
    assert_eq!(app.calls(), 2, "a refused request never reaches the inner service");

    let other = app.send_keyed("/", "k2").await;
    other.assert_passed();
    assert_eq!(other.ratelimit("r"), Some(1), "each key has its own limit");
    assert_eq!(app.calls(), 3);
}

fn api_rule() -> Rule {
    Rule::fixed_window("api", 2, Duration::from_secs(60)).expect("rule")
}

#[tokio::test]
async fn header_key_on_memory_store() {
    limits_by_header(common::limiter([api_rule()]).build()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_key_on_redis() {
    let server = RedisServer::start();
    limits_by_header(common::limiter([api_rule()]).redis(&server).build()).await;
}

#[tokio::test]
async fn a_request_without_a_usable_header_is_400_and_not_passed_on() {
    let app = App::new(RateLimitLayer::new(
        common::limiter([api_rule()]).build(),
        "api",
        api_key(),
    ));
    let missing = app.send(request("/")).await;
    let message = missing.error(StatusCode::BAD_REQUEST);
    assert!(message.contains("x-api-key"), "{message}");
    assert!(message.contains("no `x-api-key` header"), "{message}");

    let empty = app.send_keyed("/", "").await;
    assert!(empty.error(StatusCode::BAD_REQUEST).contains("x-api-key"));

    let mut req = request("/");
    let opaque = HeaderValue::from_bytes(b"caf\xe9").expect("an obs-text header value");
    req.headers_mut().insert("x-api-key", opaque);
    let non_ascii = app.send(req).await;
    assert!(non_ascii.error(StatusCode::BAD_REQUEST).contains("x-api-key"));

    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn client_ip_key_limits_each_address_and_needs_connect_info() {
    let rule = Rule::sliding_log("per_ip", 1, HOUR).expect("rule");
    let app = App::new(RateLimitLayer::new(
        common::limiter([rule]).build(),
        "per_ip",
        KeySource::ClientIp,
    ));
    app.send_from("192.0.2.1:40000").await.assert_passed();
    // The key is the IP: another port of the same host shares its limit.
    let again = app.send_from("192.0.2.1:40001").await;
    again.error(StatusCode::TOO_MANY_REQUESTS);
    app.send_from("198.51.100.7:40000").await.assert_passed();
    app.send_from("[2001:db8::1]:40000").await.assert_passed();
    assert_eq!(app.calls(), 3);

    let anonymous = app.send(request("/")).await;
    let message = anonymous.error(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(message.contains("connect_info"), "{message}");
    assert_eq!(app.calls(), 3);
}

#[tokio::test]
async fn path_key_limits_each_path() {
    let rule = Rule::sliding_log("per_path", 1, HOUR).expect("rule");
    let app = App::new(RateLimitLayer::new(
        common::limiter([rule]).build(),
        "per_path",
        KeySource::Path,
    ));
    app.send(request("/a")).await.assert_passed();
    // The query is not part of the key.
    let again = app.send(request("/a?page=2")).await;
    again.error(StatusCode::TOO_MANY_REQUESTS);
    app.send(request("/b")).await.assert_passed();
    assert_eq!(app.calls(), 2);
}

#[tokio::test]
async fn with_cost_charges_that_many_tokens() {
    let rule = Rule::sliding_log("upload", 5, HOUR).expect("rule");
    let limiter = common::limiter([rule]).build();
    let app = App::new(RateLimitLayer::new(limiter.clone(), "upload", api_key()).with_cost(2));
    for remaining in [3, 1] {
        let reply = app.send_keyed("/", "u").await;
        reply.assert_passed();
        assert_eq!(reply.ratelimit("r"), Some(remaining));
    }
    let refused = app.send_keyed("/", "u").await;
    refused.error(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.ratelimit("r"),
        Some(1),
        "one token is left, too few for a cost of 2"
    );
    assert_eq!(app.calls(), 2);
    // The token left is still there for a cost of 1.
    assert!(limiter.check("upload", "u", 1).await.expect("check").allowed);

    // A cost above the limit can never pass: 400, not 429.
    let greedy = App::new(RateLimitLayer::new(limiter, "upload", api_key()).with_cost(6));
    greedy.send_keyed("/", "v").await.error(StatusCode::BAD_REQUEST);
    assert_eq!(greedy.calls(), 0);
}

#[tokio::test]
async fn limiter_errors_map_to_their_status() {
    let limiter = common::limiter([api_rule()]).build();
    let unknown = App::new(RateLimitLayer::new(limiter.clone(), "nope", api_key()));
    let message = unknown.send_keyed("/", "k").await.error(StatusCode::NOT_FOUND);
    assert!(message.contains("nope"), "{message}");
    assert_eq!(unknown.calls(), 0);

    let app = App::new(RateLimitLayer::new(limiter, "api", api_key()));
    let message = app
        .send_keyed("/", &"k".repeat(513))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert!(message.contains("key"), "{message}");
    assert_eq!(app.calls(), 0);
    app.send_keyed("/", &"k".repeat(512)).await.assert_passed();
}

/// Counter `tokenlease_decisions_total` for `rule`, `outcome` and `source`, from a snapshot.
fn decisions(snapshot: &[(metrics_util::CompositeKey, DebugValue)], rule: &str, outcome: &str, source: &str) -> u64 {
    let labels = [("rule", rule), ("outcome", outcome), ("source", source)];
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Counter && k.key().name() == "tokenlease_decisions_total")
        .filter(|(k, _)| {
            labels
                .iter()
                .all(|(n, v)| k.key().labels().any(|l| l.key() == *n && l.value() == *v))
        })
        .map(|(_, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

async fn shadow_rule_counts_but_never_refuses(redis: Option<&RedisServer>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let trial = Rule::sliding_log("trial", 1, HOUR).expect("rule").with_shadow(true);
    let strict = Rule::sliding_log("strict", 1, HOUR).expect("rule");
    let limiter = metrics::with_local_recorder(&recorder, || {
        let limiter = common::limiter([trial, strict]);
        match redis {
            Some(server) => limiter.redis(server),
            None => limiter,
        }
        .build()
    });

    let first = limiter.check("trial", "k", 1).await.expect("check");
    assert!(first.allowed && !first.shadowed, "{first:?}");
    let second = limiter.check("trial", "k", 1).await.expect("check");
    assert!(second.allowed, "a shadow rule allows everything: {second:?}");
    assert!(second.shadowed, "and says what it would have refused: {second:?}");
    assert_eq!(second.retry_after, Duration::ZERO);
    assert_eq!(second.remaining, 0);

    let app = App::new(RateLimitLayer::new(limiter.clone(), "trial", api_key()));
    // The second request on "h" is one the rule would refuse: it still gets through, and a shadow rule shows
    // clients no rate-limit headers (a client reading r=0 would slow down).
    for key in ["h", "h", "fresh"] {
        let reply = app.send_keyed("/", key).await;
        assert!(reply.headers.get("ratelimit").is_none() && reply.headers.get("ratelimit-policy").is_none());
        reply.assert_passed();
    }
    assert_eq!(app.calls(), 3);

    assert!(limiter.check("strict", "k", 1).await.expect("check").allowed);
    let refused = limiter.check("strict", "k", 1).await.expect("check");
    assert!(!refused.allowed && !refused.shadowed, "{refused:?}");

    let source = limiter.store_source().as_str();
    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    // trial: k (2 checks) and h (2 requests) each shadow-rejected once; k, h and fresh allowed once.
    assert_eq!(
        decisions(&snapshot, "trial", "shadow_rejected", source),
        2,
        "{snapshot:#?}"
    );
    assert_eq!(decisions(&snapshot, "trial", "rejected", source), 0);
    assert_eq!(decisions(&snapshot, "trial", "allowed", source), 3);
    assert_eq!(decisions(&snapshot, "strict", "rejected", source), 1);
    assert_eq!(decisions(&snapshot, "strict", "shadow_rejected", source), 0);
    assert_eq!(decisions(&snapshot, "strict", "allowed", source), 1);
}

#[tokio::test]
async fn shadow_rule_on_memory_store() {
    shadow_rule_counts_but_never_refuses(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rule_on_redis() {
    let server = RedisServer::start();
    shadow_rule_counts_but_never_refuses(Some(&server)).await;
}

#[tokio::test]
async fn a_stock_that_never_refills_has_no_window_reset_or_retry_after() {
    let stock = Rule::token_bucket("stock", 1, 0, Duration::from_secs(1)).expect("rule");
    let app = App::new(RateLimitLayer::new(
        common::limiter([stock]).build(),
        "stock",
        KeySource::Path,
    ));
    let sold = app.send(request("/sku/1")).await;
    sold.assert_passed();
    assert_eq!(sold.header(RATELIMIT_POLICY), Some("\"stock\";q=1"));
    assert_eq!(
        sold.header(RATELIMIT),
        Some("\"stock\";r=0"),
        "never full again: no `t`"
    );

    let sold_out = app.send(request("/sku/1")).await;
    let message = sold_out.error(StatusCode::TOO_MANY_REQUESTS);
    assert!(message.contains("can never pass"), "{message}");
    assert_eq!(sold_out.retry_after(), None, "{sold_out:?}");
    assert_eq!(sold_out.header(RATELIMIT), Some("\"stock\";r=0"));
    assert_eq!(app.calls(), 1);
}

fn decision(allowed: bool, retry_after: Duration, reset_after: Duration) -> Decision {
    Decision {
        allowed,
        remaining: 7,
        retry_after,
        reset_after,
        source: Source::Memory,
        shadowed: false,
    }
}

/// `insert_headers` into an empty map: `(RateLimit-Policy, RateLimit, Retry-After)`.
fn headers_of(rule: &str, quota: Option<Quota>, decision: &Decision) -> [Option<String>; 3] {
    let mut headers = HeaderMap::new();
    insert_headers(&mut headers, rule, quota, decision);
    let get = |name| {
        headers
            .get(name)
            .map(|v: &HeaderValue| v.to_str().expect("ASCII").to_owned())
    };
    [get(RATELIMIT_POLICY), get(RATELIMIT), get(header::RETRY_AFTER)]
}

#[test]
fn insert_headers_formats_the_ietf_fields() {
    let some = |s: &str| Some(s.to_owned());
    let bucket = Rule::token_bucket("b", 10, 0, Duration::from_secs(1)).expect("rule");
    let no_window = bucket.algorithm.quota();
    assert_eq!(
        no_window,
        Quota {
            limit: 10,
            window: None
        }
    );
    let refill = Rule::token_bucket("b", 10, 5, Duration::from_secs(1)).expect("rule");
    let two_secs = refill.algorithm.quota();
    let rounded = Quota {
        limit: 3,
        window: Some(Duration::from_millis(1500)),
    };

    let allowed = decision(true, Duration::ZERO, Duration::from_millis(1500));
    let never = decision(false, Duration::MAX, Duration::MAX);
    let soon = decision(false, Duration::from_millis(1), Duration::from_secs(2));
    let cases = [
        (
            "b",
            Some(no_window),
            allowed,
            [some("\"b\";q=10"), some("\"b\";r=7;t=2"), None],
        ),
        (
            "b",
            Some(two_secs),
            never,
            [some("\"b\";q=10;w=2"), some("\"b\";r=7"), None],
        ),
        (
            "b",
            Some(rounded),
            soon,
            [some("\"b\";q=3;w=2"), some("\"b\";r=7;t=2"), some("1")],
        ),
        ("a\"b", None, allowed, [None, some(r#""a\"b";r=7;t=2"#), None]),
        ("a\\b c", None, allowed, [None, some(r#""a\\b c";r=7;t=2"#), None]),
        ("été", None, allowed, [None, some("\"_t_\";r=7;t=2"), None]),
        // fail_mode decided: nothing is known of the shared bucket, so no `RateLimit` field.
        (
            "b",
            Some(two_secs),
            Decision {
                source: Source::Fallback,
                ..soon
            },
            [some("\"b\";q=10;w=2"), None, some("1")],
        ),
        // Integers are capped at the 15 digits of a structured field.
        (
            "b",
            Some(Quota {
                limit: u64::MAX,
                window: Some(Duration::MAX),
            }),
            Decision {
                remaining: u64::MAX,
                ..allowed
            },
            [
                some("\"b\";q=999999999999999;w=999999999999999"),
                some("\"b\";r=999999999999999;t=2"),
                None,
            ],
        ),
    ];
    for (rule, quota, decision, want) in cases {
        assert_eq!(
            headers_of(rule, quota, &decision),
            want,
            "{rule} {quota:?} {decision:?}"
        );
    }
}

#[test]
fn stacked_policies_are_appended() {
    let mut headers = HeaderMap::new();
    let quota = Some(Quota {
        limit: 5,
        window: Some(Duration::from_secs(60)),
    });
    let d = decision(true, Duration::ZERO, Duration::from_secs(60));
    insert_headers(&mut headers, "per_ip", quota, &d);
    insert_headers(&mut headers, "per_user", quota, &d);
    let values: Vec<&str> = headers
        .get_all(RATELIMIT_POLICY)
        .iter()
        .map(|v| v.to_str().expect("ASCII"))
        .collect();
    assert_eq!(values, ["\"per_ip\";q=5;w=60", "\"per_user\";q=5;w=60"]);
    assert_eq!(headers.get_all(RATELIMIT).iter().count(), 2);
}
