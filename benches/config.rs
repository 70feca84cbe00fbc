//! Checking a large config: `cargo bench --bench config`. `Config::from_toml` on 16 000 and 100 000 rules of
//! every algorithm (one in ten with an override), the work of `tokenlease check-config` and of a SIGHUP reload's
//! parse. Linear in the file's size: line numbers come from a table of line starts, duplicate names from a set.

use std::fmt::Write;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenlease::Config;

/// A config of `n` rules cycling through the algorithms, every tenth with an override.
fn rules(n: usize) -> String {
    let mut text = String::from("[redis]\nurl = \"redis://127.0.0.1:6379\"\ntimeout = \"50ms\"\n\n");
    for i in 0..n {
        let rule = match i % 5 {
            0 => "algorithm = \"token_bucket\"\ncapacity = 2000\nrate = 1000\nper = \"1s\"\n\
                  lease = { min_batch = 10, max_batch = 500, ttl = \"200ms\" }\n",
            1 => "algorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1d\"\nreset = \"midnight\"\nutc_offset = \"+08:00\"\n",
            2 => "algorithm = \"sliding_window\"\nlimit = 10\nwindow = \"10s\"\nban = \"1h\"\n",
            3 => "algorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1m\"\n",
            _ => "algorithm = \"leaky_bucket\"\nrate = 50\nper = \"1s\"\nmax_wait = \"30s\"\n",
        };
        let _ = write!(text, "[[rule]]\nname = \"rule_{i}\"\n{rule}");
        if i % 10 == 0 {
            text.push_str("[[rule.override]]\npattern = \"vip:*\"\ncapacity = 4000\n");
        }
        text.push('\n');
    }
    text
}

fn check(c: &mut Criterion) {
    let mut group = c.benchmark_group("config_check");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    for n in [16_000, 100_000] {
        let text = rules(n);
        assert_eq!(Config::from_toml(&text).map(|c| c.rules.len()).ok(), Some(n));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| Config::from_toml(text).map(|c| c.rules.len()))
        });
    }
    group.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
