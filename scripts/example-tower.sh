#!/usr/bin/env bash
# Runs examples/tower_layer.rs and asks it as its header says a user would: `GET /hello` is allowed 5 times in
# 10 s per client IP, then answered 429 with Retry-After; `POST /upload` 3 times a minute per `x-user-id`.
# Fails when an answer differs. Needs python3 (scripts/rls-client.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cargo build --release --example tower_layer --features http
"${CARGO_TARGET_DIR:-target}/release/examples/tower_layer" "127.0.0.1:$port" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
python3 - "$port" <<'PY'
import sys, time, urllib.request, urllib.error

port = sys.argv[1]

def ask(method, path, headers=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)

for _ in range(100):  # the example is up when it answers (at most 10 s)
    try:
        ask("GET", "/hello")
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("tower_layer did not answer")
hello = [ask("GET", "/hello")[0] for _ in range(5)]
upload = [ask("POST", "/upload", {"x-user-id": "7"})[0] for _ in range(4)]
status, headers = ask("GET", "/hello")
print(f"GET /hello: {hello + [status]}; POST /upload: {upload}")
# The first GET, which found the example up, was the first of the five allowed.
assert hello == [200, 200, 200, 200, 429], hello
assert upload == [200, 200, 200, 429], upload
assert status == 429 and "retry-after" in {k.lower() for k in headers}, (status, headers)
PY
echo "tower_layer: ok"
