#!/usr/bin/env bash
# Set up everything and run the whole test suite, then ruff and mypy (the 25 slowest tests are listed:
# the suite must stay well under 30 minutes on 2 cores).
# FINALCKPT_REQUIRE_POSTGRES=1 turns "PostgreSQL not reachable" skips into failures (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export AIRFLOW_HOME=${AIRFLOW_HOME:-$(mktemp -d -t finalckpt-airflow-home-XXXX)}
status=0
.venv/bin/python -m pytest -q --durations=25 "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
[ "$status" -eq 0 ] || exit "$status"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
