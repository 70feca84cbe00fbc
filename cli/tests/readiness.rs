//! Liveness, readiness and eviction, end to end: the `tokenlease serve` sidecar as a separate process on real
//! `redis-server` processes. `/livez` answers while the process does; `/readyz` (and its alias `/healthz`) is
//! 503 with the reason while Redis refuses writes (`READONLY`, `OOM`) and 200 again once it accepts them; a
//! `maxmemory-policy` that may evict limiter keys is a warning, a gauge and a readiness note, and with
//! `require_noeviction = true` a start-up error of `serve` and `flash-sale`.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::RedisServer;
use serde_json::Value;
use serve::Serve;

const RULE: &str = "\n[[rule]]\nname = \"sku\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrate = 1\nper = \"1h\"\nlease = { min_batch = 5, max_batch = 10, ttl = \"60s\" }\n";

fn config(url: &str, require_noeviction: bool) -> String {
    format!("[redis]\nurl = \"{url}\"\ntimeout = \"500ms\"\nrequire_noeviction = {require_noeviction}\n{RULE}")
}

/// A status and a body.
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// A `tokenlease serve` process on a free loopback port, killed on drop.
struct Sidecar {
    serve: Serve,
    port: u16,
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

impl Sidecar {
    fn start(config: &str) -> Self {
        let port = common::free_port();
        let serve = Serve::spawn(config, &[], |c| {
            c.args(["--listen", &format!("127.0.0.1:{port}")]);
        });
        let serve = serve.wait_up(|_| get(port, "/livez").status == 200);
        Self { serve, port }
    }

    fn get(&self, path: &str) -> Answer {
        get(self.port, path)
    }

    /// The value of an unlabelled gauge in `/metrics`.
    fn gauge(&self, name: &str) -> Option<f64> {
        let metrics = self.get("/metrics").body;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    fn log(&self) -> String {
        self.serve.log()
    }

    /// Polls `path` until it answers `status`, for at most `limit`; returns the answer and when it came.
    fn until(&self, path: &str, status: u16, limit: Duration) -> (Answer, Duration) {
        let started = Instant::now();
        loop {
            let answer = self.get(path);
            if answer.status == status || started.elapsed() > limit {
                return (answer, started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50)); // real time: polls the sidecar process over HTTP
        }
    }
}

/// `GET path` of the sidecar on `port` (status 0 and the error when it does not answer).
fn get(port: u16, path: &str) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    match agent.get(format!("http://127.0.0.1:{port}{path}")).call() {
        Ok(mut response) => Answer {
            status: response.status().as_u16(),
            body: response.body_mut().read_to_string().unwrap_or_default(),
        },
        Err(e) => Answer {
            status: 0,
            body: e.to_string(),
        },
    }
}

#[test]
fn readyz_follows_whether_redis_accepts_writes_and_livez_the_process() {
    let redis = RedisServer::start();
    let other = RedisServer::start();
    let sidecar = Sidecar::start(&config(&redis.url(), false));
    for path in ["/livez", "/readyz", "/healthz"] {
        let answer = sidecar.get(path);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert_eq!(answer.json()["status"], "ok", "{path}");
    }
    assert_eq!(sidecar.gauge("tokenlease_store_ready"), Some(1.0));

    // Demoted to a replica: not ready within 5 s, with the reason; alive all along.
    let port = other.port.to_string();
    redis.cmd(&["REPLICAOF", "127.0.0.1", &port]).expect("REPLICAOF");
    let (down, after) = sidecar.until("/readyz", 503, Duration::from_secs(5));
    assert_eq!(down.status, 503, "/readyz stayed {} {}", down.status, down.body);
    assert!(after < Duration::from_secs(5));
    let reason = down.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        reason.contains("readonly") && reason.contains("read only replica"),
        "{reason}"
    );
    assert_eq!(sidecar.get("/healthz").status, 503, "/healthz is readiness");
    assert_eq!(sidecar.get("/livez").status, 200);
    assert_eq!(sidecar.gauge("tokenlease_store_ready"), Some(0.0));

    // A master again: ready again, by itself.
    redis.cmd(&["REPLICAOF", "NO", "ONE"]).expect("REPLICAOF NO ONE");
    let (up, _) = sidecar.until("/readyz", 200, Duration::from_secs(5));
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(sidecar.gauge("tokenlease_store_ready"), Some(1.0));

    // Out of memory (noeviction over maxmemory): not ready either, with the reason.
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]).expect("CONFIG SET");
    let (oom, _) = sidecar.until("/readyz", 503, Duration::from_secs(5));
    assert_eq!(oom.status, 503, "{}", oom.body);
    let reason = oom.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("(oom)") && reason.contains("OOM"), "{reason}");
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]).expect("CONFIG SET");
    assert_eq!(sidecar.until("/readyz", 200, Duration::from_secs(5)).0.status, 200);
    assert_eq!(sidecar.get("/livez").status, 200);
}

#[test]
fn an_evicting_policy_is_a_warning_a_gauge_and_a_readiness_note() {
    let evicting = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let sidecar = Sidecar::start(&config(&evicting.url(), false));
    // real time: the policy is read by the task that connects.
    let flagged = common::wait_for(Duration::from_secs(5), || {
        (sidecar.gauge("tokenlease_redis_eviction_unsafe") == Some(1.0)).then_some(())
    });
    assert!(
        flagged.is_some(),
        "gauge: {:?}",
        sidecar.gauge("tokenlease_redis_eviction_unsafe")
    );
    let log = sidecar.log();
    assert!(
        log.contains("WARN") && log.contains("maxmemory-policy `allkeys-lru`"),
        "{log}"
    );
    let ready = sidecar.get("/readyz");
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["maxmemory_policy"], "allkeys-lru");

    let safe = RedisServer::start();
    let sidecar = Sidecar::start(&config(&safe.url(), false));
    std::thread::sleep(Duration::from_millis(300)); // real time: the policy is read after the start
    assert_eq!(sidecar.gauge("tokenlease_redis_eviction_unsafe"), Some(0.0));
    assert!(!sidecar.log().contains("maxmemory-policy"), "{}", sidecar.log());
    assert!(sidecar.get("/readyz").json().get("maxmemory_policy").is_none());
}

/// Runs the binary with `args` (at most 60 s).
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tokenlease")
}

#[test]
fn serve_and_flash_sale_refuse_to_start_on_an_evicting_redis_under_require_noeviction() {
    let evicting = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_config(dir.path(), &config(&evicting.url(), true));
    let path = path.to_str().expect("a UTF-8 path");
    let port = common::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let serve = run(&["serve", "--config", path, "--listen", &listen]);
    let flash_sale = run(&[
        "flash-sale",
        "--config",
        path,
        "--duration",
        "1s",
        "--processes",
        "1",
        "--tasks",
        "1",
    ]);
    for (command, out) in [("serve", serve), ("flash-sale", flash_sale)] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command} started: {stderr}");
        assert!(
            stderr.contains("`maxmemory-policy` is `volatile-lru`") && stderr.contains("require_noeviction"),
            "{command}: {stderr}"
        );
    }
}
