//! TLS to Redis (`rediss://`, `[redis] tls_ca_file`, `tls_cert_file`, `tls_key_file`), against real redis-server
//! and redis-sentinel processes serving TLS only (`--port 0 --tls-port`), with an authority and certificates the
//! test generates (`common/tls.rs`): a limiter over one server decides exactly; an authority that did not sign the
//! server's certificate is an error, in time; a server that requires a client certificate refuses a client
//! without one and serves one with it; a Sentinel and its master over TLS decide exactly; bad files are
//! configuration errors naming the file (`check-config` too), with the password still redacted. The cluster over
//! TLS is in `tests/cluster.rs`, with the cluster it starts.

mod common;

use std::time::Duration;

use common::sentinel::RedisSentinel;
use common::tls::Certs;
use common::RedisServer;
use tokenlease::{Config, Decision, Error, Limiter, Source};

/// A fixed window of `LIMIT` an hour: exact however the calls are spread.
const LIMIT: u32 = 5;
const RULE: &str = "[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n";
/// Long enough for a handshake on a loaded machine; the checks that must fail are bounded by [`BOUND`].
const TIMEOUT: &str = "500ms";
/// The longest a failing check may take (it must fail, not hang).
const BOUND: Duration = Duration::from_secs(10);

/// `[redis]` with `store` (e.g. `url = "rediss://..."`), closed on failure, and `tls` keys.
fn config(store: &str, tls: &str) -> Config {
    let toml = format!(
        "[redis]\n{store}\n{tls}timeout = \"{TIMEOUT}\"\nfail_mode = \"closed\"\nexpected_processes = 1\n{RULE}"
    );
    Config::from_toml(&toml).expect("a valid config")
}

/// `calls` checks of one key, each bounded by [`BOUND`].
async fn check(limiter: &Limiter, key: &str, calls: u32) -> Vec<Result<Decision, Error>> {
    let mut out = Vec::new();
    for _ in 0..calls {
        let decision = tokio::time::timeout(BOUND, limiter.check("r", key, 1)).await;
        out.push(decision.expect("a check over TLS hung past its bound"));
    }
    out
}

/// Asserts that checks are refused by the fallback (closed: the store failed), in time, and that readiness says
/// why; returns the reason.
async fn assert_refused(limiter: &Limiter, key: &str) -> String {
    for result in check(limiter, key, 2).await {
        let d = result.expect("a decision");
        assert!(
            d.source == Source::Fallback && !d.allowed,
            "refused as the store failed: {d:?}"
        );
    }
    let readiness = tokio::time::timeout(BOUND, limiter.readiness())
        .await
        .expect("readiness in time");
    assert!(!readiness.ready);
    let reason = readiness.reason.expect("why it is not ready");
    eprintln!("not ready: {reason}");
    reason
}

/// Asserts that `LIMIT + 3` checks admit exactly `LIMIT`, each decided by Redis.
async fn assert_exact(limiter: &Limiter, key: &str) {
    let decisions = check(limiter, key, LIMIT + 3).await;
    let mut admitted = 0;
    for d in decisions {
        let d = d.expect("a decision over TLS");
        // Redis decides; its refusal is remembered until its retry_after, so later refusals are local.
        let by_redis = d.source == Source::Redis || (!d.allowed && d.source == Source::Local);
        assert!(by_redis, "decided by Redis: {d:?}");
        admitted += u32::from(d.allowed);
    }
    assert_eq!(admitted, LIMIT, "admitted of {}", LIMIT + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_over_rediss_decides_exactly() {
    let certs = Certs::generate();
    let server = RedisServer::start_tls(Some(certs.server(false)), &[]);
    // require_noeviction: the policy is read over TLS too, before the limiter is made.
    let tls = format!("{}require_noeviction = true\n", certs.toml(false));
    let limiter = Limiter::from_config(config(&format!("url = {:?}", server.url()), &tls)).expect("limiter");
    assert_exact(&limiter, "a").await;
    // The keys are on the server, which serves TLS only.
    assert!(server.cmd(&["DBSIZE"]).is_some_and(|n| n.trim() != "0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_that_did_not_sign_the_server_is_an_error_in_time() {
    let certs = Certs::generate();
    let server = RedisServer::start_tls(Some(certs.server(false)), &[]);
    let wrong = format!("tls_ca_file = {:?}\n", certs.wrong_ca.display().to_string());
    let limiter = Limiter::from_config(config(&format!("url = {:?}", server.url()), &wrong)).expect("limiter");
    let reason = assert_refused(&limiter, "a").await;
    assert!(reason.contains("certificate"), "the error says why: {reason}");
    // Nothing was written through it.
    assert_eq!(
        server.cmd(&["DBSIZE"]).map(|n| n.trim().to_owned()).as_deref(),
        Some("0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_client_certificate_missing_fails_and_given_works() {
    let certs = Certs::generate();
    let server = RedisServer::start_tls(Some(certs.server(true)), &[]);
    let url = format!("url = {:?}", server.url());
    let without = Limiter::from_config(config(&url, &certs.toml(false))).expect("limiter");
    let reason = assert_refused(&without, "a").await;
    assert!(reason.contains("CertificateRequired"), "the error says why: {reason}");
    let with = Limiter::from_config(config(&url, &certs.toml(true))).expect("limiter");
    assert_exact(&with, "a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_and_its_master_over_tls_decide_exactly() {
    let certs = Certs::generate();
    let master = RedisServer::start_tls(Some(certs.server(false)), &[]);
    let sentinel = RedisSentinel::start(&master, "tlsmaster", 0);
    assert!(sentinel.url().starts_with("rediss://"));
    let store = format!(
        "sentinel = {{ master_name = \"tlsmaster\", nodes = [{:?}] }}",
        sentinel.url()
    );
    // require_noeviction: the master the Sentinel names is found, and its policy read, over TLS.
    let tls = format!("{}require_noeviction = true\n", certs.toml(true));
    let limiter = Limiter::from_config(config(&store, &tls)).expect("limiter");
    assert_exact(&limiter, "a").await;
    assert!(master.cmd(&["DBSIZE"]).is_some_and(|n| n.trim() != "0"));
}

#[test]
fn bad_tls_files_are_config_errors_naming_the_file() {
    let certs = Certs::generate();
    let dir = tempfile::tempdir().expect("temp dir");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let missing = dir.path().join("missing.pem");
    let url = "url = \"rediss://:s3cret@127.0.0.1:6380\"";
    let quoted = |p: &std::path::Path| format!("{:?}", p.display().to_string());
    let cases = [
        (
            format!("tls_ca_file = {}\n", quoted(&missing)),
            "tls_ca_file",
            "missing.pem",
        ),
        (
            format!("tls_ca_file = {}\n", quoted(&garbage)),
            "tls_ca_file",
            "garbage.pem",
        ),
        (
            format!("tls_cert_file = {}\n", quoted(&certs.client_cert)),
            "tls_key_file",
            "tls_cert_file",
        ),
        (
            format!(
                "tls_cert_file = {}\ntls_key_file = {}\n",
                quoted(&certs.client_cert),
                quoted(&garbage)
            ),
            "tls_key_file",
            "garbage.pem",
        ),
    ];
    for (tls, field, named) in cases {
        let toml = format!("[redis]\n{url}\n{tls}{RULE}");
        let error = Config::from_toml(&toml).expect_err("bad TLS files").to_string();
        assert!(error.contains(field) && error.contains(named), "{error}");
        assert!(!error.contains("s3cret"), "the password is shown: {error}");
    }
    // TLS files with a redis:// URL would be ignored: refused.
    let plain = format!(
        "[redis]\nurl = \"redis://:s3cret@127.0.0.1:6379\"\n{}{RULE}",
        certs.toml(false)
    );
    let error = Config::from_toml(&plain)
        .expect_err("TLS files without rediss://")
        .to_string();
    assert!(error.contains("rediss://") && !error.contains("s3cret"), "{error}");
}
