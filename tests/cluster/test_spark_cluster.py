"""The example pipeline through a local Spark Connect server (``sc://``): the runtime in a
client process, the Spark work on the server.

The spark-submit path (client mode on the standalone cluster, worker and driver kills, the
refused cluster mode) is tested through the stage operator and real Airflow in
``test_operator_cluster.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.spark.launch import ExecutionMode, resolve_target
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema


def _env(tmp_path: Path, days: Sequence[Any]) -> dict[str, Any]:
    inputs = tmp_path / "inputs"
    prepare_inputs(inputs, days=days)
    store_url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(store_url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    sinks = [
        ParquetTableSink("windows_parquet", str(tmp_path / "out" / "windows")),
        SqlTableSink("windows_sql", f"sqlite:///{tmp_path}/out.db", "delay_windows"),
    ]
    return {
        "inputs": str(inputs),
        "store_url": store_url,
        "coordinator": Coordinator(engine, "nyc", writer=storage),
        "storage": storage,
        "sinks": sinks,
    }


def _check_exactly_once(env: Mapping[str, Any], days: Sequence[Any]) -> None:
    coordinator: Coordinator = env["coordinator"]
    expected = reference_pipeline(days)
    parquet, sql = env["sinks"]
    for actual in (parquet.read_pandas(), sql.read_pandas()):
        assert_windows_match(actual, expected.windows)
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in coordinator.stages().values())
    txns = coordinator.transactions()
    assert txns and {state for _, state in txns} == {"COMMITTED"}, txns
    ids = [(t.sink_id, t.txn_id) for t, _ in txns]
    assert len(ids) == len(set(ids))
    # Each committed transaction is recorded once by each sink (no replayed duplicate commit).
    assert parquet.committed_txn_ids() == {t for s, t in ids if s == parquet.sink_id}
    assert sql.committed_txn_ids() == {t for s, t in ids if s == sql.sink_id}


CONNECT_CHILD = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from pyspark.sql import SparkSession

from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.runtime.runner import RunStatus
from tests.cluster.test_spark_cluster import _env

env = _env(Path(sys.argv[3]), first_days(int(sys.argv[4])))
spark = SparkSession.builder.remote(sys.argv[2]).getOrCreate()
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
try:
    run = run_example_locally(
        spark,
        env["inputs"],
        env["coordinator"],
        env["storage"],
        env["sinks"],
        batch_sizes={"ingest": 3, "enrich": 1, "delay_windows": 2, "publish": 2},
        checkpoint_interval_s=3600.0,
    )
finally:
    spark.stop()
assert all(r.status is RunStatus.FINISHED for r in run.results.values()), run.results
print("connect pipeline finished")
"""


def test_pipeline_through_spark_connect(spark_connect_server: Any, tmp_path: Path) -> None:
    """Every stage's runtime in a client process, its Spark work on the Connect server.

    The client runs in its own process: pyspark refuses a remote session in a process that
    already has a classic one (the suite's shared local session), as an Airflow worker would
    not have both either.
    """
    days = first_days(6)
    env = _env(tmp_path, days)
    target = resolve_target(spark_master=spark_connect_server.url, spark_conn_id=None, lookup=False)
    assert target.mode is ExecutionMode.CONNECT
    root = str(Path(__file__).resolve().parents[2])
    child = subprocess.run(
        [sys.executable, "-c", CONNECT_CHILD, root, target.master, str(tmp_path), str(len(days))],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        cwd=root,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    assert "connect pipeline finished" in child.stdout
    _check_exactly_once(env, days)
    assert os.path.exists(spark_connect_server.daemon.log)
