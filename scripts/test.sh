#!/usr/bin/env bash
# Runs every test of tokenlease. Installs what the tests need on a fresh machine (redis-server, redis-sentinel,
# prometheus), then runs cargo test; the tests start their own redis-server, redis-sentinel and prometheus processes
# on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests run for real: redis-server (Debian builds it, and redis-cli, with TLS: tests/tls.rs starts
# servers, a Sentinel and a cluster serving TLS only); redis-sentinel (tests/sentinel.rs fails a master over);
# prometheus and promtool (cli/tests/operations.rs scrapes the sidecar and checks the dashboards' queries and the alert
# rules).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
# npm (and node) check the Grafana dashboards against Grafana's own schema (scripts/check-dashboards.sh).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (the tests run against the real servers)" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The packaged service is not needed: the tests start their own servers.
redis-server --version
redis-sentinel --version
promtool --version 2>&1 | sed -n 1p

# cli/tests/rls.rs asks the sidecar's Envoy RLS with a real Python gRPC client: python3, python3-venv (apt, when
# missing) and the pinned grpcio and Envoy API stubs (pip, into target/rls-venv).
bash scripts/rls-client.sh

# The dashboards fit Grafana's own schema (@grafana/schema, type-checked; no Grafana server).
bash scripts/check-dashboards.sh

# Benchmarks are built (not run) so that they keep compiling; `cargo bench` runs them.
cargo bench --no-run
# The library crate as crates.io would get it: packaged from its `include` list and built from that alone (the
# docs.rs build adds its public feature, `http`: `cargo doc -p tokenlease --features http`). The binary (cli/) is
# not published.
cargo publish --dry-run --allow-dirty -p tokenlease
# Three OS processes pace one leaky-bucket rule on a private redis-server: fails when 5 % off the rate.
cargo run --release --example background_jobs
# The tower layer's example, asked as a user would (5 GETs a 10 s window, then 429).
bash scripts/example-tower.sh
cargo test --release --lib --bins --tests --examples --no-fail-fast "$@"
cargo test --release --doc
# The hot path's races under the loom model checker (src/lease/loom_tests.rs), the lib alone under the crate's own
# cfg. RUSTFLAGS reaches every crate, so the build above is not reused: its own target dir, in the dev profile
# without debug info (4 CPU-minutes from scratch, 9 in release); the models run in 2 s.
CARGO_TARGET_DIR=target/loom CARGO_PROFILE_DEV_DEBUG=0 RUSTFLAGS="--cfg tokenlease_loom" \
  cargo test -p tokenlease --lib lease::loom_tests
