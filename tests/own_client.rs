//! Bring your own client: a `RedisStore` made from the application's own `redis::Client` (plain, and built
//! with TLS certificates of its own) and `ConnectionManager`, against real redis-server processes: each decides
//! exactly, with scripts loaded by the store itself. The cluster's two (`ClusterClient`, cluster connection)
//! are in `tests/cluster.rs`, with the cluster it starts.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::Certs;
use common::RedisServer;
use tokenlease::{Limiter, RedisStore, Rule, Source};

const LIMIT: u64 = 5;

/// A limiter over `store` with one fixed window of [`LIMIT`] an hour.
fn limiter(store: RedisStore) -> Limiter {
    Limiter::builder()
        .rules([Rule::fixed_window("r", LIMIT, Duration::from_secs(3600)).expect("rule")])
        .store(Arc::new(store))
        .build()
        .expect("limiter")
}

/// `LIMIT + 3` checks of one key admit exactly `LIMIT`, decided by Redis (its refusal remembered locally).
async fn assert_exact(limiter: &Limiter, key: &str) {
    let mut admitted = 0;
    for _ in 0..LIMIT + 3 {
        let d = limiter.check("r", key, 1).await.expect("a decision");
        // Redis decides; its refusal is remembered until its retry_after, so later refusals are local.
        assert!(
            d.source == Source::Redis || (!d.allowed && d.source == Source::Local),
            "{d:?}"
        );
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_your_own_client_decides_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).expect("client");
    let store = RedisStore::from_client(client, Duration::from_secs(2)).expect("store");
    assert_exact(&limiter(store), "k").await;
    // The scripts were loaded by the store: the server ran them.
    assert!(server.script_calls() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_your_own_tls_client_decides_exactly() {
    let certs = Certs::generate();
    let server = RedisServer::start_tls(Some(certs.server(true)), &[]);
    let read = |p: &std::path::Path| std::fs::read(p).expect("PEM file");
    let tls = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: read(&certs.client_cert),
            client_key: read(&certs.client_key),
        }),
        root_cert: Some(read(&certs.ca)),
    };
    let client = redis::Client::build_with_tls(server.url(), tls).expect("TLS client");
    let store = RedisStore::from_client(client, Duration::from_secs(2)).expect("store");
    assert_exact(&limiter(store), "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_your_own_connection_manager_decides_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).expect("client");
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(20)));
    let manager = redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .expect("manager");
    let store = RedisStore::from_connection_manager(manager, Duration::from_secs(2));
    let limiter = limiter(store);
    assert_exact(&limiter, "k").await;
    // The manager reconnects by itself to the server once it is back (empty: its windows start again).
    let mut server = server;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !limiter
        .check("r", "probe", 1)
        .await
        .is_ok_and(|d| d.source == Source::Redis)
    {
        assert!(Instant::now() < deadline, "no decision from Redis after it came back");
        // real time: waits for the connection manager to reconnect to the restarted redis-server.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // This process remembers the refusal of "k" until its window's end (it may sell less, never more), so the
    // emptied server is asked about another key.
    assert_exact(&limiter, "k2").await;
}
