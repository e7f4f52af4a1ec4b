"""Issue 42's reproduction through real ``dag.test()``: a daily DAG whose second stage counts
events per key on the driver (``collect()`` of its batch, then ``createDataFrame``) over three
input files of 1,000 events. With ``batch_size=1`` on both stages it committed 30 rows to
Parquet and 1,000 events of 3,000 to the ``key_columns`` SQL table, run state success; now the
stage is refused on its first try naming the rule ``driver-action-on-batch`` with nothing
committed, and with ``batch_size="auto"`` it commits the plain job's 10 rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa

from tests.spark.daily_pipeline import write_day_files

pytestmark = pytest.mark.slow

DAG_SOURCE = """
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink


def day_files(run):
    return sorted(p.name for p in Path(IN).glob("*.parquet"))


with DAG(
    DAG_ID,
    schedule="@daily",
    start_date=datetime(2024, 3, 1),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(0)},
) as dag:

    @finalckpt_stage(splits=day_files, batch_size=1)
    def read_day(ctx):
        return ctx.spark.read.parquet(*[f"{IN}/{s}" for s in ctx.splits])

    @finalckpt_stage(
        commit_mode="final",
        batch_size=BATCH_SIZE,
        sinks=[
            ParquetTableSink("counts_parquet", f"{OUT}/counts"),
            SqlTableSink("counts_sql", SQL_URL, "counts", key_columns=["event_date", "key"]),
        ],
    )
    def count_per_key(ctx):
        counts = {}
        for row in ctx.read_parts().select("event_date", "key").collect():
            counts[(row.event_date, row.key)] = counts.get((row.event_date, row.key), 0) + 1
        rows = [(day, key, n) for (day, key), n in sorted(counts.items())]
        return ctx.spark.createDataFrame(rows, "event_date string, key string, n long")

    read_day() >> count_per_key()
"""


def _dag(write_dag: Callable[..., Any], tmp_path: Path, batch_size: int | str) -> Any:
    write_day_files(tmp_path / "in", "2024-03-01")
    (tmp_path / "out").mkdir()
    return write_dag(
        DAG_SOURCE,
        DAG_ID=f"driver_side_{uuid.uuid4().hex[:8]}",
        IN=str(tmp_path / "in"),
        OUT=str(tmp_path / "out"),
        SQL_URL=f"sqlite:///{tmp_path}/out/sinks.db",
        BATCH_SIZE=batch_size,
    )


def _committed(tmp_path: Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The Parquet table's and the SQL table's rows (None: nothing committed)."""
    parquet_dir = tmp_path / "out" / "counts"
    parquet = pd.read_parquet(parquet_dir) if any(parquet_dir.glob("**/*.parquet")) else None
    engine = sa.create_engine(f"sqlite:///{tmp_path}/out/sinks.db")
    try:
        tables = sa.inspect(engine).get_table_names()
        sql = pd.read_sql("SELECT * FROM counts", engine) if "counts" in tables else None
    finally:
        engine.dispose()
    return parquet, sql


def _state(dag_run: Any, task_id: str) -> tuple[str, int]:
    ti = next(t for t in dag_run.get_task_instances() if t.task_id == task_id)
    return str(ti.state).rsplit(".", 1)[-1].lower(), int(ti.try_number)


def test_batch_size_1_is_refused_naming_the_rule_and_commits_nothing(
    local_store: Path,
    write_dag: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_finalckpt.runtime import plan_gate

    # the refusal the task raised, read where it is built: dag.test() prints the task's log to
    # stdout or, once an earlier test in the process configured Airflow's logging, to a stream
    # no capture fixture of this test sees
    refusals: list[str] = []
    real_refusal = plan_gate.refuse_fixed_batches

    def recorded(*args: Any) -> str:
        refusals.append(real_refusal(*args))
        return refusals[-1]

    monkeypatch.setattr(plan_gate, "refuse_fixed_batches", recorded)
    dag = _dag(write_dag, tmp_path, 1)
    dag_run = dag.test()
    assert str(dag_run.state).endswith("failed")
    assert _state(dag_run, "read_day") == ("success", 1)
    assert _state(dag_run, "count_per_key") == ("failed", 1)  # permanent: no retry
    assert all(frame is None or frame.empty for frame in _committed(tmp_path))
    assert len(refusals) == 1, refusals
    assert "is refused" in refusals[0] and "driver-action-on-batch" in refusals[0], refusals[0]
    assert "collect()" in refusals[0], refusals[0]


def test_batch_size_auto_commits_the_plain_jobs_ten_rows(
    local_store: Path, write_dag: Callable[..., Any], tmp_path: Path
) -> None:
    dag = _dag(write_dag, tmp_path, "auto")
    dag_run = dag.test()
    assert str(dag_run.state).endswith("success")
    parquet, sql = _committed(tmp_path)
    for frame in (parquet, sql):
        assert frame is not None
        assert (len(frame), int(frame["n"].sum())) == (10, 3000)
        assert set(frame["n"]) == {300}
