#!/usr/bin/env bash
# Set up everything and run the whole test suite, then ruff and mypy.
#
# The end-to-end tests (tests/e2e: real Airflow deployments) spend most of their time waiting on
# schedulers, triggerers and Spark start-ups, so by default they run in one pytest process while
# the rest of the suite runs in a second one next to it (FINALCKPT_TEST_JOBS=1: one process, in
# order). Each process has its own AIRFLOW_HOME and lists its 25 slowest tests; the whole of
# .ci/run must stay under 40 minutes on 2 cores. Arguments (e.g. a path or -k) run one pytest
# process. FINALCKPT_REQUIRE_POSTGRES=1 turns "PostgreSQL not reachable" skips into failures, and
# FINALCKPT_CI_LANES=floors,spark35 adds the compatibility lanes (scripts/lane.sh); CI sets both.
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
  logs=$(mktemp -d -t finalckpt-test-logs-XXXX)
  # The compatibility lanes (FINALCKPT_CI_LANES=floors,spark35; .ci/run sets it): their
  # virtualenvs install now, beside the suite (pip waits on the network more than on the CPU);
  # their tests run in whichever of the two slots below finishes its own tests first.
  lanes=${FINALCKPT_CI_LANES:-}
  lanes=${lanes//,/ }
  for lane in $lanes; do
    echo "==> lane $lane: installing its virtualenv in the background (log: $logs/$lane-install.log)"
    ( rc=0; ./scripts/lane.sh "$lane" --install-only >"$logs/$lane-install.log" 2>&1 || rc=$?
      echo "$rc" >"$logs/$lane-install.rc" ) &
  done
  # Each slot, after its own tests, claims the next lane not yet claimed (mkdir is atomic).
  run_lanes() {
    local lane rc
    for lane in $lanes; do
      mkdir "$logs/$lane.claim" 2>/dev/null || continue
      while [ ! -f "$logs/$lane-install.rc" ]; do sleep 2; done
      rc=$(cat "$logs/$lane-install.rc")
      if [ "$rc" -eq 0 ]; then
        mkdir -p "$home/$lane"
        AIRFLOW_HOME=$home/$lane ./scripts/lane.sh "$lane" >"$logs/$lane.log" 2>&1 || rc=$?
      else
        cp "$logs/$lane-install.log" "$logs/$lane.log"
      fi
      echo "$rc" >"$logs/$lane.rc"
    done
  }
  echo "==> tests/e2e in a second pytest process (its output follows the rest's; live: $logs/e2e.log)"
  ( rc=0
    AIRFLOW_HOME=$home/e2e "${PYTEST[@]}" -p no:cacheprovider tests/e2e >"$logs/e2e.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/e2e.rc"
    run_lanes ) &
  e2e_pid=$!
  # an interrupted run stops the e2e process too (SIGINT: its fixtures stop their clusters)
  trap 'pkill -INT -P "$e2e_pid" 2>/dev/null; kill -INT "$e2e_pid" 2>/dev/null || true' EXIT
  rest_rc=0
  AIRFLOW_HOME=$home/rest "${PYTEST[@]}" --ignore=tests/e2e || rest_rc=$?
  run_lanes
  wait
  trap - EXIT
  echo "==> tests/e2e"
  cat "$logs/e2e.log"
  check "tests other than tests/e2e" "$rest_rc" || status=1
  check "tests/e2e" "$(cat "$logs/e2e.rc" 2>/dev/null || echo 1)" || status=1
  for lane in $lanes; do
    echo "==> lane $lane (scripts/lane.sh $lane)"
    cat "$logs/$lane.log"
    lane_rc=$(cat "$logs/$lane.rc" 2>/dev/null || echo 1)
    if [ "$lane_rc" -ne 0 ]; then
      echo "error: lane $lane failed with exit code $lane_rc" >&2
      status=1
    fi
  done
fi
[ "$status" -eq 0 ] || exit 1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
