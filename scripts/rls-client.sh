#!/usr/bin/env bash
# Installs the Python gRPC client of tests/rls.rs (tests/rls_client.py: grpcio and Envoy's API stubs, pinned in
# tests/rls_requirements.txt) into a venv, target/rls-venv unless RLS_VENV says otherwise, and prints the venv's
# python. Installs python3 and its venv module with apt when they are missing (PEP 668: no pip into the system).
# Does nothing more when the venv already imports the client's modules.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLS_VENV:-target/rls-venv}"
python="$venv/bin/python"
check='import grpc; from envoy.service.ratelimit.v3 import rls_pb2_grpc'
if [ -x "$python" ] && "$python" -c "$check" >/dev/null 2>&1; then
  echo "$(cd "$venv" && pwd)/bin/python"
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "installing python3 and python3-venv (the RLS test's gRPC client)" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3 python3-venv >&2
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
"$python" -m pip install --quiet --disable-pip-version-check -r tests/rls_requirements.txt >&2
"$python" -c "$check"
echo "$(cd "$venv" && pwd)/bin/python"
