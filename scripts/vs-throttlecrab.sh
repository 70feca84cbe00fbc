#!/usr/bin/env bash
# tokenlease serve against throttlecrab-server's HTTP transport, one after the other under the same wrk load
# (-t2 -c64, one hot key of burst 2000 and 1000 per second): throttlecrab, then tokenlease on the in-process
# store, then tokenlease leasing from Redis; tokenlease both one check a request (/v1/check) and ten
# (/v1/check/batch), counted per decision (throttlecrab's HTTP decides one a request). Starts its own servers on free loopback ports and stops them.
# Needs wrk, redis-server and throttlecrab-server (`apt-get install -y protobuf-compiler wrk` and
# `cargo install throttlecrab-server --locked`). Usage: scripts/vs-throttlecrab.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
for tool in redis-server wrk throttlecrab-server; do
  command -v "$tool" >/dev/null || { echo "needs $tool (see the comment at the top of $0)" >&2; exit 2; }
done
cargo build --release --quiet --bin tokenlease
bin="${CARGO_TARGET_DIR:-target}/release/tokenlease"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
wait_for() { for _ in $(seq 100); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "no answer at $1" >&2; exit 1; }
# The server's CPU time (user + system, in clock ticks) from /proc: wall-clock requests/s depend on what else
# runs on the machine, the server's CPU per request much less.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
load() { # name url script pid [RULE [BATCH]]: a batch request counts BATCH decisions
  local per="${6:-1}"
  echo "== $1: wrk -t2 -c64 -d${secs}s"
  local before after out
  before=$(cpu_ticks "$4")
  out=$(RULE="${5:-}" BATCH="$per" wrk -t2 -c64 -d"${secs}s" --latency -s "$3" "$2")
  after=$(cpu_ticks "$4")
  grep -E "Requests/sec|^ +(50|99)%|Non-2xx" <<<"$out"
  grep -oE '^ +[0-9]+ requests' <<<"$out" | awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v per="$per" \
    '{printf "   server CPU per decision: %.1f µs (user + system)\n", t / hz * 1e6 / ($1 * per)}'
  grep -E "Requests/sec" <<<"$out" | awk -v per="$per" -v name="$1" \
    '{printf "   decisions/s: %.0f\n", $2 * per; printf "%s\t%.0f\n", name, $2 * per >> "'"$dir"'/decisions"}'
}

crab_port=$(free_port)
throttlecrab-server --http --http-host 127.0.0.1 --http-port "$crab_port" >"$dir/crab.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$crab_port/health"
load "throttlecrab-server --http" "http://127.0.0.1:$crab_port/throttle" scripts/wrk-throttlecrab.lua "${pids[0]}"
kill "${pids[@]}"; pids=()
sleep 1

rule='[[rule]]
name = "sku_buy"
algorithm = "token_bucket"
capacity = 2000
rate = 1000
per = "1s"
lease = { min_batch = 10, max_batch = 500, ttl = "200ms" }'
http_port=$(free_port)
printf '%s\n' "$rule" > "$dir/memory.toml"
"$bin" serve --config "$dir/memory.toml" --listen "127.0.0.1:$http_port" 2>"$dir/serve.log" &
pids+=($!)
wait_for "http://127.0.0.1:$http_port/healthz"
load "tokenlease serve, in-process store" "http://127.0.0.1:$http_port/v1/check" scripts/wrk-check.lua "${pids[0]}" sku_buy
load "tokenlease serve, in-process store, batches of 10" "http://127.0.0.1:$http_port/v1/check/batch" \
  scripts/wrk-batch.lua "${pids[0]}" sku_buy 10
kill "${pids[@]}"; pids=()
sleep 1

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/redis.pid" --dir "$dir" >/dev/null
printf '[redis]\nurl = "redis://127.0.0.1:%s"\ntimeout = "50ms"\nexpected_processes = 1\n\n%s\n' "$redis_port" "$rule" \
  > "$dir/redis.toml"
http_port=$(free_port)
"$bin" serve --config "$dir/redis.toml" --listen "127.0.0.1:$http_port" 2>"$dir/serve.log" &
pids+=($!)
wait_for "http://127.0.0.1:$http_port/healthz"
load "tokenlease serve, leased from Redis" "http://127.0.0.1:$http_port/v1/check" scripts/wrk-check.lua "${pids[0]}" sku_buy
load "tokenlease serve, leased from Redis, batches of 10" "http://127.0.0.1:$http_port/v1/check/batch" \
  scripts/wrk-batch.lua "${pids[0]}" sku_buy 10
echo "   redis script calls: $(redis-cli -p "$redis_port" INFO commandstats | grep -oE 'cmdstat_evalsha:calls=[0-9]+')"
echo "== decisions/s against throttlecrab's (one run)"
awk -F'\t' 'NR == 1 { base = $2 } { printf "   %-55s %8.0f  %.2fx\n", $1, $2, $2 / base }' "$dir/decisions"
