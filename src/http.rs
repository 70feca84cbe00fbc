//! HTTP for tokenlease (feature `http`, on by default): the rate-limit headers of a [`Decision`], the status of
//! an [`Error`], and [`RateLimitLayer`], a tower layer (axum middleware) that limits requests by a key taken
//! from a header, the client IP or the path. `tokenlease serve` answers with the same headers.
//!
//! The headers follow the IETF draft *RateLimit header fields for HTTP* (draft-ietf-httpapi-ratelimit-headers,
//! revisions 08 and later), with the rule's name as the policy's name:
//!
//! ```text
//! RateLimit-Policy: "sku_buy";q=2000;w=2     quota: 2000 tokens per 2 s
//! RateLimit: "sku_buy";r=0;t=2                0 left; the full quota is back in 2 s
//! Retry-After: 1                              refusals only: seconds until the same call would pass
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub use ::http::HeaderName;
use ::http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use axum::body::Body;
use axum::extract::ConnectInfo;

use crate::{Decision, Error, Limiter, Quota};

/// The `RateLimit-Policy` header (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up: a client that waits this long is never early.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Appends `name` to `out` as a structured-field string (RFC 8941 §3.3.3): printable ASCII, `"` and `\`
/// escaped, anything else replaced by `_`.
fn push_sf_string(out: &mut Vec<u8>, name: &str) {
    out.push(b'"');
    for c in name.chars() {
        match c {
            '"' | '\\' => out.extend_from_slice(&[b'\\', c as u8]),
            // Printable ASCII: one byte.
            ' '..='~' => out.push(c as u8),
            _ => out.push(b'_'),
        }
    }
    out.push(b'"');
}

/// The largest integer of a structured field (RFC 8941 §3.3.1: at most 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Appends the parameter `;{key}={n}` to `out`, `n` capped at [`SF_INTEGER_MAX`] (itoa, no `format!`: this runs
/// on every answered request).
fn push_param(out: &mut Vec<u8>, key: &[u8], n: u64) {
    out.push(b';');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(itoa::Buffer::new().format(n.min(SF_INTEGER_MAX)).as_bytes());
}

/// Writes the headers of `decision` under rule `rule` into `headers`: `RateLimit-Policy` (when the quota is
/// known), `RateLimit` (remaining tokens `r`, seconds `t` until the full quota is back) and, on a refusal that
/// can ever pass, `Retry-After` in whole seconds rounded up. Durations of [`Duration::MAX`] ("never") leave
/// their parameter out. Both fields are lists: they are appended, so layers stacked for several rules each add
/// their policy.
///
/// `r` is what the decision knew: the shared bucket's tokens for a decision made by a store, this process's
/// leased tokens for one made locally (`Source::Local`). A decision made by `fail_mode` (`Source::Fallback`)
/// knows nothing of the shared bucket, so it writes no `RateLimit` field.
pub fn insert_headers(headers: &mut HeaderMap, rule: &str, quota: Option<Quota>, decision: &Decision) {
    // One buffer for both fields; each value is copied out of it once.
    let mut field = Vec::with_capacity(rule.len() + 48);
    if let Some(quota) = quota {
        push_sf_string(&mut field, rule);
        push_param(&mut field, b"q", quota.limit);
        if let Some(window) = quota.window {
            push_param(&mut field, b"w", ceil_secs(window).max(1));
        }
        if let Ok(v) = HeaderValue::from_bytes(&field) {
            headers.append(RATELIMIT_POLICY, v);
        }
    }
    if decision.source != crate::Source::Fallback {
        field.clear();
        push_sf_string(&mut field, rule);
        push_param(&mut field, b"r", decision.remaining);
        if decision.reset_after != Duration::MAX {
            push_param(&mut field, b"t", ceil_secs(decision.reset_after));
        }
        if let Ok(v) = HeaderValue::from_bytes(&field) {
            headers.append(RATELIMIT, v);
        }
    }
    if !decision.allowed {
        insert_retry_after(headers, decision.retry_after);
    }
}

/// Writes the headers of `decision`, made by `rule` of `limiter` for `key`, with [`insert_headers`] and the
/// rule's quota for that key; nothing for a shadow rule, which stays invisible to clients (a client that read
/// `r=0` would slow down).
pub fn insert_decision_headers(headers: &mut HeaderMap, limiter: &Limiter, rule: &str, key: &str, decision: &Decision) {
    if !limiter.is_shadow(rule) {
        insert_headers(headers, rule, limiter.quota(rule, key), decision);
    }
}

/// Sets `Retry-After` to `retry_after` in whole seconds, rounded up; leaves it out for [`Duration::MAX`]
/// ("never").
pub fn insert_retry_after(headers: &mut HeaderMap, retry_after: Duration) {
    if retry_after != Duration::MAX {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(ceil_secs(retry_after)));
    }
}

/// The HTTP status for an error of the limiter: 404 for an unknown rule, 400 for an invalid argument or a cost
/// that can never be granted, 429 for a full queue, 503 when the limiter is shut down or its store failed,
/// 500 otherwise.
pub fn error_status(error: &Error) -> StatusCode {
    match error {
        Error::UnknownRule(_) => StatusCode::NOT_FOUND,
        Error::InvalidArgument { .. } | Error::CostAboveCapacity { .. } => StatusCode::BAD_REQUEST,
        Error::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
        Error::ShutDown | Error::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        Error::Config(_) | Error::EvictionPolicy { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A response with `status` and the JSON body `{"error": message}`.
pub fn error_response(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &serde_json::json!({ "error": message }))
}

/// A response with `status` and `body` as JSON (`Content-Type: application/json`).
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response<Body> {
    // Serializing a map of strings and numbers cannot fail; an empty body would be the answer if it did.
    let mut response = Response::new(Body::from(serde_json::to_vec(body).unwrap_or_default()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Where [`RateLimitLayer`] takes a request's key from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A request header (an API key, a user id set by an authenticating proxy, the client address your proxy
    /// sets, such as `X-Real-IP`); a request without it is answered 400. The whole value is the key, so use a
    /// header the proxy overwrites: a client can send its own `X-Forwarded-For`, which a proxy appends to, and
    /// get a new key on every request.
    Header(HeaderName),
    /// The peer's IP address, from axum's `ConnectInfo<SocketAddr>` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`; without it every request is answered 500).
    /// Behind a proxy, use [`KeySource::Header`] with the header the proxy sets instead.
    ClientIp,
    /// The request path (`/api/items/42`): one limit per resource.
    Path,
}

impl KeySource {
    /// The key of `request`, or the status and message to answer when it has none.
    fn key<B>(&self, request: &Request<B>) -> Result<String, (StatusCode, String)> {
        match self {
            Self::Header(name) => match request.headers().get(name).map(HeaderValue::to_str) {
                Some(Ok(v)) if !v.is_empty() => Ok(v.to_owned()),
                Some(Ok(_)) | None => Err((
                    StatusCode::BAD_REQUEST,
                    format!("the request has no `{name}` header, which this endpoint is rate limited by"),
                )),
                Some(Err(_)) => Err((
                    StatusCode::BAD_REQUEST,
                    format!("the `{name}` header is not visible ASCII"),
                )),
            },
            Self::ClientIp => match request.extensions().get::<ConnectInfo<SocketAddr>>() {
                Some(ConnectInfo(addr)) => Ok(addr.ip().to_string()),
                None => Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the server records no client addresses: serve with into_make_service_with_connect_info".into(),
                )),
            },
            Self::Path => Ok(request.uri().path().to_owned()),
        }
    }
}

#[derive(Debug, Clone)]
struct Settings {
    limiter: Limiter,
    rule: String,
    key: KeySource,
    cost: u64,
}

/// A tower layer that rate limits every request by `rule` of a [`Limiter`], keyed by a [`KeySource`].
///
/// An allowed request goes on to the inner service and its response gets the rate-limit headers (see the
/// [module](self)); a refused one is answered `429 Too Many Requests` with the same headers and `Retry-After`,
/// without reaching the inner service. A request with no key, or a limiter error, is answered with the status of
/// [`error_status`] and a JSON `{"error": ...}` body. A shadow rule ([`crate::Rule::shadow`]) lets everything
/// through.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tokenlease::Error> {
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tokenlease::http::{HeaderName, KeySource, RateLimitLayer};
/// use tokenlease::{Limiter, Rule};
///
/// let limiter = Limiter::builder()
///     .rule(Rule::token_bucket("api", 100, 10, Duration::from_secs(1))?)
///     .build()?;
/// let layer = RateLimitLayer::new(limiter, "api", KeySource::Header(HeaderName::from_static("x-api-key")));
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    settings: Arc<Settings>,
}

impl RateLimitLayer {
    /// Limits requests by `rule` of `limiter`, one token each, keyed by `key`.
    pub fn new(limiter: Limiter, rule: impl Into<String>, key: KeySource) -> Self {
        Self {
            settings: Arc::new(Settings {
                limiter,
                rule: rule.into(),
                key,
                cost: 1,
            }),
        }
    }

    /// Charges `cost` tokens per request instead of one.
    pub fn with_cost(self, cost: u64) -> Self {
        let mut settings = Arc::unwrap_or_clone(self.settings);
        settings.cost = cost;
        Self {
            settings: Arc::new(settings),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            settings: self.settings.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S, B> tower::Service<Request<B>> for RateLimit<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = self.settings.clone();
        Box::pin(async move {
            let key = match settings.key.key(&request) {
                Ok(key) => key,
                Err((status, message)) => return Ok(error_response(status, &message)),
            };
            let Settings {
                limiter, rule, cost, ..
            } = &*settings;
            let decision = match limiter.check(rule, &key, *cost).await {
                Ok(decision) => decision,
                Err(e) => return Ok(error_response(error_status(&e), &e.to_string())),
            };
            let mut response = if decision.allowed {
                inner.call(request).await?
            } else {
                let message = match decision.retry_after {
                    Duration::MAX => format!("rate limited by `{rule}`: this call can never pass"),
                    d => format!("rate limited by `{rule}`: retry after {} ms", d.as_millis()),
                };
                error_response(StatusCode::TOO_MANY_REQUESTS, &message)
            };
            insert_decision_headers(response.headers_mut(), limiter, rule, &key, &decision);
            Ok(response)
        })
    }
}
