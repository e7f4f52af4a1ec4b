#!/usr/bin/env bash
# Build the plugin's React apps (ui/: the Pipelines list and the run's Pipeline tab) into the
# bundle the Python package serves and ships in its wheel:
#   airflow_finalckpt/plugins/api/static/ui/finalckpt-ui.js
# with `npm ci` (the versions of ui/package-lock.json), `npm run build` (tsc + vite) and
# `npm test` (vitest: the views' rules, ui/src/rules.test.ts).
# Idempotent: nothing runs when the bundle was built from the same sources (ui/'s package files,
# configs and src/, hashed into a stamp beside the bundle), so a set-up or wheel build without
# changes to ui/ needs neither Node nor the network. Needs Node >= 20 and npm otherwise.
# scripts/setup.sh and scripts/build_wheel.sh call it.
set -euo pipefail
cd "$(dirname "$0")/.."

out=airflow_finalckpt/plugins/api/static/ui
bundle=$out/finalckpt-ui.js
stamp=$out/.build-stamp
# the sources: every tracked or untracked-but-not-ignored file of ui/ except node_modules
want=$( (cd ui && find . -path ./node_modules -prune -o -type f -print | LC_ALL=C sort \
  | xargs sha256sum) | sha256sum | cut -d' ' -f1)
if [ -f "$bundle" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "error: Node.js >= 20 and npm are needed to build the plugin's UI (ui/ -> $bundle)." >&2
  echo "       Debian/Ubuntu: sudo apt-get install -y nodejs npm (or https://nodejs.org/en/download)" >&2
  echo "       macOS: brew install node@20" >&2
  exit 1
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "error: Node.js >= 20 is needed to build the plugin's UI, found $(node --version)." >&2
  exit 1
fi

echo "==> building the UI bundle ($bundle) with npm ci + npm run build" >&2
started=$(date +%s)
(cd ui && npm ci --no-audit --no-fund --loglevel=error >&2 && npm run --silent build >&2 \
  && npm test --silent >&2)
test -s "$bundle" || { echo "error: npm run build wrote no $bundle" >&2; exit 1; }
echo "$want" > "$stamp"
echo "==> UI bundle built in $(( $(date +%s) - started )) s" >&2
