//! The gRPC listener of `serve --grpc-listen` (tonic over HTTP/2), bounded like the HTTP one (DESIGN.md
//! invariant 7): at most `[serve] max_connections` connections, shared with the HTTP listener (later clients wait in the
//! listen backlog), every
//! request answered or cut within [`REQUEST_TIMEOUT`], dead peers dropped by HTTP/2 and TCP keep-alive, and every
//! connection, busy or idle, closed after [`MAX_CONNECTION_AGE`] (gracefully, so a client reconnects in time; cut
//! [`MAX_CONNECTION_AGE_GRACE`] later), so that none holds a socket for ever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use futures_core::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, PollSemaphore};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use crate::rls::Rls;

/// The longest a request is served (tonic's server timeout; a client's shorter `grpc-timeout` wins); then it is
/// answered with an error status. Above the limiter's store timeouts.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How often an HTTP/2 ping checks a connection, and how long its answer may take before the connection is
/// closed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keep-alive: the kernel probes a silent peer after this long.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// A connection's lifetime: then it is asked to close (HTTP/2 GOAWAY; Envoy opens another).
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(600);

/// How long a connection asked to close may finish its requests before it is cut (above [`REQUEST_TIMEOUT`]).
const MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(30);

/// Streams (requests in flight) one connection may carry at once.
const MAX_STREAMS: u32 = 1024;

/// How long accepting pauses after an error (`EMFILE`: out of file descriptors), instead of retrying at once.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves `rls` on `listener` until `stop` is cancelled, then lets the requests in flight finish.
pub(crate) async fn serve(listener: TcpListener, rls: Rls, open: Arc<Semaphore>, stop: CancellationToken) {
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE));
    let incoming = Bounded {
        inner: incoming,
        slots: PollSemaphore::new(open),
        slot: None,
        pause: None,
    };
    let served = tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(MAX_CONNECTION_AGE_GRACE)
        .max_concurrent_streams(Some(MAX_STREAMS))
        .add_service(RateLimitServiceServer::new(rls))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    if let Err(e) = served {
        eprintln!("tokenlease serve: the gRPC listener stopped: {e}");
    }
}

/// Accepted connections, at most as many open at once as the semaphore has permits.
struct Bounded {
    inner: TcpIncoming,
    slots: PollSemaphore,
    /// The permit for the next connection, taken before accepting it.
    slot: Option<OwnedSemaphorePermit>,
    /// Set after an accept error: accepting waits for it.
    pause: Option<Pin<Box<Sleep>>>,
}

impl Stream for Bounded {
    type Item = io::Result<Held>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(pause) = &mut this.pause {
            ready!(pause.as_mut().poll(cx));
            this.pause = None;
        }
        if this.slot.is_none() {
            match ready!(this.slots.poll_acquire(cx)) {
                Some(slot) => this.slot = Some(slot),
                None => return Poll::Ready(None),
            }
        }
        match ready!(Pin::new(&mut this.inner).poll_next(cx)) {
            Some(Ok(tcp)) => match this.slot.take() {
                Some(slot) => Poll::Ready(Some(Ok(Held { tcp, _slot: slot }))),
                None => Poll::Ready(None),
            },
            Some(Err(e)) => {
                this.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_PAUSE)));
                Poll::Ready(Some(Err(e)))
            }
            None => Poll::Ready(None),
        }
    }
}

/// A connection holding its permit: closing it frees the slot.
struct Held {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Held {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp.connect_info()
    }
}

impl AsyncRead for Held {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Held {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
