//! The sidecar's connections: accepted up to a bound, served by hyper's HTTP/1 with a header-read timeout, closed
//! when idle, drained on shutdown (DESIGN.md invariant 7: the sidecar bounds connections, header reads and idle
//! sockets).
//!
//! hyper gives the header-read timeout (`http1::Builder::header_read_timeout`, whose clock starts when the
//! connection is ready for a request: accepted, or its previous response sent) and the graceful shutdown
//! (hyper-util's `GracefulShutdown`); axum's `Listener` accepts and retries on errors (`EMFILE` included). hyper has
//! no idle timeout of its own (hyperium/hyper#1628, #3828), so [`IdleTimeout`] makes a connection that waits for a
//! request and receives no byte of it read as closed, which hyper takes as the client's goodbye. A client that
//! hangs up while its request is served is seen by hyper (EOF on a busy connection: `half_close` stays off), which
//! then drops the request's future, and with it a waiting `acquire` and its place in the queue.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::FromRequest;
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use axum::Router;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokenlease::ServeConfig;

use crate::requests::Requests;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::Service;

/// File descriptors kept free of connections: Redis connections, the listener, the config file on reload.
const RESERVED_FDS: u64 = 64;

/// The bound on open connections: `[serve] max_connections`, lowered to the process's open-file limit less
/// [`RESERVED_FDS`], so that the sidecar never runs out of file descriptors for Redis or the config file.
pub(crate) fn connection_bound(configured: usize) -> usize {
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    match open_files {
        Some(limit) => {
            let room = usize::try_from(limit.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
            configured.min(room.max(1))
        }
        None => configured,
    }
}

/// One route answered without going through the router: `POST path` with a body of a known length of at most
/// `max_body` bytes is handed, read, to `handler`; any other request (another route or method, a chunked or larger
/// body) goes to the router, which answers it as before (413 for a body over its limit, among others).
///
/// The router costs about a microsecond per request in clones of its boxed services, boxed futures, body-limit
/// wrappers and extension maps: a fifth of the sidecar's own CPU time on `/v1/check`, the one hot route.
pub(crate) struct HotRoute<H> {
    /// The path, matched exactly.
    pub(crate) path: &'static str,
    /// The largest body handed to `handler`, in bytes: the router's own limit.
    pub(crate) max_body: usize,
    /// Answers the request's body.
    pub(crate) handler: H,
}

impl<H> HotRoute<H> {
    /// Whether `request` takes this route: `POST` to the path, with a body whose length hyper knows (from
    /// `Content-Length`) and that fits `max_body`.
    fn takes(&self, request: &Request<Incoming>) -> bool {
        request.method() == Method::POST
            && request.uri().path() == self.path
            && request
                .body()
                .size_hint()
                .exact()
                .is_some_and(|n| usize::try_from(n).is_ok_and(|n| n <= self.max_body))
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then stops accepting and waits for the connections to
/// finish their requests in flight (idle ones close at once). At most as many connections are open at once as
/// `open` has permits, which the gRPC listener shares
/// (see [`connection_bound`]); later clients wait in the listen backlog. Requests that `hot` takes skip the
/// router.
pub(crate) async fn serve<H, F>(
    mut listener: TcpListener,
    (app, hot): (Router, HotRoute<H>),
    settings: ServeConfig,
    (open, requests): (Arc<Semaphore>, Requests),
    stop: CancellationToken,
) where
    H: Fn(Bytes) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let hot = Arc::new(hot);
    let mut http = http1::Builder::new();
    // half_close off (hyper's default, said here because a waiting `acquire` relies on it): a client's EOF while
    // its request is served ends the connection and drops the request's future.
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .half_close(false);
    let graceful = GracefulShutdown::new();
    loop {
        let next = async {
            let slot = open.clone().acquire_owned().await;
            let (tcp, _peer) = Listener::accept(&mut listener).await;
            (slot, tcp)
        };
        let (slot, tcp) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = next => accepted,
        };
        // The semaphore is never closed; the arm is there for the type.
        let Ok(slot) = slot else { break };
        let busy = Busy::default();
        let io = TokioIo::new(IdleTimeout::new(tcp, settings.idle_timeout, busy.clone()));
        let (router, hot, requests) = (app.clone(), hot.clone(), requests.clone());
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let serving = busy.enter();
            let started = Instant::now();
            let requests = requests.clone();
            let route = if hot.takes(&request) {
                Ok(hot.clone())
            } else {
                Err(router.clone())
            };
            async move {
                let response = match route {
                    // axum's own extractor reads the body, so a body that fails to arrive is answered as the
                    // router would answer it.
                    Ok(hot) => match Bytes::from_request(request.map(Body::new), &()).await {
                        Ok(body) => Ok((hot.handler)(body).await),
                        Err(rejection) => Ok(rejection.into_response()),
                    },
                    Err(mut router) => router.call(request).await,
                };
                drop(serving);
                if let Ok(response) = &response {
                    requests.record(response.status().as_str(), started.elapsed());
                }
                response
            }
        });
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection closed");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Requests of one connection being served (read, handled, not yet answered).
#[derive(Debug, Default, Clone)]
struct Busy(Arc<AtomicUsize>);

impl Busy {
    /// Counts a request until the guard is dropped (answered, or dropped with the connection).
    fn enter(&self) -> Serving {
        self.0.fetch_add(1, Ordering::Relaxed);
        Serving(self.0.clone())
    }

    fn is_idle(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0
    }
}

/// A request being served; see [`Busy::enter`].
struct Serving(Arc<AtomicUsize>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection that reads as closed once it has waited `idle` for a request without receiving a byte of it:
/// the keep-alive timeout hyper lacks. The wait starts when the connection is accepted and when a response is
/// written; a byte read ends it; it never ends a connection with a request being served.
///
/// Its timer is moved lazily: a response written only notes the time, and a timer that fires before the wait it
/// was set for has lasted `idle` is set again for the end of the wait (tokio's own advice for deadlines that move
/// often; moving the timer on every response cost a timer-wheel removal and insertion per request).
struct IdleTimeout<T> {
    io: T,
    idle: Duration,
    /// Whether the connection waits for a request (no byte of it read yet).
    waiting: bool,
    /// When the current wait started.
    since: Instant,
    /// Fires no later than `since + idle`.
    deadline: Pin<Box<Sleep>>,
    busy: Busy,
}

impl<T> IdleTimeout<T> {
    fn new(io: T, idle: Duration, busy: Busy) -> Self {
        let since = Instant::now();
        Self {
            io,
            idle,
            waiting: true,
            since,
            deadline: Box::pin(tokio::time::sleep_until(since + idle)),
            busy,
        }
    }

    /// A response was written: the connection waits for the next request from now.
    fn wait_again(&mut self) {
        self.waiting = true;
        self.since = Instant::now();
    }

    /// Ready once the current wait has lasted `idle`; a timer that fires earlier (it was set for an earlier
    /// wait) is set again for the end of this one.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let end = self.since + self.idle;
        while self.deadline.as_mut().poll(cx).is_ready() {
            if self.deadline.deadline() >= end {
                return Poll::Ready(());
            }
            self.deadline.as_mut().reset(end);
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.waiting = false;
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.waiting && this.busy.is_idle() => match this.poll_idle(cx) {
                // Nothing read into `buf`: the end of the stream.
                Poll::Ready(()) => Poll::Ready(Ok(())),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.wait_again();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.wait_again();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
