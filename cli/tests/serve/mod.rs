//! The one harness of the `tokenlease serve` sidecar as a separate process, shared by the binary's tests
//! (`mod serve;`): its config in a temporary directory, its stderr in a file there, signals, and a kill on drop.
//! What each test speaks to it (HTTP through ureq or raw sockets, gRPC) stays in the test.

#![allow(dead_code)] // each test uses the part it needs

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common;

/// How long a sidecar may take to come up, or to stop after SIGTERM.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A `tokenlease serve` process, SIGKILLed on drop unless it was stopped.
pub struct Serve {
    child: Option<Child>,
    config: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Writes `config` to a temporary `config.toml` and runs `tokenlease serve --config <it>`, behind `wrapper`
    /// (a command and its arguments, e.g. `prlimit --nofile=256`; empty: none), with what `more` adds to the
    /// command (`--listen`, the environment).
    pub fn spawn(config: &str, wrapper: &[&str], more: impl FnOnce(&mut Command)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, config).expect("write config");
        let stderr = dir.path().join("stderr.log");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(env!("CARGO_BIN_EXE_tokenlease"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_tokenlease")),
        };
        command.arg("serve").arg("--config").arg(&path);
        more(&mut command);
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn tokenlease serve");
        Self {
            child: Some(child),
            config: path,
            stderr,
            _dir: dir,
        }
    }

    /// Waits up to [`PATIENCE`] for `up` to say the sidecar answers; panics with its log if it never does.
    pub fn wait_up(self, up: impl Fn(&Self) -> bool) -> Self {
        let answered = common::wait_for(PATIENCE, || up(&self).then_some(()));
        assert!(answered.is_some(), "the sidecar did not answer: {}", self.log());
        self
    }

    /// The config file it was started with (a test may rewrite it and send SIGHUP).
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    /// Sends `sig` (`-HUP`, `-TERM`, ...) with kill(1).
    pub fn signal(&self, sig: &str) {
        let pid = self.pid();
        let status = Command::new("kill").args([sig, &pid]).status().expect("kill");
        assert!(status.success(), "kill {sig} {pid}");
    }

    /// SIGTERM, then waits up to [`PATIENCE`] for the process to exit by itself; returns whether it exited with
    /// success. Panics with its log if it did not exit.
    pub fn terminate(&mut self) -> bool {
        self.signal("-TERM");
        let mut child = self.child.take().expect("running");
        match common::wait_for(PATIENCE, || child.try_wait().ok().flatten()) {
            Some(status) => status.success(),
            None => {
                let _ = child.kill();
                panic!("the sidecar did not stop within 20 s of SIGTERM: {}", self.log());
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
