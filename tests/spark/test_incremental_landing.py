"""An incremental landing directory through the real runtime on real Spark: scheduled runs
with a writer appending between and during runs, crashes at the source, at the commit, and
between the commit and the cursor's advance; every row written is published exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StopMode
from airflow_finalckpt.core.source_cursor import RangeState
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sources import LandingDirectory
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.cursors import ranges_of_pipeline, read_cursor
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.spark.incremental_pipeline import (
    IncrementalEnv,
    InjectedCrash,
    run_pipeline,
    write_rows,
)


@pytest.fixture
def env(tmp_path: Path) -> IncrementalEnv:
    landing = tmp_path / "landing"
    landing.mkdir()
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    return IncrementalEnv(
        engine=engine,
        storage=CheckpointStorage(str(tmp_path / "checkpoints")),
        sink=ParquetTableSink("out", str(tmp_path / "out")),
        source=LandingDirectory(f"file://{landing}", pattern="*.parquet"),
    )


def _landing(env: IncrementalEnv) -> Path:
    return Path(env.source.url.removeprefix("file://"))  # type: ignore[attr-defined]


#: run index -> the (stage, point) at which its first attempt crashes; the retry continues
CRASHES = {
    1: ("read", "claim"),  # before the range is recorded
    2: ("read", "mid-batch"),  # in the source, a batch's Spark work done, not recorded
    3: ("publish", "before-commit"),  # checkpoint complete, nothing committed
    4: ("publish", "mid-commit"),  # sink committed, cursor not advanced (between the two)
    5: ("publish", "after-close"),  # cursor advanced with the close: a retry reads nothing
    7: ("read", "after-finish"),  # the source finished, its final checkpoint not yet closed
}


def test_ten_runs_with_crashes_publish_every_row_once(
    spark: SparkSession, env: IncrementalEnv
) -> None:
    landing = _landing(env)
    written: list[int] = []
    late_files: dict[str, str] = {}
    next_id = 0
    for index in range(10):
        key = f"run-{index}"
        for n in range(2):  # the writer appends between runs
            written += write_rows(landing, f"r{index}-{n}.parquet", next_id, 5)
            next_id += 5
        fired: set[str] = set()

        def fault(
            stage: str, point: str, index: int = index, key: str = key, fired: set[str] = fired
        ) -> None:
            nonlocal next_id, written
            if stage == "read" and point == "before-batch" and "late" not in fired:
                fired.add("late")  # ... and during the run, after its range was recorded
                name = f"late-{index}.parquet"
                written += write_rows(landing, name, next_id, 3)
                next_id += 3
                late_files[key] = name
            if CRASHES.get(index) == (stage, point) and "crash" not in fired:
                fired.add("crash")
                raise InjectedCrash(f"{key}: crash at {stage}/{point}")

        try:
            run_pipeline(spark, env, key, fault=fault)
        except InjectedCrash:
            assert index in CRASHES
            run_pipeline(spark, env, key, fault=fault)  # Airflow's retry of the task
        assert "crash" in fired or index not in CRASHES
        (rng,) = ranges_of_pipeline(env.engine, key)  # type: ignore[arg-type]
        assert rng.state is RangeState.COMMITTED
        # a file landing during the run belongs to the next run
        assert not any(s.endswith(late_files[key]) for s in rng.range.splits)
        if index > 0:
            assert any(s.endswith(late_files[f"run-{index - 1}"]) for s in rng.range.splits)
    last = run_pipeline(spark, env, "run-last")  # reads the last late file
    assert last["publish"].manifest is not None

    published = env.sink.read_pandas()
    # independent computation: the writer's own record of every row it wrote
    assert sorted(published["id"].tolist()) == sorted(written)
    assert (published["value"] == published["id"] * 10).all()
    cursor = read_cursor(env.engine, "incremental.read")  # type: ignore[arg-type]
    assert cursor is not None and len(cursor.consumed) == len(list(landing.glob("*.parquet")))
    # a run with nothing new reads nothing and publishes nothing
    run_pipeline(spark, env, "run-empty")
    assert ranges_of_pipeline(env.engine, "run-empty")[0].range.files == ()  # type: ignore[arg-type]
    assert len(env.sink.read_pandas()) == len(written)


def test_a_drained_run_advances_the_cursor_to_what_it_read(
    spark: SparkSession, env: IncrementalEnv
) -> None:
    landing = _landing(env)
    written: list[int] = []
    for n in range(3):
        written += write_rows(landing, f"d{n}.parquet", n * 10, 4)
    asked: list[int] = []

    def drain_after_first_batch(stage: str, point: str) -> None:
        if stage == "read" and point == "after-record-batch" and not asked:
            asked.append(Coordinator(env.engine, "drained").request_stop(StopMode.DRAIN).request_id)  # type: ignore[arg-type]

    eods = run_pipeline(spark, env, "drained", fault=drain_after_first_batch)
    assert eods["read"].drain and eods["read"].unread_splits == 2
    (rng,) = ranges_of_pipeline(env.engine, "drained")  # type: ignore[arg-type]
    assert rng.state is RangeState.COMMITTED and rng.read is not None and len(rng.read) == 1
    assert len(env.sink.read_pandas()) == 4
    # the next run continues from what the drained run actually read
    run_pipeline(spark, env, "after-drain")
    (nxt,) = ranges_of_pipeline(env.engine, "after-drain")  # type: ignore[arg-type]
    assert len(nxt.range.files) == 2 and not set(nxt.range.splits) & set(rng.read)
    assert sorted(env.sink.read_pandas()["id"].tolist()) == sorted(written)
