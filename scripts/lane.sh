#!/usr/bin/env bash
# CI's extra compatibility lanes (docs/compatibility.md), each in its own virtualenv:
#
#   floors   .venv-floors, constraints/floors.txt: pyproject.toml's declared floors (Airflow
#            3.3.0, Spark provider 6.0.0, pyspark 4.0.1, pyiceberg 0.11.0, deltalake 1.6.6,
#            OpenLineage provider 2.20.3) with everything else at its newest. Runs the Airflow
#            API tests (operator, sensor, triggers, plugin and its API app, provider info,
#            OpenLineage), the branching DAG through dag.test() into every sink, and the
#            lakehouse sinks. Also the amazon provider (in no extra; pinned in floors.txt) and
#            the storage-connection tests, whose AwsBaseHook test skips without it.
#   wheel    .venv-wheel, constraints/newest.txt: the newest allowed versions, as .venv, but the
#            package from its wheel instead of the editable checkout; the floors lane's Airflow
#            tests (not the storage-connection ones: no amazon provider here).
#   spark35  .venv-spark35, constraints/spark35.txt: the driver side on pyspark 3.5 with no
#            Airflow installed: a submitted driver running an example stage (tests/spark35),
#            the example's four stages through the runtime, state and broadcast tables, windows,
#            and every sink's Spark write.
#
#   scripts/lane.sh NAME [--install-only] [pytest args...]
#
# --install-only sets the virtualenv up and stops (.ci/run installs all three while the main suite
# runs: pip waits on the network, not on the CPU). Extra pytest paths: absolute (see below).
#
# A lane tests the package as a platform installs it: the wheel (scripts/build_wheel.sh;
# FINALCKPT_WHEEL=<file> names one built already, as scripts/test.sh does for every lane), not
# the checkout, with the lane's extras and constraints (scripts/setup.sh, FINALCKPT_INSTALL=wheel).
# The checkout must not stand in for it: pytest runs in an empty working directory (Spark's
# Python workers, `python -m pyspark.daemon`, put their working directory first on sys.path)
# with a pythonpath holding tests/, faults/ and benchmarks/ only (pyproject's `pythonpath = ["."]`
# would put the checkout's airflow_finalckpt/ first), and tests/conftest.py stops the run if
# airflow_finalckpt imports from anywhere but the lane's site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=${1:?usage: scripts/lane.sh floors|wheel|spark35 [--install-only] [pytest args]}
shift
# the Airflow and provider APIs the package uses, and one whole DAG (the branching example
# through dag.test() into every sink); the newest lane (.venv) runs the other dag.test() scenarios
airflow_tests=(
  tests/airflow/test_api_app.py
  tests/airflow/test_plugin.py
  tests/airflow/test_provider.py
  tests/airflow/test_operator_settings.py
  tests/airflow/test_stage_operator.py
  tests/airflow/test_sensor.py
  tests/airflow/test_triggers.py
  tests/airflow/test_openlineage.py
  tests/airflow/test_branching_dag.py
  tests/integration/test_sinks_lakehouse.py
)
case "$lane" in
  wheel)
    # the newest allowed versions (constraints/newest.txt, as .venv) but the wheel, not the
    # checkout: what `pip install airflow-finalckpt[...]` gives a platform today
    venv=.venv-wheel
    extras=airflow,spark,postgres,examples,lakehouse,lineage,dev
    requirements=
    tests=("${airflow_tests[@]}")
    constraints=newest
    ;;
  floors)
    venv=.venv-floors
    extras=airflow,spark,postgres,examples,lakehouse,lineage,dev
    tests=("${airflow_tests[@]}" tests/unit/test_storage_connections.py)
    # An `aws` storage connection resolves through the amazon provider's AwsBaseHook where it
    # is installed. The provider is in no extra (boto3, botocore and ~25 more packages) and
    # needs python-dateutil < 3, which newest.txt's 4.0.0 is not: installed here only, where
    # everything but the floors resolves freely. The hook's test must run here, not skip.
    requirements=apache-airflow-providers-amazon
    export FINALCKPT_REQUIRE_AMAZON=1
    ;;
  spark35)
    venv=.venv-spark35
    extras=spark,postgres,examples,lakehouse,dev
    requirements=
    # the files verified on 3.5 (a new driver-side test joins once it passes there)
    tests=(
      tests/spark35
      tests/spark/test_runtime_pipeline.py
      tests/spark/test_stage_values.py
      tests/spark/test_py4j_nodelay.py
      tests/integration/test_windows_spark.py
      tests/integration/test_sinks_spark.py
      tests/integration/test_sinks_sql_spark.py
      tests/integration/test_sinks_lakehouse.py
    )
    # no CDS archive (tests/spark_cds.py): the task side here runs the newest lane's pyspark
    export FINALCKPT_E2E_CDS=0
    # the task side's pickles come from the newest lane's pyspark 4.x (tests/spark35)
    if [ -x .venv/bin/python ]; then
      export FINALCKPT_TASK_SIDE_PYTHON=${FINALCKPT_TASK_SIDE_PYTHON:-$PWD/.venv/bin/python}
    fi
    ;;
  *)
    echo "error: unknown lane '$lane' (floors, wheel or spark35)" >&2
    exit 2
    ;;
esac
VENV=$venv FINALCKPT_CONSTRAINTS=constraints/${constraints:-$lane}.txt FINALCKPT_EXTRAS=$extras \
  FINALCKPT_REQUIREMENTS=$requirements FINALCKPT_INSTALL=wheel ./scripts/setup.sh
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
if [ "$lane" = spark35 ] && "$venv/bin/python" -c 'import airflow' 2>/dev/null; then
  echo "error: $venv has Airflow installed; the driver-side lane must run without it" >&2
  exit 1
fi
"$venv/bin/python" -c 'import pyspark, sys; print(f"==> lane {sys.argv[1]}: pyspark {pyspark.__version__}")' "$lane"
home=${AIRFLOW_HOME:-$(mktemp -d -t "finalckpt-$lane-home-XXXX")}
repo=$PWD
python=$repo/$venv/bin/python
# The test helpers' packages without the product's: tests (tests.spark_cds, ...), the fault
# harness and the benchmarks, linked from an otherwise empty directory.
work=$(mktemp -d -t "finalckpt-$lane-work-XXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/path"
for name in tests faults benchmarks; do
  ln -s "$repo/$name" "$work/path/$name"
done
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rc=0
(cd "$work" && AIRFLOW_HOME=$home FINALCKPT_LANE_SITE_PACKAGES=$site \
  "$python" -m pytest -q --durations=10 -p no:cacheprovider --rootdir="$repo" \
  -c "$repo/pyproject.toml" -o pythonpath="$work/path" "${tests[@]/#/$repo/}" "$@") || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest (lane $lane) collected no tests" >&2
  exit 1
fi
exit "$rc"
