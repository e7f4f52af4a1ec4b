#!/usr/bin/env bash
# Set up everything and run the whole test suite, then ruff and mypy.
#
# The end-to-end tests (tests/e2e: real Airflow deployments) spend most of their time waiting on
# schedulers, triggerers and Spark start-ups, so by default the suite runs in three pytest
# processes side by side (FINALCKPT_TEST_JOBS=1: one process, in order): the branching e2e
# modules with the benchmark smoke; the other e2e modules with the Spark standalone cluster
# tests; the rest. Each lane has
# its own AIRFLOW_HOME and lists its 25 slowest tests; the suite must stay well under 30 minutes
# on 2 cores. Arguments (e.g. a path or -k) run one pytest process.
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
  # Lanes 1 and 2 run in the background with live logs, printed after lane 3 (the rest).
  branching=(tests/e2e/test_branching_faults.py tests/e2e/test_example_pipeline.py tests/e2e/test_harness.py)
  smoke=tests/integration/test_benchmarks_quick.py  # ~2.5 min: evens the lanes out
  lane_names=("tests/e2e (branching) + the benchmark smoke" "tests/e2e (others) + tests/cluster")
  lane_args=("${branching[*]} $smoke" "tests/e2e tests/cluster ${branching[*]/#/--ignore=}")
  pids=()
  logs=()
  for i in 0 1; do
    mkdir -p "$home/lane$i"
    logs[i]=$(mktemp -t "finalckpt-lane$i-XXXX.log")
    echo "==> ${lane_names[i]} in a pytest process of its own (live: ${logs[i]})"
    # shellcheck disable=SC2086  # the lane's arguments are words
    AIRFLOW_HOME=$home/lane$i "${PYTEST[@]}" -p no:cacheprovider ${lane_args[i]} >"${logs[i]}" 2>&1 &
    pids[i]=$!
  done
  # an interrupted run stops the lanes too (SIGINT: their fixtures stop their clusters)
  trap 'kill -INT "${pids[@]}" 2>/dev/null || true' EXIT
  mkdir -p "$home/rest"
  rest_rc=0
  AIRFLOW_HOME=$home/rest "${PYTEST[@]}" --ignore=tests/e2e --ignore=tests/cluster --ignore=$smoke ||
    rest_rc=$?
  lane_rc=(0 0)
  for i in 0 1; do
    wait "${pids[i]}" || lane_rc[i]=$?
  done
  trap - EXIT
  check "the rest (tests other than the two lanes')" "$rest_rc" || status=1
  for i in 0 1; do
    echo "==> ${lane_names[i]}"
    cat "${logs[i]}"
    check "${lane_names[i]}" "${lane_rc[i]}" || status=1
  done
fi
[ "$status" -eq 0 ] || exit 1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
