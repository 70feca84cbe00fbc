//! Redis Cluster: a real 3-master cluster on loopback (`redis-server --cluster-enabled yes`, `redis-cli --cluster
//! create`), leases and per-user rules over keys spread across every master, keys holding braces, and a
//! resharding (`redis-cli --cluster reshard`) in the middle of a run: `MOVED` and `ASK` are followed, no decision
//! falls back, and no limit is exceeded. And 3 masters with a replica each, a master killed (kill -9) in the
//! middle of a run: decisions come back from the promoted replica by themselves.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::Certs;
use common::Tls;
use tokenlease::{Config, Limiter, RedisStore, Rule, Source};

/// A Redis Cluster on free loopback ports; killed on drop.
struct RedisCluster {
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    _dir: tempfile::TempDir,
    /// TLS only, between clients and nodes and on the cluster bus, when set.
    tls: Option<Certs>,
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

impl RedisCluster {
    /// Masters only, whose nodes are declared failing after 5 s.
    fn start(masters: usize) -> Self {
        Self::start_with(masters, 0, 5000)
    }

    /// Masters only, serving TLS only (`--port 0`, `tls-cluster yes`) with `certs`.
    fn start_tls(masters: usize, certs: &Certs) -> Self {
        Self::start_nodes(masters, 0, 5000, Some(certs.clone()))
    }

    /// `masters` masters with `replicas` replicas each, whose nodes are declared failing after `node_timeout_ms`
    /// (a replica is promoted soon after its master fails for that long).
    fn start_with(masters: usize, replicas: usize, node_timeout_ms: u32) -> Self {
        Self::start_nodes(masters, replicas, node_timeout_ms, None)
    }

    fn start_nodes(masters: usize, replicas: usize, node_timeout_ms: u32, tls: Option<Certs>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Vec::new();
        let mut children = Vec::new();
        let server_tls = tls.as_ref().map(|c| c.server(false));
        for _ in 0..masters * (1 + replicas) {
            let port = cluster_port(&ports);
            ports.push(port);
            children.push(Some(spawn_node(dir.path(), port, node_timeout_ms, server_tls.as_ref())));
        }
        let cluster = Self {
            ports,
            children,
            _dir: dir,
            tls,
        };
        for &port in &cluster.ports {
            let up = wait_for(Duration::from_secs(10), || {
                cluster.cli(port, &["PING"]).contains("PONG")
            });
            assert!(up, "cluster node {port} did not start");
        }
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(cluster.cli_tls())
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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
                .all(|&p| cluster.cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        assert!(ok, "the cluster did not reach cluster_state:ok");
        let synced = wait_for(Duration::from_secs(20), || {
            cluster.ports.iter().all(|&p| {
                let info = cluster.cli(p, &["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
        assert!(synced, "the replicas did not sync");
        cluster
    }

    /// The arguments of `redis-cli` to reach the nodes (`--tls ...` when they serve TLS).
    fn cli_tls(&self) -> Vec<String> {
        self.tls.as_ref().map(|c| c.server(false).cli).unwrap_or_default()
    }

    /// Runs `redis-cli` against the node on `port` and returns what it printed.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(self.cli_tls())
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `redis://127.0.0.1:port` (`rediss://` over TLS) of each node.
    fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        self.ports.iter().map(|p| format!("{scheme}://127.0.0.1:{p}")).collect()
    }

    /// Ports of the nodes that are masters now.
    fn masters(&self) -> Vec<u16> {
        let alive = self.ports.iter().zip(&self.children).filter(|(_, c)| c.is_some());
        alive
            .filter(|(&p, _)| self.cli(p, &["ROLE"]).starts_with("master"))
            .map(|(&p, _)| p)
            .collect()
    }

    /// Kills (kill -9) the node on `port`.
    fn kill(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node of the cluster");
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn config(&self, rules: &str) -> Config {
        self.config_with_timeout(rules, "2s")
    }

    fn config_with_timeout(&self, rules: &str, timeout: &str) -> Config {
        let nodes: Vec<String> = self.urls().iter().map(|u| format!("{u:?}")).collect();
        let tls = self.tls.as_ref().map(|c| c.toml(false)).unwrap_or_default();
        let toml = format!(
            "[redis]\ncluster = [{}]\n{tls}timeout = \"{timeout}\"\nfail_mode = \"closed\"\nexpected_processes = 1\n{rules}",
            nodes.join(", ")
        );
        Config::from_toml(&toml).expect("cluster config")
    }

    fn keys_on(&self, port: u16) -> u64 {
        self.cli(port, &["DBSIZE"]).trim().parse().unwrap_or(0)
    }

    fn node_id(&self, port: u16) -> String {
        self.cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
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

/// A cluster node on `port` (its bus on `port + 10000`), serving TLS only when `tls` is given.
fn spawn_node(dir: &Path, port: u16, node_timeout_ms: u32, tls: Option<&Tls>) -> Child {
    let port = port.to_string();
    let listen = match tls {
        None => vec!["--port".to_owned(), port.clone()],
        Some(tls) => {
            let tls_only = ["--port", "0", "--tls-port", &port, "--tls-cluster", "yes"];
            [tls_only.map(String::from).to_vec(), tls.args()].concat()
        }
    };
    Command::new("redis-server")
        .args(listen)
        .args(["--bind", "127.0.0.1"])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            &node_timeout_ms.to_string(),
        ])
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
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
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
        tokio::time::sleep(Duration::from_millis(20)).await; // real time: connecting to the cluster's masters
    }
    limiter.shutdown().await;
}

const FAILOVER_RULES: &str = r#"
[[rule]]
name = "post"
algorithm = "token_bucket"
capacity = 1000000
rate = 1
per = "1h"

[[rule]]
name = "sku"
algorithm = "token_bucket"
capacity = 1000000
rate = 1
per = "1h"
lease = { min_batch = 10, max_batch = 100, ttl = "60s" }
"#;

/// Milliseconds since `start`.
fn ms_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// 3 masters with a replica each; one master is killed (kill -9) while keys spread over every master are checked:
/// its replica is promoted, and every key is decided by the cluster again by itself, within a bounded time of the
/// promotion, with no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start_with(3, 1, 1000);
    let limiter = Limiter::from_config(cluster.config_with_timeout(FAILOVER_RULES, "200ms")).expect("limiter");
    let keys: Arc<Vec<String>> = Arc::new((0..40).map(|i| format!("user:{i}")).collect());
    // When (ms since the start) each key was last decided by the cluster.
    let decided: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..4 {
        let (limiter, keys, decided, stop) = (limiter.clone(), keys.clone(), decided.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Acquire) {
                for (i, key) in keys.iter().enumerate().filter(|(i, _)| i % 4 == t) {
                    let d = limiter.check("post", key, 1).await.expect("check");
                    if d.source == Source::Redis {
                        decided[i].fetch_max(ms_since(start), Ordering::Relaxed);
                    }
                    let _ = limiter.check("sku", key, 1).await.expect("check");
                }
                // real time: a steady load on the real cluster through the kill -9 and the failover.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }

    // real time: the cluster answers, then a master dies and its replica takes over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        decided.iter().all(|d| d.load(Ordering::Relaxed) > 0),
        "a key was never decided by the cluster"
    );
    let victim = cluster.masters()[0];
    let keys_on_victim = cluster.keys_on(victim);
    cluster.kill(victim);
    let killed_ms = ms_since(start);
    let promoted = common::wait_for(Duration::from_secs(30), || {
        (cluster.masters().len() == 3).then(|| ms_since(start))
    });
    let promoted_ms = promoted.expect("no replica was promoted");
    let back = common::wait_for(Duration::from_secs(10), || {
        decided
            .iter()
            .all(|d| d.load(Ordering::Relaxed) > promoted_ms)
            .then(|| ms_since(start))
    });
    stop.store(true, Ordering::Release);
    while let Some(ended) = tasks.join_next().await {
        ended.expect("no check failed or panicked");
    }
    let back_ms = back.unwrap_or_else(|| panic!("keys not decided by the cluster within 10 s of the promotion"));
    eprintln!(
        "cluster failover: master {victim} ({keys_on_victim} keys) killed at {killed_ms} ms, its replica promoted \
         at {promoted_ms} ms (+{} ms), every key decided by the cluster again at {back_ms} ms (+{} ms)",
        promoted_ms - killed_ms,
        back_ms.saturating_sub(promoted_ms)
    );
    limiter.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_over_tls_decides_exactly_on_every_master() {
    let certs = Certs::generate();
    let cluster = RedisCluster::start_tls(3, &certs);
    let limiter = Limiter::from_config(cluster.config(RULES)).expect("limiter");
    let users: Vec<String> = (0..20).map(|i| format!("user:{i}")).collect();
    let allowed = admitted(&limiter, "like", &users, 7).await;
    for user in &users {
        assert_eq!(allowed[user], 5, "like {user}");
    }
    for port in cluster.masters() {
        assert!(cluster.keys_on(port) > 0, "no key on the master on {port}");
    }
}

/// A limiter over `store` with one fixed window of 5 an hour.
fn limiter_on(store: RedisStore) -> Limiter {
    Limiter::builder()
        .rules([Rule::fixed_window("like", 5, Duration::from_secs(3600)).expect("rule")])
        .store(Arc::new(store))
        .build()
        .expect("limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_your_own_cluster_client_or_connection_decides_exactly() {
    let cluster = RedisCluster::start(3);
    let client = redis::cluster::ClusterClient::builder(cluster.urls())
        .response_timeout(Duration::from_secs(20))
        .build()
        .expect("cluster client");
    let connection = client.get_async_connection().await.expect("cluster connection");
    let stores = [
        (
            "client",
            RedisStore::from_cluster_client(client, Duration::from_secs(2)).expect("store"),
        ),
        (
            "connection",
            RedisStore::from_cluster_connection(connection, Duration::from_secs(2)),
        ),
    ];
    for (made_from, store) in stores {
        let limiter = limiter_on(store);
        let users: Vec<String> = (0..20).map(|i| format!("{made_from}:{i}")).collect();
        let allowed = admitted(&limiter, "like", &users, 7).await;
        for user in &users {
            assert_eq!(allowed[user], 5, "{made_from}: like {user}");
        }
    }
    for port in cluster.masters() {
        assert!(cluster.keys_on(port) > 0, "no key on the master on {port}");
    }
}
