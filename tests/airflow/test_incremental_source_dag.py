"""An incremental landing directory in a real DAG through ``dag.test()``: each run of the DAG
reads the files that landed since the previous run committed, a rerun of a day recomputes the
range that day read, and every row lands in the sink exactly once.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.store.cursors import ranges_of_pipeline
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.repository import pipeline_of_dag_run

pytestmark = pytest.mark.slow

DAG_SOURCE = """
from airflow.sdk import DAG
from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.sources import LandingDirectory

with DAG(DAG_ID, schedule=None) as dag:

    @finalckpt_stage(splits=LandingDirectory(LANDING, pattern="*.parquet"), batch_size=1)
    def read(ctx):
        return ctx.spark.read.parquet(*ctx.splits)

    @finalckpt_stage(commit_mode="final", sinks=[ParquetTableSink("out", OUT)])
    def publish(ctx):
        return ctx.read_parts()

    read() >> publish()
"""


@pytest.fixture
def work(
    airflow_home: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write_dag: Callable[..., Any],
) -> Iterator[dict[str, Any]]:
    store = f"sqlite:///{tmp_path}/coordination.db"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", store)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    hook_module.dispose_engines()
    landing = tmp_path / "landing"
    landing.mkdir()
    out = tmp_path / "out"
    dag_id = f"incremental_{uuid.uuid4().hex[:8]}"
    dag = write_dag(DAG_SOURCE, DAG_ID=dag_id, LANDING=str(landing), OUT=str(out))
    try:
        yield {"dag": dag, "landing": landing, "out": out, "store": store}
    finally:
        hook_module.dispose_engines()


def _land(landing: Path, name: str, ids: list[int]) -> None:
    hidden = landing / f"_{name}"
    pd.DataFrame({"id": ids}).to_parquet(hidden, index=False)
    hidden.rename(landing / name)


def _state(dag_run: Any) -> str:
    return str(dag_run.state).rsplit(".", 1)[-1].lower()


def test_each_run_reads_what_landed_since_the_last_commit(work: dict[str, Any]) -> None:
    dag, landing = work["dag"], work["landing"]
    engine = make_engine(work["store"])
    day = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    _land(landing, "a.parquet", [1, 2])
    _land(landing, "b.parquet", [3])
    first = dag.test(logical_date=day)
    assert _state(first) == "success"
    _land(landing, "c.parquet", [4, 5, 6])
    second = dag.test(logical_date=day + dt.timedelta(days=1))
    assert _state(second) == "success"
    keys = [pipeline_of_dag_run(engine, dag.dag_id, r.run_id) for r in (first, second)]
    ranges = [ranges_of_pipeline(engine, str(k))[0] for k in keys]
    assert [len(r.range.files) for r in ranges] == [2, 1]
    assert ranges[1].range.splits[0].endswith("/c.parquet")
    published = ParquetTableSink("out", str(work["out"])).read_pandas()
    assert sorted(published["id"].tolist()) == [1, 2, 3, 4, 5, 6]
    # a run with nothing new succeeds with an empty range
    third = dag.test(logical_date=day + dt.timedelta(days=2))
    assert _state(third) == "success"
    assert len(ParquetTableSink("out", str(work["out"])).read_pandas()) == 6
    engine.dispose()
