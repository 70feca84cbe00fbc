//! Test helper: a real `redis-server` on a free loopback port, started by the test and stopped on drop.
//! Tests that need Redis fail loudly when `redis-server` is missing: they never skip silently.
//!
//! The crate's own tests (`src/store/tests`) include this file too, so it names nothing of the crate; the
//! integration tests load it through `mod.rs`, which adds the one `limiter()` helper.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it gives a value or `limit` has passed.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        // real time: every caller polls a real process (a redis-server, Sentinel, cluster, sidecar or prometheus).
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a command through `redis-cli` against the server (or Sentinel) on `port` and returns its raw output;
/// `None` when it could not run or failed.
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    redis_cli_with(port, None, args)
}

/// [`redis_cli`] over TLS when `tls` is given.
pub fn redis_cli_with(port: u16, tls: Option<&Tls>, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(tls.map(|t| t.cli.as_slice()).unwrap_or_default())
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    /// Arguments added to the defaults (`--maxmemory-policy allkeys-lru`, `--replicaof host port`, ...).
    args: Vec<String>,
    /// TLS only (`--port 0`, `--tls-port`) when set.
    tls: Option<Tls>,
}

/// What a redis-server (or Sentinel) serving TLS only needs (`tests/common/tls.rs` makes it).
#[derive(Clone, Debug)]
pub struct Tls {
    /// Its settings (`tls-cert-file`, ...) and their values: `--name value` arguments, or lines of a config file.
    pub settings: Vec<(String, String)>,
    /// The arguments of `redis-cli` to talk to it (`--tls --cacert ...`).
    pub cli: Vec<String>,
}

impl Tls {
    /// The settings as `redis-server` arguments.
    pub fn args(&self) -> Vec<String> {
        self.settings
            .iter()
            .flat_map(|(k, v)| [format!("--{k}"), v.clone()])
            .collect()
    }
}

/// A loopback port nobody listens on (bound once, then released), never the same twice in one test process,
/// and below the kernel's ephemeral range: a port the kernel hands out (`bind(0)`, or the local end of any
/// outgoing connection, to a redis-server say) could be taken by another test between this call and the
/// server's own bind (a sidecar test failed so: "Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Linux's ephemeral range starts at 32768 by default; below it ports are taken only by name. 10000 to 19999:
    // tests/cluster.rs takes its nodes' ports from 20000 and their bus ports 10000 above.
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = low.clamp(11_000, 20_000) - 10_000;
    // Test processes started one after another begin at different places.
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = 10_000 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(port) else { continue };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server on a free port with `args` added to the defaults (e.g. `["--maxmemory", "64mb",
    /// "--maxmemory-policy", "allkeys-lru"]`, or `["--rename-command", "CONFIG", ""]` for a managed Redis that
    /// refuses CONFIG), and waits until it answers PING. The arguments apply again on `restart`.
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_tls(None, args)
    }

    /// As [`Self::start_with`], serving TLS only when `tls` is given (on `port`, with `--port 0`: a client
    /// that does not speak TLS finds nothing); its `url` is then `rediss://`, and `cmd` speaks TLS.
    ///
    /// A port released by `free_port` can be taken by another test's server before this one binds it; the
    /// server then exits, and is started again on another port (up to 5 times).
    pub fn start_tls(tls: Option<Tls>, args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("tokenlease-test-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut server = Self {
                port,
                child: None,
                dir,
                args: args.clone(),
                tls: tls.clone(),
            };
            if server.try_spawn() {
                return server;
            }
        }
        panic!("redis-server could not bind a free port in 5 tries");
    }

    /// Starts a replica of `master` on a free port and waits until its link to the master is up.
    pub fn replica_of(master: &RedisServer) -> Self {
        let master_port = master.port.to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &master_port]);
        let synced = wait_for(Duration::from_secs(10), || {
            let info = replica.cmd(&["INFO", "replication"]).unwrap_or_default();
            info.contains("master_link_status:up").then_some(())
        });
        assert!(
            synced.is_some(),
            "the replica on {} did not sync with {}",
            replica.port,
            master.port
        );
        replica
    }

    /// The server's replication role (`master`, `slave`), from `ROLE`.
    pub fn role(&self) -> String {
        self.cmd(&["ROLE"])
            .and_then(|out| out.lines().next().map(|l| l.trim().to_owned()))
            .unwrap_or_default()
    }

    /// Starts the server on its port; panics unless it answers.
    fn spawn(&mut self) {
        assert!(self.try_spawn(), "redis-server could not bind port {}", self.port);
    }

    /// Starts the server on its port and waits until it answers PING as itself: `false` when it exited (its
    /// port taken), so that the caller never talks to another test's server on the same port.
    fn try_spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let ports = match &self.tls {
            None => vec!["--port".to_owned(), port],
            Some(tls) => [vec!["--port".into(), "0".into(), "--tls-port".into(), port], tls.args()].concat(),
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for these tests (the README's test command installs it)");
        let pid = format!("process_id:{}", child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_)))) {
                self.child = None;
                return false;
            }
            let info = self.cmd(&["INFO", "server"]).unwrap_or_default();
            if info.lines().any(|l| l.trim() == pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20)); // real time: the started redis-server answers INFO
        }
        panic!("redis-server on port {} did not answer within 10 s", self.port);
    }

    /// `redis://127.0.0.1:port`, or `rediss://` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// What it serves TLS with, when it does.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// Runs a command through `redis-cli` and returns its raw output.
    pub fn cmd(&self, args: &[&str]) -> Option<String> {
        redis_cli_with(self.port, self.tls.as_ref(), args)
    }

    /// Calls of a command so far, from `INFO commandstats` (e.g. "evalsha").
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.cmd(&["INFO", "commandstats"]).unwrap_or_default();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Script calls so far (EVALSHA and EVAL).
    pub fn script_calls(&self) -> u64 {
        self.command_calls("evalsha") + self.command_calls("eval")
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success(), "kill {sig}");
        }
    }

    /// Stops the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (empty unless started with persistence).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
