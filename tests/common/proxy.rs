//! A delaying TCP proxy for tests and benchmarks: added network latency in front of a loopback Redis.
//!
//! [`DelayProxy::start`] listens on a free `127.0.0.1` port and forwards every connection to `127.0.0.1:upstream`.
//! Every chunk read in either direction is written on `delay` later, where `delay` is the **one-way** delay: a
//! request/reply round trip costs `2 × delay` more. Each direction is a reader task and a writer task joined by a
//! channel of `(due, chunk)`: the reader goes on reading while earlier chunks wait, so chunks are delayed, not
//! serialized, and each direction keeps its order.
//!
//! The last stretch of each wait is a `std::thread::sleep` on tokio's blocking pool rather than a tokio timer:
//! tokio's timers tick in whole milliseconds, which would turn "0.5 ms one way" into 1–2 ms.
//!
//! It runs on its own thread with its own tokio runtime (so it works under any test's runtime, or none), the
//! delay can be changed while it runs ([`DelayProxy::set_delay`]; chunks read from then on get the new one), and
//! dropping it stops it and closes every connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A running proxy; stops on drop.
pub struct DelayProxy {
    port: u16,
    delay_us: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// Proxies a free loopback port to `127.0.0.1:upstream_port`, delaying each direction by `one_way`.
    pub fn start(upstream_port: u16, one_way: Duration) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy port");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let port = listener.local_addr().expect("proxy addr").port();
        let delay_us = Arc::new(AtomicU64::new(micros(one_way)));
        let (stop, stopped) = oneshot::channel::<()>();
        let delay = delay_us.clone();
        let thread = std::thread::Builder::new()
            .name(format!("delay-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, upstream_port, delay) => {}
                    }
                });
                // Drops every connection's tasks, hence their sockets; a sleep in progress ends within `delay`.
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("proxy thread");
        Self {
            port,
            delay_us,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sets the one-way delay (a round trip costs twice this) for chunks read from now on.
    pub fn set_delay(&self, one_way: Duration) {
        self.delay_us.store(micros(one_way), Ordering::Relaxed);
    }

    /// The one-way delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn accept_loop(listener: TcpListener, upstream_port: u16, delay_us: Arc<AtomicU64>) {
    while let Ok((client, _)) = listener.accept().await {
        let delay_us = delay_us.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                return; // upstream down: dropping `client` closes it, as a dead server would
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            // Each direction ends when its reader sees EOF or an error; the other may go on (half-close).
            tokio::join!(
                pipe(client_read, server_write, delay_us.clone()),
                pipe(server_read, client_write, delay_us),
            );
        });
    }
}

/// One direction: reads chunks as they come and writes each at its read time plus the delay, in order.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_us: Arc<AtomicU64>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        loop {
            let mut buf = vec![0u8; 16 * 1024];
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break, // dropping `tx` lets the writer flush what is queued, then stop
                Ok(n) => {
                    buf.truncate(n);
                    let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::Relaxed));
                    if tx.send((due, buf)).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            sleep_until(due).await; // real time: the network latency the proxy adds to a real socket
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Sleeps until `due` to within about 0.1 ms: a tokio timer for all but the last 2 ms, then a thread sleep.
async fn sleep_until(due: Instant) {
    const COARSE_MARGIN: Duration = Duration::from_millis(2);
    let now = Instant::now();
    if due <= now {
        return;
    }
    if due - now > COARSE_MARGIN {
        // real time (the proxy's own runtime is never paused): the latency, but its last 2 ms.
        tokio::time::sleep_until(due - COARSE_MARGIN).await;
    }
    let rest = due.saturating_duration_since(Instant::now());
    if !rest.is_zero() {
        // real time: the last stretch, to within about 0.1 ms.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}
