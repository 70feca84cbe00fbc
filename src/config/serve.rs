//! `[serve]`: what `tokenlease serve` sheds (DESIGN.md invariant 7: the sidecar bounds connections, header reads and
//! idle sockets). Read at start; a SIGHUP reload does not change them.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::rule::FieldError;

/// `[serve]`: where the sidecar listens and its bounds on connections. Read when `tokenlease serve` starts; its
/// `--listen` and `--grpc-listen` flags override the addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// `host:port` of the HTTP API and `/metrics`. Default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// `host:port` of Envoy's Rate Limit Service (gRPC), for the rules with `[rule.rls]`; none by default.
    #[serde(default)]
    pub grpc_listen: Option<SocketAddr>,
    /// A request's headers must be complete within this of the connection being ready for it (accepted, or its
    /// previous response sent), or the connection is closed: hyper's `header_read_timeout`, against clients that
    /// send headers slowly (slowloris). Default 10 s, at most 10 min.
    #[serde(default = "default_header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection waiting for its next request (accepted, or its previous response sent) that has received
    /// no byte of it for this long is closed (the keep-alive timeout). Default 5 s; at most
    /// `header_read_timeout`, whose clock runs over the same wait.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Connections open at once, at most; later clients wait in the listen backlog until one closes. Default
    /// 1024; `serve` lowers it to the open-file limit less 64 (kept for Redis connections and the config file).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            grpc_listen: None,
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections(),
        }
    }
}

/// The longest `header_read_timeout` accepted.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_max_connections() -> usize {
    1024
}

impl ServeConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// The field out of range and why.
    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        if self.header_read_timeout.is_zero() || self.header_read_timeout > MAX_TIMEOUT {
            return Err(("header_read_timeout", "must be longer than zero and at most 10m".into()));
        }
        if self.idle_timeout.is_zero() {
            return Err(("idle_timeout", "must be longer than zero".into()));
        }
        if self.idle_timeout > self.header_read_timeout {
            let why = "must be at most `header_read_timeout`, whose clock also runs while a connection waits for a \
                       request: raise both for longer keep-alive";
            return Err(("idle_timeout", why.into()));
        }
        if self.max_connections == 0 {
            return Err(("max_connections", "must be at least 1".into()));
        }
        if self.grpc_listen == Some(self.listen) && self.listen.port() != 0 {
            return Err(("grpc_listen", format!("must differ from `listen` ({})", self.listen)));
        }
        Ok(())
    }
}
