#!/usr/bin/env bash
# Checks every grafana/*.json dashboard against Grafana's own schema, without a Grafana server: the pinned
# @grafana/schema and typescript (npm, into target/grafana-schema) type-check each file as a `Dashboard` object
# literal (scripts/grafana-schema/wire.ts), so an unknown field, a missing required one or a value of the wrong
# kind fails with its line. Needs node and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
work=target/grafana-schema
mkdir -p "$work"
cp scripts/grafana-schema/package.json scripts/grafana-schema/wire.ts "$work/"
if [ ! -d "$work/node_modules/@grafana/schema" ] || [ scripts/grafana-schema/package.json -nt "$work/node_modules" ]; then
  (cd "$work" && npm install --no-audit --no-fund --silent)
fi
for dashboard in grafana/*.json; do
  name=$(basename "$dashboard" .json)
  {
    echo "import type { WireDashboard } from './wire';"
    printf 'export const dashboard: WireDashboard = '
    cat "$dashboard"
    echo ';'
  } > "$work/$name.ts"
  # Lines of the check file are the dashboard's, shifted by one.
  if ! (cd "$work" && npx tsc --noEmit --strict --skipLibCheck --target es2020 --module nodenext \
      --moduleResolution nodenext "$name.ts"); then
    echo "$dashboard does not fit Grafana's dashboard schema (@grafana/schema; line N above is line N-1 of the file)" >&2
    exit 1
  fi
  echo "$dashboard: fits Grafana's dashboard schema"
done
