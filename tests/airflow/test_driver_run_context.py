"""A stage submitted through ``spark-submit`` sees its Airflow run like an in-process one: the
task captures the run context (logical date, data interval, params, conf) into the job spec and
the real driver (``spark.driver.run_job``, run by a spark-submit stand-in in this process on the
shared local SparkSession) hands it to the transform, without importing Airflow for it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark.job import STORAGE_OPTIONS_ENV, STORAGE_URI_ENV, STORE_URL_ENV
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget
from airflow_finalckpt.spark.launch.submit import SubmitLauncher
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

START = dt.datetime(2013, 1, 5, tzinfo=dt.UTC)


class InProcessDriver:
    """A SparkSubmitHook stand-in: runs the real driver on the submitted spec, in this process."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def submit(self, application: str) -> None:
        if driver.run_job(self.kwargs["application_args"][1]) != 0:
            raise RuntimeError("the driver wrote an error")

    def on_kill(self) -> None:
        pass


def driver_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, stage_id: str
) -> tuple[str, CheckpointStorage, Coordinator]:
    """A one-stage pipeline in a SQLite store, with the environment a submitted driver reads."""
    url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = Coordinator(engine, key, writer=storage)
    coordinator.register(StageGraph.from_edges([stage_id], []))
    monkeypatch.setenv(STORE_URL_ENV, url)
    monkeypatch.setenv(STORAGE_URI_ENV, storage.root_uri)
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    return url, storage, coordinator


def transform(ctx: Any) -> Any:
    seen = {
        "start": ctx.data_interval_start.isoformat(),
        "end": ctx.data_interval_end.isoformat(),
        "ds": ctx.ds,
        "params": ctx.params,
        "conf": ctx.conf,
        "run_id": ctx.run_id,
    }
    return ctx.spark.createDataFrame([(json.dumps(seen, sort_keys=True),)], "seen string")


def test_a_submitted_driver_hands_the_run_context_to_the_transform(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, storage, coordinator = driver_store(tmp_path, monkeypatch, "daily", "read_day")
    run = RunContext.of(
        dag_id="daily",
        run_id="scheduled__2013-01-05",
        logical_date=START,
        data_interval_start=START,
        data_interval_end=START + dt.timedelta(days=1),
        params={"region": "EWR"},
        conf={"note": "rerun"},
    )
    launcher = SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "spark://m:7077", "client"),
        storage,
        store_url=url,
        store_url_masked=mask_url(url),
        poll_interval_s=0.05,
        hook_factory=InProcessDriver,
    )
    spec = StageSpec(pipeline_key="daily", stage_id="read_day", splits=("a",), batch_size=1)
    job, code = launcher.build_job(StageJob(spec, run=run), StageCode(transform=transform))
    assert job.run_context["data_interval_start_iso"] == "2013-01-05T00:00:00+00:00"
    outcome = launcher.run(job, code, {})
    assert outcome.result.processed_splits == ("a",)
    (part,) = coordinator.stage("read_day").final_snapshot.end_of_data.manifest  # type: ignore[union-attr]
    (row,) = spark.read.parquet(storage.resolve_handle("daily", part)).collect()
    assert json.loads(row.seen) == {
        "start": "2013-01-05T00:00:00+00:00",
        "end": "2013-01-06T00:00:00+00:00",
        "ds": "2013-01-05",
        "params": {"region": "EWR"},
        "conf": {"note": "rerun"},
        "run_id": "scheduled__2013-01-05",
    }


def ten_bytes(split: str) -> int:
    return 10


def count_rows(ctx: Any) -> Any:
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "split string")


@pytest.mark.parametrize("split_bytes", [{"a": 10, "b": 10, "c": 10}, ten_bytes])
def test_a_submitted_driver_sizes_a_cold_source_from_its_split_bytes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split_bytes: Any
) -> None:
    """``split_bytes`` travels with the stage code (a dict pickled, a function by reference): the
    driver's first auto batch takes all three splits (30 bytes), not a one-split probe."""
    from airflow_finalckpt.storage.hints import StorageThroughputHints

    url, storage, _ = driver_store(tmp_path, monkeypatch, "sized", "ingest")
    launcher = SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "spark://m:7077", "client"),
        storage,
        store_url=url,
        store_url_masked=mask_url(url),
        poll_interval_s=0.05,
        hook_factory=InProcessDriver,
    )
    spec = StageSpec(pipeline_key="sized", stage_id="ingest", splits=("a", "b", "c"))
    code = StageCode(transform=count_rows, split_bytes=split_bytes)
    job, pickled = launcher.build_job(StageJob(spec, hints_scope="dag-sized"), code)
    assert job.code["split_bytes"] == (
        "pickle" if isinstance(split_bytes, dict) else f"ref:{__name__}:ten_bytes"
    )
    outcome = launcher.run(job, pickled, {})
    assert outcome.result.processed_splits == ("a", "b", "c")
    hint = StorageThroughputHints(storage, "dag-sized").load("ingest")
    assert hint is not None and hint.by_bytes
    assert [(s.splits, s.weight) for s in hint.samples] == [(3, 30.0)]
