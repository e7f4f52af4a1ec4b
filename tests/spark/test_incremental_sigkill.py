"""SIGKILL of a process running a scheduled run of an incremental landing pipeline inside the
database transaction that closes the pipeline's last stage and advances the cursor (after the
sink's commit): the advance is rolled back with the close, the retry (a new process) reads the
same range, replays the commit as a no-op and advances; the sink holds every row once. (Kills
at the other points, as InjectedCrash in one process: test_incremental_landing.py; each child
starts its own Spark, so this test keeps to one kill.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_finalckpt.core.source_cursor import RangeState
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.store.cursors import ranges_of_pipeline, read_cursor
from airflow_finalckpt.store.engine import make_engine
from tests.spark.incremental_pipeline import write_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def attempt(root: Path, key: str, where: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tests.spark.incremental_kill_child", str(root), key, where],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_sigkill_inside_the_closing_transaction(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    written = write_rows(landing, "a.parquet", 0, 5) + write_rows(landing, "b.parquet", 50, 5)
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    killed = attempt(tmp_path, "run-0", "publish:in-close")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (open_range,) = ranges_of_pipeline(engine, "run-0")
    assert open_range.state is RangeState.OPEN  # the kill rolled the advance back
    assert read_cursor(engine, "incremental.read").version == 0  # type: ignore[union-attr]
    out = ParquetTableSink("out", str(tmp_path / "out"))
    assert sorted(out.read_pandas()["id"].tolist()) == sorted(written)  # committed before
    late = write_rows(landing, "late.parquet", 90, 2)  # lands before the retry
    retried = attempt(tmp_path, "run-0", "none")  # Airflow's retry, in a new process
    assert retried.returncode == 0 and "done" in retried.stdout, retried.stderr[-3000:]
    (rng,) = ranges_of_pipeline(engine, "run-0")
    assert rng.state is RangeState.COMMITTED and rng.range == open_range.range
    assert sorted(out.read_pandas()["id"].tolist()) == sorted(written)  # no row twice
    cursor = read_cursor(engine, "incremental.read")
    assert cursor is not None and cursor.version == 1
    assert {i.split("|")[0].rsplit("/", 1)[-1] for i in cursor.consumed} == {
        "a.parquet",
        "b.parquet",
    }
    assert late  # not read by run-0: the next run's
    engine.dispose()
