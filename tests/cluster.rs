//! Redis Cluster: a real 3-master cluster on loopback (`redis-server --cluster-enabled yes`, `redis-cli --cluster
//! create`), leases and per-user rules over keys spread across every master, keys holding braces, and a
//! resharding (`redis-cli --cluster reshard`) in the middle of a run: `MOVED` and `ASK` are followed, no decision
//! falls back, and no limit is exceeded.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::{Config, Limiter, Source};

/// A Redis Cluster of masters only, on free loopback ports; killed on drop.
struct RedisCluster {
    ports: Vec<u16>,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

/// A port that is free, and whose cluster bus port (+10000) is free too; a process-wide counter keeps tests
/// running side by side apart.
fn cluster_port(taken: &[u16]) -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = u64::from(std::process::id()) * 131;
    for _ in 0..2000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + u16::try_from((base + n * 7) % 20_000).unwrap_or(0);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if !taken.contains(&port) && free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free pair of ports for a cluster node");
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl RedisCluster {
    fn start(masters: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Vec::new();
        let mut children = Vec::new();
        for _ in 0..masters {
            let port = cluster_port(&ports);
            ports.push(port);
            children.push(spawn_node(dir.path(), port));
        }
        let cluster = Self {
            ports,
            children,
            _dir: dir,
        };
        for &port in &cluster.ports {
            let up = wait_for(Duration::from_secs(10), || cli(port, &["PING"]).contains("PONG"));
            assert!(up, "cluster node {port} did not start");
        }
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let ok = wait_for(Duration::from_secs(20), || {
            cluster
                .ports
                .iter()
                .all(|&p| cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        assert!(ok, "the cluster did not reach cluster_state:ok");
        cluster
    }

    fn config(&self, rules: &str) -> Config {
        self.config_with_timeout(rules, "2s")
    }

    fn config_with_timeout(&self, rules: &str, timeout: &str) -> Config {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        let toml = format!(
            "[redis]\ncluster = [{}]\ntimeout = \"{timeout}\"\nfail_mode = \"closed\"\nexpected_processes = 1\n{rules}",
            nodes.join(", ")
        );
        Config::from_toml(&toml).expect("cluster config")
    }

    fn keys_on(&self, port: u16) -> u64 {
        cli(port, &["DBSIZE"]).trim().parse().unwrap_or(0)
    }

    fn node_id(&self, port: u16) -> String {
        cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Moves `slots` hash slots from the node on `from` to the node on `to`, keys included (MIGRATE).
    fn reshard(&self, from: u16, to: u16, slots: u32) -> std::process::Output {
        Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.node_id(from), "--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster reshard")
    }
}

fn spawn_node(dir: &Path, port: u16) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"])
        .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (the README's test command installs it)")
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether `ok` holds within `limit` (polled every 50 ms).
fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    common::wait_for(limit, || ok().then_some(())).is_some()
}

const RULES: &str = r#"
[[rule]]
name = "sku_buy"
algorithm = "token_bucket"
capacity = 30
rate = 1
per = "1h"
lease = { min_batch = 10, max_batch = 10, ttl = "60s" }

[[rule]]
name = "like"
algorithm = "fixed_window"
limit = 5
window = "1h"
ban = "1h"

[[rule]]
name = "post"
algorithm = "sliding_log"
limit = 3
window = "1h"

[[rule]]
name = "view"
algorithm = "sliding_window"
limit = 4
window = "1h"
sub_buckets = 6
"#;

/// Calls `check` `calls` times on each key and returns, per key, how many were allowed; panics on a decision
/// the store did not make (a fallback means a call to the cluster failed).
async fn admitted(limiter: &Limiter, rule: &str, keys: &[String], calls: u32) -> HashMap<String, u32> {
    let mut allowed = HashMap::new();
    for key in keys {
        for _ in 0..calls {
            let d = limiter.check(rule, key, 1).await.expect("check");
            assert_ne!(d.source, Source::Fallback, "{rule} {key}: the cluster call failed");
            *allowed.entry(key.clone()).or_insert(0) += u32::from(d.allowed);
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_is_exact_on_keys_spread_over_every_master() {
    let cluster = RedisCluster::start(3);
    let limiter = Limiter::from_config(cluster.config(RULES)).expect("limiter");
    let users: Vec<String> = (0..40).map(|i| format!("user:{i}")).collect();
    let skus: Vec<String> = (0..12).map(|i| format!("sku:{i}")).collect();

    for (rule, keys, calls, limit) in [
        ("like", &users, 7, 5),
        ("post", &users, 5, 3),
        ("view", &users, 6, 4),
        ("sku_buy", &skus, 33, 30),
    ] {
        let allowed = admitted(&limiter, rule, keys, calls).await;
        for key in keys.iter() {
            assert_eq!(allowed[key], limit, "{rule} {key}");
        }
    }
    // The keys landed on every master.
    for &port in &cluster.ports {
        assert!(
            cluster.keys_on(port) > 10,
            "node {port} holds {} keys",
            cluster.keys_on(port)
        );
    }
    // A key holding braces keeps the rule's key and its ban key in one slot (else: CROSSSLOT, a fallback).
    let odd: Vec<String> = ["a}b", "{x", "}{", "{}", "{{y}}"].map(String::from).to_vec();
    let allowed = admitted(&limiter, "like", &odd, 7).await;
    assert!(odd.iter().all(|k| allowed[k] == 5), "{allowed:?}");
    limiter.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharding_mid_run_is_followed_without_fallback_or_excess() {
    let cluster = Arc::new(RedisCluster::start(3));
    let limiter = Limiter::from_config(cluster.config(RULES)).expect("limiter");
    let users: Vec<String> = (0..200).map(|i| format!("user:{i}")).collect();
    // Every key starts with one grant, so the slots being moved hold keys that MIGRATE must carry.
    let first = admitted(&limiter, "post", &users, 1).await;
    assert!(first.values().all(|&n| n == 1));

    let (from, to) = (cluster.ports[0], cluster.ports[1]);
    let keys_before = cluster.keys_on(to);
    let done = Arc::new(AtomicBool::new(false));
    let run = {
        let (limiter, users, done) = (limiter.clone(), users.clone(), done.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            let mut allowed: HashMap<String, u32> = HashMap::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            // Round after round over every key until the resharding is done (or a minute has passed).
            while rounds < 3 || (!done.load(Ordering::Acquire) && Instant::now() < deadline) {
                for (k, n) in admitted(&limiter, "post", &users, 1).await {
                    *allowed.entry(k).or_insert(0) += n;
                }
                rounds += 1;
            }
            (rounds, allowed)
        })
    };
    let reshard = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.reshard(from, to, 2000))
    };
    let out = reshard.await.expect("reshard thread");
    done.store(true, Ordering::Release);
    let (rounds, allowed) = run.await.expect("run");
    assert!(
        out.status.success(),
        "reshard: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(rounds >= 3, "only {rounds} rounds ran during the resharding");
    // 1 before and 2 more during the run, whichever node answered: never more than the limit of 3, none lost.
    for user in &users {
        assert_eq!(allowed[user] + first[user], 3, "{user}");
    }
    assert!(cluster.keys_on(to) > keys_before, "no key moved to node {to}");
    limiter.shutdown().await;
}

/// The connection is made in the background: calls that time out meanwhile (1 ms here, less than connecting to
/// three masters takes) decide by fail_mode and do not abort it, and decisions come from the cluster soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_timeout_does_not_keep_the_cluster_from_connecting() {
    let cluster = RedisCluster::start(3);
    let limiter = Limiter::from_config(cluster.config_with_timeout(RULES, "1ms")).expect("limiter");
    // real time: waits for the redis-server cluster's connection.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = limiter.check("like", "user:1", 1).await.expect("check");
        if d.source == Source::Redis {
            break;
        }
        assert!(Instant::now() < deadline, "never connected: still {:?}", d.source);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    limiter.shutdown().await;
}
