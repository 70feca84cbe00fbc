#!/usr/bin/env bash
# Installs the Python gRPC client of cli/tests/rls.rs (cli/tests/rls_client.py: grpcio and Envoy's API stubs, pinned in
# cli/tests/rls_requirements.txt) into a venv, target/rls-venv unless RLS_VENV says otherwise, and prints the venv's
# python. Installs python3 and python3-venv with apt when they are missing (PEP 668: no pip into the system).
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
apt_install() {
  echo "installing $* (the RLS test's Python gRPC client)" >&2
  local sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$@" >&2
}
command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
# Debian's python3 makes no venv (no ensurepip) without python3-venv.
if ! python3 -m venv "$venv" >&2; then
  rm -rf "$venv"
  apt_install python3-venv
  python3 -m venv "$venv" >&2
fi
"$python" -m pip install --quiet --disable-pip-version-check -r cli/tests/rls_requirements.txt >&2
"$python" -c "$check"
echo "$(cd "$venv" && pwd)/bin/python"
