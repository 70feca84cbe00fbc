//! The `tokenlease` command: validate a config, run the flash-sale load test, simulate a sale at scale on virtual
//! time, serve the limiter over HTTP.
//!
//! Thin by design: everything it does goes through the library's `Limiter`.

mod answer;
mod connections;
mod flash_sale;
mod grpc;
mod requests;
mod rls;
mod serve;
mod simulate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokenlease::redact_url;

/// Distributed rate limiter: leased token buckets over Redis.
#[derive(Debug, Parser)]
#[command(name = "tokenlease", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a config file (default: ./config.toml) and list its rules.
    CheckConfig {
        /// The file to check.
        path: Option<PathBuf>,
    },
    /// Run a flash sale: P worker processes × T tasks hammering one hot key (or N SKUs, Zipf-distributed) on Redis.
    FlashSale(flash_sale::Args),
    /// Serve the limiter over HTTP: POST /v1/check, POST /v1/check/batch, POST /v1/acquire, POST /v1/reset,
    /// GET /metrics, GET /livez, GET /readyz; and Envoy's Rate Limit Service (gRPC) with --grpc-listen.
    Serve(serve::Args),
    /// Size a sale: P limiters of this crate on virtual time over the in-process store with a round trip, one
    /// hot key; prints store calls/s, calls per admitted token, the share of the bound sold and the worst window.
    Simulate(simulate::Args),
    /// One worker process of `flash-sale` (spawned by it).
    #[command(hide = true)]
    FlashSaleWorker {
        /// The worker's assignment, as JSON.
        #[arg(long)]
        spec: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Seeded simulations break the store on purpose: the warnings of each fault are expected, thousands of them.
    let quiet = matches!(&cli.command, Command::Simulate(args) if args.is_seeded());
    let default_level = if quiet { "error" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::CheckConfig { path } => check_config(path),
        Command::FlashSale(args) => flash_sale::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::FlashSaleWorker { spec } => flash_sale::worker(&spec),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tokenlease: {message}");
            ExitCode::from(2)
        }
    }
}

/// The Prometheus exporter's builder with the histogram buckets of `tokenlease::telemetry`.
pub(crate) fn prometheus_builder() -> Result<metrics_exporter_prometheus::PrometheusBuilder, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use tokenlease::telemetry::{QUEUE_BUCKETS, QUEUE_WAIT_SECONDS, REDIS_BUCKETS, REDIS_DURATION_SECONDS};
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(REDIS_DURATION_SECONDS.into()), REDIS_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(QUEUE_WAIT_SECONDS.into()), QUEUE_BUCKETS))
        .and_then(|b| {
            let requests = Matcher::Full(requests::REQUEST_DURATION_SECONDS.into());
            b.set_buckets_for_metric(requests, requests::REQUEST_BUCKETS)
        })
        .map_err(|e| format!("cannot set the histogram buckets: {e}"))
}

/// Installs the Prometheus exporter on `listen` (call inside the tokio runtime, before building the limiter).
pub(crate) fn install_exporter(listen: std::net::SocketAddr) -> Result<(), String> {
    prometheus_builder()?
        .with_http_listener(listen)
        .install()
        .map_err(|e| format!("cannot serve metrics on {listen}: {e}"))?;
    tokenlease::telemetry::describe();
    Ok(())
}

/// URLs as they may be printed: their passwords redacted.
fn shown(urls: &[String]) -> String {
    urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ")
}

/// What a config without rules means: `check-config` refuses it, `serve` warns.
pub(crate) const NO_RULE: &str =
    "no [[rule]]: every call would be refused as an unknown rule (see config.toml for one of each algorithm)";

fn check_config(path: Option<PathBuf>) -> Result<ExitCode, String> {
    let path = path.unwrap_or_else(|| PathBuf::from("config.toml"));
    let config = tokenlease::Config::from_path(&path).map_err(|e| e.to_string())?;
    if config.rules.is_empty() {
        return Err(format!("{}: {NO_RULE}", path.display()));
    }
    println!("{}: ok", path.display());
    match &config.redis {
        Some(r) => println!(
            "  store: {} (timeout {:?}, fail_mode {})",
            match &r.sentinel {
                Some(s) => format!("redis sentinel master `{}` via {}", s.master_name, shown(&s.nodes)),
                None if r.cluster.is_empty() => format!("redis {}", redact_url(&r.url)),
                None => format!("redis cluster {}", shown(&r.cluster)),
            },
            r.timeout,
            r.fail_mode.as_str()
        ),
        None => println!("  store: in-process"),
    }
    // The TLS files were read and parsed by the check.
    if let Some(r) = config
        .redis
        .as_ref()
        .filter(|r| r.tls_ca_file.is_some() || r.tls_cert_file.is_some())
    {
        let shown = |f: &Option<PathBuf>, none: &str| f.as_ref().map_or(none.to_owned(), |p| p.display().to_string());
        println!(
            "  tls: authorities {}, client certificate {}",
            shown(&r.tls_ca_file, "of the system"),
            shown(&r.tls_cert_file, "none")
        );
    }
    for rule in &config.rules {
        let lease = rule
            .lease()
            .map(|l| format!(", lease {}..{} ttl {:?}", l.min_batch, l.max_batch, l.ttl));
        let rls = config.rls.iter().find(|r| r.rule == rule.name).map(|r| {
            let matches: Vec<String> = r.matches.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(
                ", rls domain {} match [{}] key [{}]",
                r.domain,
                matches.join(", "),
                r.key.join(", ")
            )
        });
        println!(
            "  rule {}: {}{}{}",
            rule.name,
            rule.algorithm.name(),
            lease.unwrap_or_default(),
            rls.unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}
