"""The stage operator on a Spark Connect server (``spark_master="sc://..."``) through a real
Airflow ``dag.test()``, killed in the middle of a batch and retried (issue 28).

One stage (6 splits, one per batch) runs its batches on the fixture's Connect server: a slow
Python UDF on the server's Python workers, rows into a Parquet and a SQL sink. While split 3's
batch runs there (its UDF has started), the task is killed as Airflow kills a task: the
operator's ``on_kill`` (what the Task SDK calls on SIGTERM) interrupts every job of the
task's Connect session and stops it. Try 1 fails; try 2 opens a new Connect session, resumes
from the durable progress (splits 0-2 are not redone) and finishes. The sinks then hold the rows
of one uninterrupted run, each exactly once.

``dag.test()`` runs in a child process: pyspark refuses a remote (Connect) session in a process
that already has a classic one (the suite's shared local session), as an Airflow worker would
not have both either. The child uses this test's Airflow home and metadata database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .test_operator_cluster import HANG_S, _ti, _xcom

SPLITS = [str(i) for i in range(6)]
ROWS = 8
KILL_AT = 3

CONNECT_DAG = """
import os
import threading
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG, get_current_context

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink


def kill_when_running(task, marker):
    deadline = time.time() + HANG_S
    while not os.path.exists(marker):
        if time.time() > deadline:
            return
        time.sleep(0.1)
    open(KILLED, "w").close()
    task.on_kill()  # what the Task SDK calls when Airflow kills the task


def squares(ctx):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    (split,) = ctx.splits
    n = int(split)
    marks, slow_s = MARKS, SLOW_S
    marker = os.path.join(marks, f"running-{n}")
    if n == KILL_AT and not os.path.exists(KILLED):
        task = get_current_context()["task"]
        threading.Thread(target=kill_when_running, args=(task, marker), daemon=True).start()

    def slow_square(x):  # runs in the Connect server's Python workers
        import os
        import time

        open(os.path.join(marks, f"running-{n}"), "a").close()
        time.sleep(slow_s)
        return x * x

    udf = F.udf(slow_square, T.LongType())
    frame = ctx.spark.range(n * ROWS, (n + 1) * ROWS, numPartitions=2)
    return frame.select(F.col("id"), udf(F.col("id")).alias("sq"), F.lit(n).alias("split"))


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="squares",
        transform=squares,
        splits=SPLITS,
        batch_size=1,
        checkpoint_interval=3600.0,
        sinks=[
            ParquetTableSink("squares_parquet", OUT + "/parquet"),
            SqlTableSink("squares_sql", "sqlite:///" + OUT + "/out.db", "squares"),
        ],
        spark_master=MASTER,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
"""

CHILD = """
import importlib.util
import sys

spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test()
print("dag run state:", run.state)
"""


def test_operator_on_spark_connect_killed_mid_batch_resumes_exactly_once(
    spark_connect_server: Any,
    airflow_dags_folder: Path,
    tmp_path: Path,
) -> None:
    out, marks = tmp_path / "out", tmp_path / "marks"
    out.mkdir()
    marks.mkdir()
    store_url = f"sqlite:///{tmp_path}/coordination.db"
    ensure_schema(make_engine(store_url))
    name = f"connect_dag_{uuid.uuid4().hex[:12]}"
    params = {
        "DAG_ID": name,
        "SPLITS": SPLITS,
        "ROWS": ROWS,
        "KILL_AT": KILL_AT,
        "KILLED": str(tmp_path / "killed"),
        "MARKS": str(marks),
        "SLOW_S": 1.0,
        "OUT": str(out),
        "MASTER": spark_connect_server.url,
        "HANG_S": HANG_S,
    }
    path = airflow_dags_folder / f"{name}.py"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in params.items()) + CONNECT_DAG)
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW__FINALCKPT__STORE_URL": store_url,
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"),
        }
    )
    env = {k: v for k, v in env.items() if not k.startswith("AIRFLOW_CONN_SPARK")}
    root = str(Path(__file__).resolve().parents[2])
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), name],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
            cwd=root,
            env=env,
        )
    finally:
        path.unlink(missing_ok=True)
    output = child.stdout[-4000:] + child.stderr[-4000:]
    assert child.returncode == 0, output
    assert (tmp_path / "killed").exists(), output  # on_kill ran while split 3's UDF ran

    class Run:  # what the metadata helpers read
        dag_id = name
        run_id = _run_id(name)

    state, try_number = _ti(Run, "squares")
    assert (state, try_number) == ("success", 2), output
    # try 2 resumed: the splits made durable before the kill were not processed again
    run = _xcom(Run, "squares", "stage_run")
    assert run["status"] == "finished", run
    assert set(run["processed_splits"]) <= {"3", "4", "5"} and "5" in run["processed_splits"]

    coordinator = Coordinator(make_engine(store_url), _pipeline_key(store_url))
    assert coordinator.stage("squares").lifecycle is StageLifecycle.CLOSED
    txns = coordinator.transactions("squares")
    assert txns and {state for _, state in txns} == {"COMMITTED"}, txns
    parquet = ParquetTableSink("squares_parquet", str(out / "parquet"))
    sql = SqlTableSink("squares_sql", f"sqlite:///{out}/out.db", "squares")
    expected = sorted((i, i * i, i // ROWS) for i in range(len(SPLITS) * ROWS))
    for frame in (parquet.read_pandas(), sql.read_pandas()):
        got = sorted(zip(frame["id"], frame["sq"], frame["split"], strict=True))
        assert got == expected  # every row once: nothing lost, nothing twice
    ids = [(t.sink_id, t.txn_id) for t, _ in txns]
    assert len(ids) == len(set(ids))
    assert parquet.committed_txn_ids() == {t for s, t in ids if s == parquet.sink_id}
    assert sql.committed_txn_ids() == {t for s, t in ids if s == sql.sink_id}


def _run_id(dag_id: str) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return str(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id)).one())


def _pipeline_key(store_url: str) -> str:
    from sqlalchemy import text

    with make_engine(store_url).connect() as conn:
        return str(conn.execute(text("SELECT pipeline_key FROM finalckpt_pipelines")).scalar_one())
