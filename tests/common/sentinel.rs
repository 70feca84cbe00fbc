//! Test helper: a real `redis-sentinel` on a free loopback port watching a master, killed on drop. Its timings
//! are short (down after 500 ms, failover timeout 2 s) so that a failover takes a second or two.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::server::{free_port, redis_cli_with, wait_for, RedisServer, Tls};

/// A running `redis-sentinel` (quorum 1: it alone decides a failover).
pub struct RedisSentinel {
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
    /// TLS only, to clients and to the servers, when the master serves TLS.
    tls: Option<Tls>,
}

impl RedisSentinel {
    /// Starts a Sentinel monitoring `master` as `name`, and waits until it knows `replicas` replicas of it.
    /// When the master serves TLS, so does the Sentinel (only, with the same files), and it reaches the servers
    /// over TLS (`tls-replication yes`).
    pub fn start(master: &RedisServer, name: &str, replicas: usize) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = dir.path().join("sentinel.conf");
        let tls = master.tls().cloned();
        let listen = match &tls {
            None => format!("port {port}\n"),
            Some(tls) => {
                let settings = tls
                    .settings
                    .iter()
                    .map(|(k, v)| format!("{k} {v}\n"))
                    .collect::<String>();
                format!("port 0\ntls-port {port}\n{settings}")
            }
        };
        let text = format!(
            "{listen}bind 127.0.0.1\ndaemonize no\ndir {dir}\n\
             sentinel monitor {name} 127.0.0.1 {master} 1\n\
             sentinel down-after-milliseconds {name} 500\n\
             sentinel failover-timeout {name} 2000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display(),
            master = master.port,
        );
        std::fs::write(&conf, text).expect("sentinel.conf");
        let child = spawn(&conf);
        let sentinel = Self {
            port,
            child: Some(child),
            _dir: dir,
            tls,
        };
        let known = wait_for(Duration::from_secs(20), || {
            let out = sentinel.cmd(&["SENTINEL", "replicas", name]).unwrap_or_default();
            let found = out.matches("flags").count() >= replicas && !out.contains("s_down");
            (found && sentinel.master_port(name) == Some(master.port)).then_some(())
        });
        assert!(
            known.is_some(),
            "the sentinel on {port} did not find {replicas} replicas of {name}"
        );
        sentinel
    }

    /// `redis://127.0.0.1:port` of the Sentinel (`rediss://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Runs a command through `redis-cli` against the Sentinel.
    pub fn cmd(&self, args: &[&str]) -> Option<String> {
        redis_cli_with(self.port, self.tls.as_ref(), args)
    }

    /// The port of the master the Sentinel names for `name` now.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let out = self.cmd(&["SENTINEL", "get-master-addr-by-name", name])?;
        out.lines().nth(1)?.trim().parse().ok()
    }
}

fn spawn(conf: &Path) -> Child {
    Command::new("redis-sentinel")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-sentinel must be installed for these tests (the README's test command installs it)")
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
