//! Where the Redis store is: a URL's connection info (TCP settings and TLS certificates), the master the
//! Sentinels name, and rustls's crypto provider. Used by the connections (`connect.rs`) and by the eviction
//! watch's own connection (`eviction.rs`).

use std::time::Duration;

use redis::sentinel::{
    Sentinel, SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType,
};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, TlsCertificates, TlsMode};

/// `TCP_NODELAY`: a call written while another is unanswered goes out at once instead of waiting for the
/// other's reply to carry the ACK (Nagle), which doubled the latency of overlapping calls (`benches/latency.rs`).
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Makes rustls's process-wide crypto provider ring unless one is installed already (by the application):
/// rustls panics on a TLS connection without one when its features enable two providers or none.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The connection info of `url` (TCP settings included), with the certificates `tls` when it is a `rediss://`
/// URL and they are given.
///
/// # Errors
/// The redis crate's error when the URL is malformed.
pub(crate) fn connection_info(url: &str, tls: Option<&TlsCertificates>) -> RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    match tls {
        Some(certs) if is_tls(&info) => Ok(redis::Client::build_with_tls(info, certs.clone())?
            .get_connection_info()
            .clone()),
        _ => Ok(info),
    }
}

fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// How the task finds the one server: its URL, or the master the Sentinels name.
pub(crate) enum Target {
    /// One server's client.
    Url(Box<redis::Client>),
    /// Sentinels and the name they monitor the master under.
    Sentinel {
        /// The Sentinels (the redis crate's client, which asks them in turn).
        sentinel: Box<Sentinel>,
        /// The master's name.
        master_name: String,
    },
    /// Sentinels reached over TLS (`rediss://`), and so the master they name: the redis crate's
    /// `SentinelClient`, which alone carries certificates to the master (and to its check with `ROLE`).
    SentinelTls(Box<SentinelClient>),
}

impl Target {
    /// The Sentinels at `nodes` (redis:// or rediss:// URLs), for the master named `master_name`; with
    /// `rediss://` nodes the master is reached over TLS too, with the certificates `tls` when given.
    pub(crate) fn sentinel(nodes: &[String], master_name: &str, tls: Option<&TlsCertificates>) -> RedisResult<Self> {
        let infos = nodes
            .iter()
            .map(|n| n.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        if infos.iter().any(is_tls) {
            return sentinel_tls(infos, master_name, tls);
        }
        Ok(Self::Sentinel {
            sentinel: Box::new(Sentinel::build(infos)?),
            master_name: master_name.to_owned(),
        })
    }

    /// The client of the server to use now: the URL's, or the master's that a Sentinel names (the redis crate
    /// checks that it answers `ROLE` as a master).
    pub(crate) async fn resolve(&mut self) -> RedisResult<redis::Client> {
        match self {
            Self::Url(client) => Ok((**client).clone()),
            Self::Sentinel { sentinel, master_name } => {
                let node = SentinelNodeConnectionInfo::default().set_tcp_settings(tcp_settings());
                sentinel.async_master_for(master_name, Some(&node)).await
            }
            Self::SentinelTls(client) => client.async_get_client().await,
        }
    }
}

/// The Sentinels of `infos` over TLS, for `master_name`, which is reached over TLS too, both with `certs` when
/// given (the system's roots otherwise). The user and password of the first node's URL go to each Sentinel
/// (the redis crate's builder takes one pair).
fn sentinel_tls(infos: Vec<ConnectionInfo>, master_name: &str, certs: Option<&TlsCertificates>) -> RedisResult<Target> {
    let settings = infos.first().map(|i| i.redis_settings().clone());
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        master_name,
        SentinelServerType::Master,
    )?
    .set_client_to_sentinel_tls_mode(TlsMode::Secure)
    .set_client_to_sentinel_tcp_settings(tcp_settings())
    .set_client_to_redis_tls_mode(TlsMode::Secure)
    .set_client_to_redis_tcp_settings(tcp_settings());
    if let Some(certs) = certs {
        builder = builder
            .set_client_to_sentinel_certificates(certs.clone())
            .set_client_to_redis_certificates(certs.clone());
    }
    if let Some(settings) = settings {
        if let Some(user) = settings.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    Ok(Target::SentinelTls(Box::new(builder.build()?)))
}

/// The connection info of the master the Sentinels at `nodes` name `master_name`, found within `timeout`.
///
/// # Errors
/// The redis crate's error when no Sentinel answers or names a master that answers as one.
pub(crate) async fn resolve_master(
    nodes: &[String],
    master_name: &str,
    tls: Option<&TlsCertificates>,
    timeout: Duration,
) -> RedisResult<ConnectionInfo> {
    let mut target = Target::sentinel(nodes, master_name, tls)?;
    match tokio::time::timeout(timeout, target.resolve()).await {
        Ok(client) => Ok(client?.get_connection_info().clone()),
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no Sentinel named a master in time",
        ))),
    }
}
