"""A DAG as a new user writes it from the README: ``@daily``, several input files per day read
one per batch, then one stage with ordinary PySpark (dropDuplicates, a join against a
``broadcast_table`` dimension, a groupBy and a rank window) published to Parquet and
PostgreSQL with the day as ``replace_slice``, through real ``dag.test(logical_date=...)``.

What it adds to ``test_daily_example.py`` (read -> publish, no grouping): a transform that is
not split-local downstream of a batched stage, a transform failing mid-stage on its first try
and the retry resuming it, a rerun of a day with a changed input in a new DAG run, and a
``DATE`` slice column in PostgreSQL (its commit failed: ``date = character varying``). After
every run each sink equals pandas over the raw files, whatever the history.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

DAG_SOURCE = """
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from pyspark.sql import Window
from pyspark.sql import functions as F

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

DAY = {"event_date": "{{ data_interval_start | ds }}"}


def day_files(run):
    folder = Path(IN) / f"day={run.ds}"
    return sorted(p.name for p in folder.glob("*.parquet")) if folder.is_dir() else []


with DAG(
    DAG_ID,
    schedule="@daily",
    start_date=datetime(2024, 1, 1),
    catchup=False,
    default_args={
        "retries": 1,
        "retry_delay": timedelta(seconds=1),
        "spark_conf": {"spark.sql.shuffle.partitions": "2"},
    },
) as dag:

    @finalckpt_stage(splits=day_files, batch_size=1)
    def read_day(ctx):
        crash = Path(CRASH)
        if crash.exists() and crash.read_text() in ctx.splits:  # fails once, mid-stage
            crash.unlink()
            raise RuntimeError("injected failure on the first try")
        frame = ctx.spark.read.parquet(*[f"{IN}/day={ctx.ds}/{s}" for s in ctx.splits])
        frame = frame.where(F.col("event_date") == ctx.ds)  # a file holds late rows too
        return frame.withColumn("event_date", F.to_date("event_date"))

    @finalckpt_stage(
        commit_mode="final",
        sinks=[
            ParquetTableSink("top_parquet", f"{OUT}/top_users", replace_slice=DAY),
            SqlTableSink("top_pg", PG_URL, "top_users", replace_slice=DAY),
        ],
    )
    def top_users(ctx):
        products = ctx.broadcast_table("products", lambda: ctx.spark.read.parquet(DIM))
        events = ctx.read_parts().dropDuplicates(["event_id"])
        events = events.join(products, "product_id", "left")
        per_user = events.groupBy("event_date", "category", "user_id").agg(
            F.count("*").alias("events"), F.sum("amount").alias("amount")
        )
        by_amount = Window.partitionBy("event_date", "category").orderBy(F.desc("amount"))
        return per_user.withColumn("rnk", F.rank().over(by_amount)).where("rnk <= 2")

    read_day() >> top_users()
"""

COLUMNS = ["event_date", "category", "user_id", "events", "amount", "rnk"]


def write_day(root: Path, day: str, version: int, files: int) -> None:
    """``files`` event files for ``day``: duplicates within and across files, a late row of
    the previous day in each, a product missing from the dimension."""
    rnd = random.Random(f"{day}-{version}")
    folder = root / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    previous: list[dict[str, Any]] = []
    for f in range(files):
        rows = [
            {
                "event_id": f"{day}-{f}-{n}",
                "user_id": f"u{rnd.randint(1, 5)}",
                "product_id": f"p{rnd.randint(1, 5)}",
                "amount": rnd.randint(1, 500),
                "event_date": day,
            }
            for n in range(12)
        ]
        late = {**rows[0], "event_id": f"late-{day}-{f}", "event_date": "2023-12-31"}
        frame = pd.DataFrame([*rows, *rnd.sample(rows, 2), *previous[:2], late])
        frame.to_parquet(folder / f"part-{f}.parquet", index=False)
        previous = rows


def expected(root: Path, days: list[str]) -> pd.DataFrame:
    """The plain job over the raw files, in pandas."""
    frames = [pd.read_parquet(f) for d in days for f in sorted((root / f"day={d}").glob("*"))]
    raw = pd.concat(frames, ignore_index=True)
    raw = raw[raw.event_date.isin(days)].drop_duplicates("event_id")
    events = raw.merge(pd.read_parquet(root / "products.parquet"), on="product_id", how="left")
    keys = ["event_date", "category", "user_id"]
    per_user = events.groupby(keys, dropna=False).agg(
        events=("event_id", "size"), amount=("amount", "sum")
    )
    per_user = per_user.reset_index()
    ranks = per_user.groupby(["event_date", "category"], dropna=False)["amount"]
    per_user["rnk"] = ranks.rank(method="min", ascending=False).astype(int)
    return per_user[per_user.rnk <= 2]


def rows(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    return sorted(tuple("" if pd.isna(v) else str(v) for v in r) for r in frame[COLUMNS].values)


@pytest.fixture
def user_dag(write_dag: Any, local_store: Path, tmp_path: Path, pg_url: str) -> dict[str, Any]:
    root, out = tmp_path / "in", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    pd.DataFrame(
        {"product_id": ["p1", "p2", "p3", "p4"], "category": ["toys", "toys", "books", "food"]}
    ).to_parquet(root / "products.parquet", index=False)
    dag = write_dag(
        DAG_SOURCE,
        DAG_ID=f"user_daily_{uuid.uuid4().hex[:8]}",
        IN=str(root),
        OUT=str(out),
        DIM=str(root / "products.parquet"),
        PG_URL=pg_url,
        CRASH=str(tmp_path / "crash_at"),
    )
    return {"dag": dag, "in": root, "out": out, "pg": pg_url, "crash": tmp_path / "crash_at"}


def sinks(work: dict[str, Any]) -> dict[str, pd.DataFrame]:
    engine = sa.create_engine(work["pg"])
    try:
        pg = pd.read_sql("SELECT * FROM top_users", engine)
    finally:
        engine.dispose()
    # a sliced Parquet table: event_date=<day>/ directories (docs/sinks.md's readers)
    parquet = pd.read_parquet(work["out"] / "top_users", partitioning=None)
    return {"parquet": parquet, "postgres": pg}


def run(dag: Any, day: str) -> Any:
    logical = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    dag_run = dag.test(logical_date=logical)
    assert str(dag_run.state).rsplit(".", 1)[-1].lower() == "success", dag_run.run_id
    return dag_run


def check(work: dict[str, Any], days: list[str]) -> None:
    want = rows(expected(work["in"], days))
    assert len({r[0] for r in want}) == len(days)
    for name, frame in sinks(work).items():
        assert rows(frame) == want, name


def test_a_users_daily_dag_equals_pandas_after_a_failure_a_rerun_and_a_changed_input(
    user_dag: dict[str, Any],
) -> None:
    dag, root = user_dag["dag"], user_dag["in"]
    one, two = "2024-01-01", "2024-01-02"
    write_day(root, one, version=1, files=3)
    write_day(root, two, version=1, files=3)

    user_dag["crash"].write_text("part-1.parquet")  # read_day's 2nd batch fails on try 1
    first = run(dag, one)
    tries = {ti.task_id: ti.try_number for ti in first.get_task_instances()}
    assert tries == {"read_day": 2, "top_users": 1}
    assert not user_dag["crash"].exists()
    check(user_dag, [one])

    run(dag, two)
    check(user_dag, [one, two])

    write_day(root, one, version=2, files=2)  # day one's input changed: a new DAG run
    run(dag, one)
    check(user_dag, [one, two])
