//! The store when the configured Redis does not answer: a private `redis-server` on a free loopback port.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// A private `redis-server` on a free loopback port, stopped on drop.
pub(super) struct PrivateRedis {
    child: std::process::Child,
    pub(super) url: String,
    _dir: PathBuf,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Starts the server on a free port, trying again on another port when it exits: a port `free_port` released can
/// be bound by another program first, and a reply on it would then come from someone else's server.
pub(super) fn start_private_redis(rt: &tokio::runtime::Runtime) -> Option<PrivateRedis> {
    (0..3).find_map(|_| try_private_redis(rt))
}

fn try_private_redis(rt: &tokio::runtime::Runtime) -> Option<PrivateRedis> {
    let port = free_port().ok()?;
    let dir = std::env::temp_dir().join(format!("tokenlease-flash-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut server = PrivateRedis {
        child,
        url: format!("redis://127.0.0.1:{port}"),
        _dir: dir,
    };
    for _ in 0..100 {
        if rt.block_on(reachable(&server.url)) {
            // A server that could not bind its port exits within milliseconds of its start.
            std::thread::sleep(Duration::from_millis(200));
            return matches!(server.child.try_wait(), Ok(None)).then_some(server);
        }
        if !matches!(server.child.try_wait(), Ok(None)) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

pub(super) async fn reachable(url: &str) -> bool {
    let Ok(store) = tokenlease::RedisStore::connect(url, Duration::from_millis(300)) else {
        return false;
    };
    use tokenlease::Store as _;
    store.ping().await.is_ok()
}
