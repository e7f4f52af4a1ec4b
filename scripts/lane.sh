#!/usr/bin/env bash
# CI's extra compatibility lanes (docs/compatibility.md), each in its own virtualenv:
#
#   floors   .venv-floors, constraints/floors.txt: pyproject.toml's declared floors (Airflow
#            3.3.0, Spark provider 6.0.0, pyspark 4.0.1, pyiceberg 0.11.0, deltalake 1.1.0,
#            OpenLineage provider 2.10.0) with everything else at its newest. Runs tests/airflow
#            without the dag.test() scenarios the newest lane covers, except the branching one
#            (operator, decorator, sensor, triggers, plugin and its API, provider info,
#            OpenLineage, restore entry points, the branching DAG through every sink) and the
#            lakehouse sinks.
#   spark35  .venv-spark35, constraints/spark35.txt: the driver side on pyspark 3.5 with no
#            Airflow installed: the Spark-driver tests and the example's stages (tests/spark,
#            the Spark tests of tests/integration, tests/spark35).
#
#   scripts/lane.sh NAME [--install-only] [pytest args...]
#
# --install-only sets the virtualenv up and stops (.ci/run installs both while the main suite
# runs: pip waits on the network, not on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
lane=${1:?usage: scripts/lane.sh floors|spark35 [--install-only] [pytest args]}
shift
case "$lane" in
  floors)
    venv=.venv-floors
    extras=airflow,spark,postgres,examples,lakehouse,lineage,dev
    # the newest lane runs these dag.test() scenarios; one full DAG (branching) runs here
    tests=(
      tests/airflow
      tests/integration/test_sinks_lakehouse.py
      --ignore=tests/airflow/test_asset_events.py
      --ignore=tests/airflow/test_checkpoint_metrics.py
      --ignore=tests/airflow/test_example_dag.py
      --ignore=tests/airflow/test_example_runner_crash.py
      --ignore=tests/airflow/test_restore_dag.py
      --ignore=tests/airflow/test_route_totals_dag.py
    )
    ;;
  spark35)
    venv=.venv-spark35
    extras=spark,postgres,examples,lakehouse,dev
    # the files verified on 3.5 (a new driver-side test joins once it passes there)
    tests=(
      tests/spark35
      tests/spark/test_bad_input.py
      tests/spark/test_gc_pipeline.py
      tests/spark/test_runtime_lakehouse.py
      tests/spark/test_runtime_pipeline.py
      tests/spark/test_stage_values.py
      tests/integration/test_windows_spark.py
      tests/integration/test_sinks_spark.py
      tests/integration/test_sinks_sql_spark.py
      tests/integration/test_sinks_lakehouse.py
      tests/integration/test_nycflights_transforms.py
      # these two build an Airflow DAG / record Airflow's metrics: the newest lane runs them
      --deselect tests/spark/test_bad_input.py::test_duplicate_stage_id_and_cycle_in_dag
      --deselect tests/spark/test_runtime_lakehouse.py::test_example_pipeline_publishes_to_iceberg_and_delta_exactly_once
    )
    # the task side's pickles come from the newest lane's pyspark 4.x (tests/spark35)
    if [ -x .venv/bin/python ]; then
      export FINALCKPT_TASK_SIDE_PYTHON=${FINALCKPT_TASK_SIDE_PYTHON:-$PWD/.venv/bin/python}
    fi
    ;;
  *)
    echo "error: unknown lane '$lane' (floors or spark35)" >&2
    exit 2
    ;;
esac
VENV=$venv FINALCKPT_CONSTRAINTS=constraints/$lane.txt FINALCKPT_EXTRAS=$extras ./scripts/setup.sh
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
if [ "$lane" = spark35 ] && "$venv/bin/python" -c 'import airflow' 2>/dev/null; then
  echo "error: $venv has Airflow installed; the driver-side lane must run without it" >&2
  exit 1
fi
"$venv/bin/python" -c 'import pyspark, sys; print(f"==> lane {sys.argv[1]}: pyspark {pyspark.__version__}")' "$lane"
home=${AIRFLOW_HOME:-$(mktemp -d -t "finalckpt-$lane-home-XXXX")}
rc=0
AIRFLOW_HOME=$home "$venv/bin/python" -m pytest -q --durations=10 -p no:cacheprovider \
  "${tests[@]}" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest (lane $lane) collected no tests" >&2
  exit 1
fi
exit "$rc"
