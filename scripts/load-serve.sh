#!/usr/bin/env bash
# Loads `tokenlease serve` with wrk on loopback: one hot key, leased and not (one Redis call per request).
# Starts its own redis-server and sidecar on free ports and stops them. Usage: scripts/load-serve.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
for tool in redis-server wrk; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y redis-server wrk)" >&2; exit 2; }
done
cargo build --release --quiet
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
redis_port=$(free_port)
http_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/redis.pid" --dir "$dir" >/dev/null
cat > "$dir/config.toml" <<TOML
[redis]
url = "redis://127.0.0.1:$redis_port"
timeout = "50ms"
expected_processes = 1

[[rule]]
name = "sku_buy"
algorithm = "token_bucket"
capacity = 2000
rate = 1000
per = "1s"
lease = { min_batch = 10, max_batch = 500, ttl = "200ms" }

[[rule]]
name = "sku_buy_direct"
algorithm = "token_bucket"
capacity = 2000
rate = 1000
per = "1s"
TOML
target/release/tokenlease serve --config "$dir/config.toml" --listen "127.0.0.1:$http_port" 2>"$dir/serve.log" &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null; kill "$(cat "$dir/redis.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$http_port/healthz" >/dev/null && break; sleep 0.1; done
for rule in sku_buy sku_buy_direct; do
  echo "== $rule: wrk -t2 -c64 -d${secs}s --latency (POST /v1/check, one hot key)"
  RULE=$rule wrk -t2 -c64 -d"${secs}s" --latency -s scripts/wrk-check.lua "http://127.0.0.1:$http_port/v1/check" |
    grep -E "Requests/sec|^ +(50|99)%|Non-2xx|requests in"
  echo "   redis script calls so far: $(redis-cli -p "$redis_port" INFO commandstats | grep -oE 'cmdstat_evalsha:calls=[0-9]+')"
  sleep 1
done
