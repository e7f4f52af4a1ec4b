#!/usr/bin/env bash
# Set up everything and run the whole test suite, then ruff and mypy.
#
# The end-to-end tests (tests/e2e: real Airflow deployments) spend most of their time waiting on
# schedulers, triggerers and Spark start-ups, so by default they run in one pytest process while
# the rest of the suite runs in a second one next to it (FINALCKPT_TEST_JOBS=1: one process, in
# order). Each process has its own AIRFLOW_HOME and lists its 25 slowest tests; the suite must
# stay well under 30 minutes on 2 cores. Arguments (e.g. a path or -k) run one pytest process.
# FINALCKPT_REQUIRE_POSTGRES=1 turns "PostgreSQL not reachable" skips into failures (CI sets it).
# --fast: the inner loop's tier only (tests/unit: the core rules, the coordinator's transitions
# on plain values, the runtime with fakes; ~2 minutes here), then ruff; no Spark, Airflow or e2e.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "${1:-}" = "--fast" ]; then
  shift
  AIRFLOW_HOME=${AIRFLOW_HOME:-$(mktemp -d -t finalckpt-airflow-home-XXXX)} .venv/bin/python -m pytest -q --durations=10 -p no:cacheprovider tests/unit "$@"
  .venv/bin/ruff check .
  exit 0
fi
home=${AIRFLOW_HOME:-$(mktemp -d -t finalckpt-airflow-home-XXXX)}
PYTEST=(.venv/bin/python -m pytest -q --durations=25)

# pytest exits 5 when it collected no test: that is an error here, not a pass.
check() {
  local name=$1 status=$2
  if [ "$status" -eq 5 ]; then
    echo "error: pytest ($name) collected no tests" >&2
    return 1
  fi
  if [ "$status" -ne 0 ]; then
    echo "error: pytest ($name) failed with exit code $status" >&2
    return 1
  fi
}

status=0
if [ "$#" -gt 0 ] || [ "${FINALCKPT_TEST_JOBS:-2}" = "1" ]; then
  rc=0
  AIRFLOW_HOME=$home "${PYTEST[@]}" "$@" || rc=$?
  check "whole suite" "$rc" || status=1
else
  mkdir -p "$home/e2e" "$home/rest"
  e2e_log=$(mktemp -t finalckpt-e2e-XXXX.log)
  echo "==> tests/e2e in a second pytest process (its output follows the rest's; live: $e2e_log)"
  e2e_rc=0
  AIRFLOW_HOME=$home/e2e "${PYTEST[@]}" -p no:cacheprovider tests/e2e >"$e2e_log" 2>&1 &
  e2e_pid=$!
  # an interrupted run stops the e2e process too (SIGINT: its fixtures stop their clusters)
  trap 'kill -INT "$e2e_pid" 2>/dev/null || true' EXIT
  rest_rc=0
  AIRFLOW_HOME=$home/rest "${PYTEST[@]}" --ignore=tests/e2e || rest_rc=$?
  wait "$e2e_pid" || e2e_rc=$?
  trap - EXIT
  echo "==> tests/e2e"
  cat "$e2e_log"
  check "tests other than tests/e2e" "$rest_rc" || status=1
  check "tests/e2e" "$e2e_rc" || status=1
fi
[ "$status" -eq 0 ] || exit 1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
