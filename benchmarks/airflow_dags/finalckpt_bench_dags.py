"""The DAGs of the real-Airflow benchmark (``benchmarks/airflow_real.py``), one per entry of
``FINALCKPT_BENCH_DAGS`` (``side:dag_id`` pairs, comma-separated):

- ``ours``: the example pipeline (``examples/nycflights13/dag.py``: prepare_input -> ingest ->
  enrich -> delay_windows -> publish, every stage a ``@finalckpt_stage``, batches "auto");
- ``plain``: the same transforms as plain ``@task.pyspark`` tasks (``benchmarks.pipelines.
  run_plain`` of one stage per task: each reads its upstream's Parquet output and writes its
  own; publish writes the same Parquet table and SQL table), after the same prepare_input;
- ``warmup``: prepare_input (writes the input once), a tiny plain Spark task and a tiny stage
  (first imports, page cache, the triggerer's first trigger), untimed.

Both sides run Spark in the task process on ``local[*]`` with the UI off; no retries (a failure
shows as a failure, never as a retried run's seconds). Every task is profiled
(``benchmarks.airflow_profile``).
"""

from __future__ import annotations

from benchmarks import airflow_profile

airflow_profile.mark_parse_started()

import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from airflow.providers.apache.spark.decorators.pyspark import pyspark_task  # noqa: E402
from airflow.sdk import DAG  # noqa: E402

from airflow_finalckpt.decorators import finalckpt_stage  # noqa: E402
from airflow_finalckpt.examples.nycflights13.dag import (  # noqa: E402
    build_dag,
    example_dag,
    prepare_input_task,
)

airflow_profile.install()

WORK = Path(os.environ.get("FINALCKPT_BENCH_WORK", "/tmp/finalckpt-bench-airflow"))
INPUT = str(WORK / "input")
DAYS = int(os.environ.get("FINALCKPT_BENCH_DAYS", "365"))
STAGES = ("ingest", "enrich", "delay_windows", "publish")
#: What the stage operator sets for its own in-process session (spark_launch.py).
SPARK_CONF = {"spark.ui.enabled": "false"}


def out_dir(dag_id: str) -> str:
    path = WORK / "out" / dag_id
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def ours(dag_id: str) -> DAG:
    return build_dag(dag_id, input_dir=INPUT, output_dir=out_dir(dag_id), days=DAYS, retries=0)


def plain_stage(stage: str, output: str) -> Any:
    def run(spark: Any = None, sc: Any = None) -> dict[str, Any]:
        from benchmarks.pipelines import run_plain

        got = run_plain(spark, INPUT, output, only=(stage,))
        return {"stage": stage, "seconds": round(got.seconds, 3), "output_rows": got.output_rows}

    run.__name__ = stage
    return pyspark_task(task_id=stage, config_kwargs=dict(SPARK_CONF))(run)()


def plain(dag_id: str) -> DAG:
    output = out_dir(dag_id)
    with example_dag(dag_id, 0, "The example's transforms as plain @task.pyspark tasks.") as dag:
        previous = prepare_input_task(INPUT, output, DAYS)
        for stage in STAGES:
            task = plain_stage(stage, output)
            previous >> task
            previous = task
    return dag


def warmup(dag_id: str) -> DAG:
    output = out_dir(dag_id)
    with example_dag(dag_id, 0, "Untimed: input files, first imports, first trigger.") as dag:

        @pyspark_task(task_id="spark", config_kwargs=dict(SPARK_CONF))
        def spark_task(spark: Any = None, sc: Any = None) -> int:
            return int(spark.range(1000).count())

        @finalckpt_stage(splits=["a", "b"])
        def stage(ctx: Any) -> Any:
            return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "split string")

        prepare_input_task(INPUT, output, DAYS) >> spark_task() >> stage()
    return dag


BUILDERS = {"ours": ours, "plain": plain, "warmup": warmup}

for entry in filter(None, os.environ.get("FINALCKPT_BENCH_DAGS", "").split(",")):
    side, _, name = entry.partition(":")
    globals()[name] = BUILDERS[side](name)

airflow_profile.mark_parsed()
