//! `tokenlease serve`: the HTTP sidecar, so that services in any language share the very same buckets.
//!
//! | route | does |
//! | --- | --- |
//! | `POST /v1/check` `{rule, key, cost?}` | 200 or 429 with the decision as JSON and the rate-limit headers; cost 0 peeks |
//! | `POST /v1/check/batch` `{checks: [{rule, key, cost?}, ...]}` | up to [`MAX_BATCH`] checks in one round trip: 200 with `{decisions: [...]}`, each the body `/v1/check` would answer, or `{error, status}` |
//! | `POST /v1/reset` `{rule, key}` | forgets the key's state and ban ([`Limiter::reset`]): 200 |
//! | `POST /v1/acquire` `{rule, key, cost?}` | waits for a queue slot (at most the rule's `max_wait`): 200, or 429 |
//! | `GET /metrics` | the Prometheus metrics |
//! | `GET /livez` | 200 while the process answers (liveness) |
//! | `GET /readyz` | 200 while the store is deciding, 503 with the reason when not (readiness) |
//! | `GET /healthz` | the same as `/readyz` |
//!
//! With `--grpc-listen ADDR`, it also serves Envoy's Rate Limit Service over gRPC on `ADDR` ([`crate::rls`]).
//!
//! SIGHUP reloads the config file on a blocking thread, off the workers that answer requests (a file that does not
//! parse changes nothing); SIGTERM or Ctrl-C stop accepting requests, answer callers waiting in a queue 503, let the
//! other requests in flight finish (at most [`GRACE`]), and give every leased token back. Connections are bounded,
//! and so are header reads and idle sockets (`[serve]`, [`crate::connections`]); a body over [`MAX_BODY`] plus
//! `[process] max_key_bytes` is refused 413 from its `Content-Length`, before it is sent (`Expect: 100-continue`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokenlease::http::{error_response, error_status, insert_decision_headers, insert_retry_after, json_response};
use tokenlease::{Config, Decision, Error, Limiter};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;

use crate::rls::Routes;

/// Request bodies above this many bytes, plus `[process] max_key_bytes`, are refused (413).
const MAX_BODY: usize = 16 * 1024;

/// Checks one `/v1/check/batch` request may carry.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long requests in flight may take to finish after SIGTERM before the sidecar stops anyway.
const GRACE: Duration = Duration::from_secs(10);

/// How often the Prometheus recorder drains its histograms.
const UPKEEP: Duration = Duration::from_secs(5);

/// Serve the limiter over HTTP (check, acquire, /metrics, /livez, /readyz).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The config file; SIGHUP reloads it.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Address to listen on, for requests and /metrics [default: `[serve] listen`, else 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Also serve Envoy's Rate Limit Service (RLS v3, gRPC) on this address, for the rules with `[rule.rls]`
    /// [default: `[serve] grpc_listen`, else none].
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
}

/// The handlers' state, behind one `Arc`: axum clones the state for every request, and cloning the fields one by
/// one cost three reference counts, the cancellation token's under a lock.
#[derive(Clone)]
struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

struct Shared {
    limiter: Limiter,
    metrics: PrometheusHandle,
    /// Cancelled on SIGTERM: callers waiting in a queue are answered 503 at once.
    stop: CancellationToken,
}

pub(crate) fn run(args: Args) -> Result<ExitCode, String> {
    let config = Config::from_path(&args.config).map_err(|e| e.to_string())?;
    if config.rules.is_empty() {
        eprintln!(
            "tokenlease serve: warning: {}: {}",
            args.config.display(),
            crate::NO_RULE
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(args, config))
}

async fn serve(args: Args, config: Config) -> Result<ExitCode, String> {
    // The recorder goes in before the limiter registers its metric handles.
    let metrics = crate::prometheus_builder()?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    tokenlease::telemetry::describe();
    crate::requests::describe();
    let max_body = MAX_BODY + config.process.max_key_bytes;
    let connections = config.serve;
    // The flags override `[serve]`.
    let listen = args.listen.unwrap_or(connections.listen);
    let grpc_listen = args.grpc_listen.or(connections.grpc_listen);
    let max_connections = crate::connections::connection_bound(connections.max_connections);
    let routes: Routes = Arc::new(ArcSwap::from_pointee(config.rls.clone()));
    let limiter = Limiter::from_config(config).map_err(|e| e.to_string())?;
    let stop = CancellationToken::new();
    let state = AppState(Arc::new(Shared {
        limiter: limiter.clone(),
        metrics: metrics.clone(),
        stop: stop.clone(),
    }));
    // A batch's body may hold MAX_BATCH checks, each of a key of up to max_key_bytes.
    let max_batch_body = MAX_BODY + MAX_BATCH * (max_body - MAX_BODY + 64);
    let batch = Router::new()
        .route("/v1/check/batch", post(check_batch))
        .layer(DefaultBodyLimit::max(max_batch_body))
        .layer(RequestBodyLimitLayer::new(max_batch_body));
    let app = Router::new()
        .route("/v1/check", post(check))
        .route("/v1/acquire", post(acquire))
        .route("/v1/reset", post(reset))
        .route("/metrics", get(render_metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/healthz", get(readyz))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(RequestBodyLimitLayer::new(max_body))
        .merge(batch)
        .with_state(state.clone());
    // Signals are caught from before the socket is bound: none can kill the process with its default action.
    let watch = |kind: SignalKind| signal(kind).map_err(|e| format!("cannot watch signals: {e}"));
    let (terminate, interrupt, hangup) = (
        watch(SignalKind::terminate())?,
        watch(SignalKind::interrupt())?,
        watch(SignalKind::hangup())?,
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let grpc_listener = match grpc_listen {
        None => None,
        Some(grpc) => Some(
            tokio::net::TcpListener::bind(grpc)
                .await
                .map_err(|e| format!("cannot listen on {grpc}: {e}"))?,
        ),
    };
    eprintln!(
        "tokenlease serve: listening on http://{addr} ({}; at most {max_connections} connections, gRPC's included)",
        args.config.display()
    );
    if let Some(grpc) = &grpc_listener {
        let grpc = grpc.local_addr().map_err(|e| e.to_string())?;
        let rules = routes.load().len();
        eprintln!("tokenlease serve: Envoy RLS v3 (gRPC) on {grpc} ({rules} rules with [rule.rls])");
    }

    let background = tokio_util::task::TaskTracker::new();
    background.spawn(stop.clone().run_until_cancelled_owned(upkeep(metrics)));
    let reload = reload_on_sighup(hangup, limiter.clone(), routes.clone(), args.config);
    background.spawn(stop.clone().run_until_cancelled_owned(reload));
    // Not tracked: it outlives the graceful stop, to force the exit on a second signal.
    tokio::spawn(stop_on_signal(terminate, interrupt, stop.clone()));
    background.close();

    let hot = crate::connections::HotRoute {
        path: "/v1/check",
        max_body,
        handler: move |body| check(State(state.clone()), body),
    };
    // One bound for both listeners: a connection is a file descriptor whichever protocol it speaks.
    let open = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let requests = crate::requests::Requests::http();
    let server = crate::connections::serve(
        listener,
        (app, hot),
        connections,
        (open.clone(), requests),
        stop.clone(),
    );
    let grpc = async {
        if let Some(grpc) = grpc_listener {
            let rls = crate::rls::Rls::new(limiter.clone(), routes);
            crate::grpc::serve(grpc, rls, open, stop.clone()).await;
        }
    };
    tokio::select! {
        _ = async { tokio::join!(server, grpc) } => {}
        () = async { stop.cancelled().await; tokio::time::sleep(GRACE).await } => {
            eprintln!("tokenlease serve: requests still in flight after {GRACE:?}; stopping anyway");
        }
    }
    stop.cancel();
    limiter.shutdown().await;
    background.wait().await;
    eprintln!("tokenlease serve: stopped; leased tokens given back");
    Ok(ExitCode::SUCCESS)
}

/// Cancels `stop` on the first SIGTERM or SIGINT (Ctrl-C); exits at once on a second one, without waiting for
/// requests in flight or giving leased tokens back (they expire with their lease TTL).
async fn stop_on_signal(mut terminate: Signal, mut interrupt: Signal, stop: CancellationToken) {
    let mut either = async || {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    either().await;
    eprintln!("tokenlease serve: stopping (a second signal stops at once)");
    stop.cancel();
    either().await;
    eprintln!("tokenlease serve: second signal: exiting now; leased tokens return when their lease expires");
    std::process::exit(130);
}

/// Reloads `path` on every SIGHUP; a file that does not parse, or changes the store, keeps the rules in force.
/// Parsing and compiling run on a blocking thread (100 000 rules take seconds): requests keep being answered under
/// the rules in force until the new ones are swapped in, and the `[rule.rls]` routes right after them.
async fn reload_on_sighup(mut hangup: Signal, limiter: Limiter, routes: Routes, path: PathBuf) {
    while hangup.recv().await.is_some() {
        eprintln!("tokenlease serve: reloading {}", path.display());
        let (limiter, routes, file) = (limiter.clone(), routes.clone(), path.clone());
        let reloaded = tokio::task::spawn_blocking(move || {
            let config = Config::from_path(&file).map_err(Error::from)?;
            let rls = config.rls.clone();
            limiter.reload(config)?;
            routes.store(Arc::new(rls));
            Ok::<(), Error>(())
        })
        .await;
        match reloaded {
            Ok(Ok(())) => eprintln!("tokenlease serve: reloaded {}", path.display()),
            Ok(Err(e)) => eprintln!("tokenlease serve: kept the rules in force: {e}"),
            Err(e) => eprintln!("tokenlease serve: kept the rules in force: the reload failed: {e}"),
        }
    }
}

async fn upkeep(metrics: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP);
    loop {
        every.tick().await;
        metrics.run_upkeep();
    }
}

/// The body of `/v1/check` and `/v1/acquire`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    rule: String,
    key: String,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

impl Ask {
    /// Parses a request body; a bad one is answered 400 with serde's message (field, line and column).
    fn parse(body: &[u8]) -> Result<Self, Box<Response>> {
        serde_json::from_slice(body).map_err(|e| {
            let message = format!(
                "the body must be JSON {{\"rule\": string, \"key\": string, \"cost\": integer ≥ 0 (default 1; 0 peeks)}}: {e}"
            );
            Box::new(error_response(StatusCode::BAD_REQUEST, &message))
        })
    }
}

/// Milliseconds for JSON; `null` for "never".
fn ms(d: Duration) -> serde_json::Value {
    if d == Duration::MAX {
        serde_json::Value::Null
    } else {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

async fn check(State(state): State<AppState>, body: Bytes) -> Response {
    let ask = match Ask::parse(&body) {
        Ok(ask) => ask,
        Err(response) => return *response,
    };
    let decision: Decision = match state.limiter.check(&ask.rule, &ask.key, ask.cost).await {
        Ok(d) => d,
        Err(e) => return error_response(error_status(&e), &e.to_string()),
    };
    let status = if decision.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = json_response(status, &crate::answer::Checked::of(&decision));
    insert_decision_headers(response.headers_mut(), &state.limiter, &ask.rule, &ask.key, &decision);
    response
}

/// The body of `/v1/check/batch`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    checks: Vec<Ask>,
}

/// One answer of a batch: the decision as `/v1/check` answers it, or why the check failed.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum Answered {
    Decided(crate::answer::Checked),
    Failed { error: String, status: u16 },
}

/// `POST /v1/check/batch`: up to [`MAX_BATCH`] checks decided in one round trip, concurrently (checks of one key
/// are decided in their order: a hot key's decisions take no await), answered in their order. 200 with
/// `{"decisions": [...]}` whatever the decisions; 400 for a body that is not a batch or holds too many.
async fn check_batch(State(state): State<AppState>, body: Bytes) -> Response {
    let batch: Batch = match serde_json::from_slice(&body) {
        Ok(batch) => batch,
        Err(e) => {
            let message = format!(
                "the body must be JSON {{\"checks\": [{{\"rule\": string, \"key\": string, \"cost\": integer ≥ 0}}, ...]}}: {e}"
            );
            return error_response(StatusCode::BAD_REQUEST, &message);
        }
    };
    if batch.checks.len() > MAX_BATCH {
        let message = format!("a batch holds at most {MAX_BATCH} checks, not {}", batch.checks.len());
        return error_response(StatusCode::BAD_REQUEST, &message);
    }
    let limiter = &state.limiter;
    let decided = futures_util::future::join_all(batch.checks.iter().map(|ask| async move {
        match limiter.check(&ask.rule, &ask.key, ask.cost).await {
            Ok(decision) => Answered::Decided(crate::answer::Checked::of(&decision)),
            Err(e) => Answered::Failed {
                error: e.to_string(),
                status: error_status(&e).as_u16(),
            },
        }
    }))
    .await;
    json_response(StatusCode::OK, &Decided { decisions: decided })
}

/// The body answering a batch.
#[derive(Debug, serde::Serialize)]
struct Decided {
    decisions: Vec<Answered>,
}

async fn acquire(State(state): State<AppState>, body: Bytes) -> Response {
    let ask = match Ask::parse(&body) {
        Ok(ask) => ask,
        Err(response) => return *response,
    };
    // A client that hangs up drops this future, and with it its place in the queue; so does a SIGTERM, which
    // answers the waiting callers 503 at once instead of holding the shutdown for their turn.
    let acquired = tokio::select! {
        acquired = state.limiter.acquire(&ask.rule, &ask.key, ask.cost) => acquired,
        () = state.stop.cancelled() => Err(Error::ShutDown),
    };
    match acquired {
        Ok(permit) => json_response(
            StatusCode::OK,
            &json!({
                "waited_ms": ms(permit.waited),
                "cost": permit.cost,
                "source": permit.source.as_str(),
            }),
        ),
        Err(e) => {
            let mut response = error_response(error_status(&e), &e.to_string());
            if let Error::QueueFull { retry_after, .. } = e {
                insert_retry_after(response.headers_mut(), retry_after);
            }
            response
        }
    }
}

/// Forgets a key ([`Limiter::reset`]); a `cost` in the body is ignored.
async fn reset(State(state): State<AppState>, body: Bytes) -> Response {
    let ask = match Ask::parse(&body) {
        Ok(ask) => ask,
        Err(response) => return *response,
    };
    match state.limiter.reset(&ask.rule, &ask.key).await {
        Ok(()) => json_response(StatusCode::OK, &json!({ "reset": true })),
        Err(e) => error_response(error_status(&e), &e.to_string()),
    }
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    let mut response = state.metrics.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Liveness: the process answers (it does not ask the store: a failing Redis is no reason to restart it).
async fn livez() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

/// Readiness ([`Limiter::readiness`]): 200 while the store is deciding, 503 with the reason when not (a
/// `READONLY` or `OOM` reply, a timeout, an open circuit breaker). A `maxmemory-policy` that may evict limiter
/// keys is named in the body.
async fn readyz(State(state): State<AppState>) -> Response {
    let store = state.limiter.store_source().as_str();
    let readiness = state.limiter.readiness().await;
    let mut body = json!({ "status": "ok", "store": store });
    if let Some(policy) = &readiness.eviction_policy {
        body["maxmemory_policy"] = json!(policy);
        body["warning"] = json!("this maxmemory-policy may evict limiter keys: an evicted bucket comes back full");
    }
    if let Some(reason) = &readiness.reason {
        body["status"] = json!("unavailable");
        body["error"] = json!(reason);
    }
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body)
}
