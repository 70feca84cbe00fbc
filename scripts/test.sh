#!/usr/bin/env bash
# Runs every test of tokenlease. Installs what the tests need on a fresh machine (redis-server), then runs
# cargo test; the tests start their own redis-server processes on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server (the tests run against a real Redis)" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq redis-server >/dev/null
fi
# The packaged service is not needed: the tests start their own servers.
redis-server --version

# Benchmarks are built (not run) so that they keep compiling; `cargo bench` runs them.
cargo bench --no-run
# Three OS processes pace one leaky-bucket rule on a private redis-server: fails when 5 % off the rate.
cargo run --release --example background_jobs
cargo test --release --lib --bins --tests --examples --no-fail-fast "$@"
cargo test --release --doc
