//! An axum service rate limited by [`RateLimitLayer`]: `GET /hello` by client IP, `POST /upload` by the
//! `x-user-id` header. Runs on the in-process store; give it a `[redis]` config to share the limits between
//! processes.
//!
//! ```sh
//! cargo run --release --example tower_layer -- 127.0.0.1:3000
//! curl -i localhost:3000/hello                                    # 200, then 429 after 5 in 10 s
//! curl -i -X POST -H 'x-user-id: 7' localhost:3000/upload         # 200, then 429 after 3 per minute
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tokenlease::http::{HeaderName, KeySource, RateLimitLayer};
use tokenlease::{Limiter, Rule};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into())
        .parse()?;
    let limiter = Limiter::builder()
        .rule(Rule::fixed_window("hello_per_ip", 5, Duration::from_secs(10))?)
        .rule(Rule::sliding_log("upload_per_user", 3, Duration::from_secs(60))?)
        .build()?;

    let hello = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(
            limiter.clone(),
            "hello_per_ip",
            KeySource::ClientIp,
        ));
    let upload = Router::new()
        .route("/upload", post(|| async { "stored\n" }))
        .layer(RateLimitLayer::new(
            limiter.clone(),
            "upload_per_user",
            KeySource::Header(HeaderName::from_static("x-user-id")),
        ));
    let app = hello.merge(upload);

    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    limiter.shutdown().await;
    Ok(())
}
