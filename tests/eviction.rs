//! Invariant 15, eviction is seen: a Redis whose `maxmemory-policy` may evict limiter keys (an evicted bucket
//! comes back full: overselling) is reported when the store connects, and refused at start with
//! `[redis] require_noeviction = true`. Real `redis-server` processes started with the policy under test.

mod common;

use std::time::{Duration, Instant};

use common::sentinel::RedisSentinel;
use common::RedisServer;
use tokenlease::{Config, Error, Limiter};

const RULE: &str = "\n[[rule]]\nname = \"post\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"\n";

fn config(url: &str, require: bool) -> Config {
    let toml = format!("[redis]\nurl = \"{url}\"\ntimeout = \"500ms\"\nrequire_noeviction = {require}\n{RULE}");
    Config::from_toml(&toml).expect("config")
}

fn evicting(policy: &str) -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy])
}

#[tokio::test]
async fn require_noeviction_refuses_a_policy_that_may_evict() {
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let server = evicting(policy);
        let err = Limiter::from_config(config(&server.url(), true)).expect_err(policy);
        assert!(
            matches!(&err, Error::EvictionPolicy { policy: p, node } if p == policy && node.ends_with(&server.port.to_string())),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("`maxmemory-policy` is `") && message.contains(policy),
            "{message}"
        );
    }
}

#[tokio::test]
async fn require_noeviction_accepts_noeviction_and_a_redis_that_refuses_config() {
    let plain = RedisServer::start();
    let managed = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    for server in [&plain, &managed] {
        let limiter = Limiter::from_config(config(&server.url(), true)).expect("a limiter");
        assert!(limiter.check("post", "user:1", 1).await.expect("check").allowed);
        assert_eq!(limiter.readiness().await.eviction_policy, None);
        limiter.shutdown().await;
    }
}

#[tokio::test]
async fn require_noeviction_needs_redis_up_at_start() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let err = Limiter::from_config(config(&url, true)).expect_err("Redis is down");
    assert!(
        matches!(err, Error::Store(_)) && err.to_string().contains("maxmemory-policy"),
        "{err}"
    );
    // Without it, the store connects lazily as ever.
    assert!(Limiter::from_config(config(&url, false)).is_ok());
}

/// Without `require_noeviction` the limiter runs, and reports the policy: in readiness (still ready), in the
/// gauge `tokenlease_redis_eviction_unsafe` and in a warning (`cli/tests/readiness.rs` reads both from the sidecar).
#[tokio::test]
async fn a_policy_that_may_evict_is_reported_when_not_required() {
    let server = evicting("allkeys-lru");
    let limiter = Limiter::from_config(config(&server.url(), false)).expect("a limiter");
    assert!(limiter.check("post", "user:1", 1).await.expect("check").allowed);
    // real time: the policy is read by the task that connects, beside the calls.
    let started = Instant::now();
    let readiness = loop {
        let readiness = limiter.readiness().await;
        if readiness.eviction_policy.is_some() || started.elapsed() > Duration::from_secs(5) {
            break readiness;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // real time: redis-server's CONFIG GET answer
    };
    assert_eq!(readiness.eviction_policy.as_deref(), Some("allkeys-lru"));
    assert!(readiness.ready, "{readiness:?}");
    limiter.shutdown().await;
}

/// Behind Sentinel the master it names is checked.
#[tokio::test]
async fn require_noeviction_checks_the_master_sentinel_names() {
    let master = evicting("allkeys-lfu");
    let sentinel = RedisSentinel::start(&master, "mymaster", 0);
    let toml = format!(
        "[redis]\nsentinel = {{ master_name = \"mymaster\", nodes = [\"{}\"] }}\nrequire_noeviction = true\n{RULE}",
        sentinel.url()
    );
    let err = Limiter::from_config(Config::from_toml(&toml).expect("config")).expect_err("allkeys-lfu");
    assert!(
        matches!(&err, Error::EvictionPolicy { policy, .. } if policy == "allkeys-lfu"),
        "{err:?}"
    );
}
