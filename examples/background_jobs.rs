//! Pacing background jobs across processes with a leaky-bucket queue (seed 004: blocking limiters suit jobs).
//!
//! ```sh
//! cargo run --release --example background_jobs            # 3 processes × 40 jobs at 20 per second
//! cargo run --release --example background_jobs -- redis://127.0.0.1:6379 5 30 10
//! ```
//! Arguments: `[REDIS_URL [PROCESSES [JOBS_PER_PROCESS [RATE_PER_S]]]]`. Without a URL it starts a private
//! `redis-server` on a free loopback port. The parent re-runs itself as the worker processes, which all call
//! `limiter.acquire("reindex", "tenant:7", 1)` before each job; it then measures the global rate from the
//! start times every worker reports and compares it with the configured one: it fails (exit 1) when a job is
//! missing or the global rate is more than 5 % off. `scripts/test.sh` runs it.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenlease::{Limiter, RedisStore, Rule};

fn epoch_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url, jobs, rate] = args.as_slice() {
        if flag == "--worker" {
            return worker(url, jobs.parse()?, rate.parse()?);
        }
    }
    let processes: u32 = args.get(1).map_or(Ok(3), |s| s.parse())?;
    let jobs: u32 = args.get(2).map_or(Ok(40), |s| s.parse())?;
    let rate: u64 = args.get(3).map_or(Ok(20), |s| s.parse())?;
    // A private redis-server unless a URL is given.
    let mut server = None;
    let url = match args.first() {
        Some(url) => url.clone(),
        None => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let child = Command::new("redis-server")
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
                .stdout(Stdio::null())
                .spawn()?;
            server = Some(child);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                std::thread::sleep(Duration::from_millis(20));
            }
            format!("redis://127.0.0.1:{port}")
        }
    };
    println!(
        "{processes} processes × {jobs} jobs, rule `reindex`: {rate} per second, on {}",
        tokenlease::redact_url(&url)
    );
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", &url, &jobs.to_string(), &rate.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut starts: Vec<u128> = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        starts.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.parse::<u128>().ok()),
        );
    }
    if let Some(mut child) = server {
        let _ = child.kill();
        let _ = child.wait();
    }
    starts.sort_unstable();
    let (Some(first), Some(last)) = (starts.first(), starts.last()) else {
        return Err("no job ran".into());
    };
    let span_s = (last - first) as f64 / 1e6;
    let measured = (starts.len() - 1) as f64 / span_s;
    let error = 100.0 * (measured - rate as f64) / rate as f64;
    println!(
        "{} jobs started over {span_s:.3} s: {measured:.2} per second ({error:+.2} % of {rate})",
        starts.len()
    );
    let expected = processes as usize * jobs as usize;
    if starts.len() != expected {
        return Err(format!("{} of {expected} jobs ran", starts.len()).into());
    }
    if error.abs() > 5.0 {
        return Err(format!("the jobs ran at {measured:.2} per second, more than 5 % off {rate}").into());
    }
    Ok(())
}

/// One worker process: `jobs` jobs, each after `acquire`; prints each job's start time (µs since the epoch).
fn worker(url: &str, jobs: u32, rate: u64) -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let store = RedisStore::connect(url, Duration::from_millis(200))?;
        let rule = Rule::leaky_bucket("reindex", rate, Duration::from_secs(1), Duration::from_secs(60))?;
        let limiter = Limiter::builder().store(Arc::new(store)).rule(rule).build()?;
        for _ in 0..jobs {
            let _permit = limiter.acquire("reindex", "tenant:7", 1).await?;
            println!("{}", epoch_us()); // the job itself would run here
        }
        limiter.shutdown().await;
        Ok::<_, tokenlease::Error>(())
    })?;
    Ok(())
}
