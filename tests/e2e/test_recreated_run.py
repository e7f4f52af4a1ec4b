"""A DAG run deleted and created again is a new pipeline run (issue 38), on a REAL Airflow
(api-server, scheduler, dag-processor, triggerer, LocalExecutor, PostgreSQL), on the stop
tests' cluster, with ``tests/e2e/stop_dags/recreated_daily.py`` (two stages, a broadcast
category -> group dimension, a Parquet and a PostgreSQL sink each owning the run's day):

- a backfill of two days (run ids ``backfill__<end of the interval>``);
- both runs deleted through the REST API, a late file added to one day and the dimension
  corrected, the days backfilled again: Airflow gives the new runs the same run ids, yet both
  recompute (before issue 38 every stage re-published the deleted run's output, or failed with
  ``SplitListChangedError``) and both sinks equal pandas, with one Asset event per new commit;
- a clear of a re-created run after its input changed again still recomputes in place (its
  pipeline stays; rule clear-recomputes), with one more Asset event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import pytest
import sqlalchemy as sa

from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.repository import pipeline_of_dag_run

from .airflow_cluster import AirflowCluster
from .ui_cluster import _environment as ui_environment
from .ui_cluster import store_url, ui_cluster, wait_for

DAG = "finalckpt_e2e_recreated"
DAYS = [dt.date(2013, 1, 1), dt.date(2013, 1, 2)]
LATE, CORRECTED = DAYS  # day 1 gets a late file; day 2 is recomputed for the dimension
#: Hang guard for a backfill of two days on 2 busy cores, not a timing assertion.
BACKFILL_TIMEOUT_S = 900
FIRST_DIMENSION = {"a": "g1", "b": "g1", "c": "g2"}
CORRECTED_DIMENSION = {"a": "g1", "b": "g3", "c": "g2"}


@pytest.fixture
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    c = ui_cluster(airflow_cluster)
    c.wait_for_dags([DAG])
    return c


def _input() -> Path:
    return ui_environment()[1] / "recreated" / "input"


def _write_file(day: dt.date, name: str, seed: int) -> None:
    folder = _input() / f"day={day.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"event_date": day.isoformat(), "category": "abc"[(seed + n) % 3], "amount": seed * n}
        for n in range(1, 9)
    ]
    pd.DataFrame(rows).to_parquet(folder / name, index=False)


def _write_dimension(mapping: dict[str, str]) -> None:
    frame = pd.DataFrame({"category": list(mapping), "group": list(mapping.values())})
    frame.to_parquet(_input() / "groups.parquet", index=False)


Row = tuple[str, str, int, int]


def _expected(day: dt.date, mapping: dict[str, str]) -> set[Row]:
    """The day's files joined with ``mapping`` and summed per group, in pandas."""
    files = sorted((_input() / f"day={day.isoformat()}").glob("*.parquet"))
    events = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    events["group"] = events["category"].map(mapping)
    sums = events.groupby(["event_date", "group"]).agg(
        events=("amount", "size"), amount=("amount", "sum")
    )
    return {(str(d), str(g), int(r.events), int(r.amount)) for (d, g), r in sums.iterrows()}


def _rows(frame: pd.DataFrame) -> set[Row]:
    rows = frame[["event_date", "group", "events", "amount"]].itertuples(index=False)
    found = [(str(r[0])[:10], str(r[1]), int(r[2]), int(r[3])) for r in rows]
    assert len(found) == len(set(found)), "a row is there twice"
    return set(found)


def _check_sinks(expected: set[Row]) -> None:
    parquet = pd.read_parquet(_input().parent / "output" / "groups", partitioning=None)
    engine = sa.create_engine(store_url())
    try:
        postgres = pd.read_sql("SELECT * FROM recreated_groups", engine)
    finally:
        engine.dispose()
    assert _rows(parquet) == expected, "parquet"
    assert _rows(postgres) == expected, "postgres"


def _runs(cluster: AirflowCluster) -> dict[dt.date, dict[str, Any]]:
    path = f"/api/v2/dags/{quote(DAG, safe='')}/dagRuns"
    runs = cluster.api("GET", path, params={"limit": 100})["dag_runs"]
    return {dt.date.fromisoformat(run["logical_date"][:10]): run for run in runs}


def _backfill(cluster: AirflowCluster) -> dict[dt.date, dict[str, Any]]:
    """A backfill of DAYS (only the days without a run); once complete, the runs, all of
    which must have succeeded.
    """
    before = cluster.api("GET", "/api/v2/backfills", params={"dag_id": DAG})["backfills"]
    cluster.api(
        "POST",
        "/api/v2/backfills",
        json={
            "dag_id": DAG,
            "from_date": f"{DAYS[0].isoformat()}T00:00:00Z",
            "to_date": f"{DAYS[-1].isoformat()}T00:00:00Z",
            "max_active_runs": 2,
            "reprocess_behavior": "none",
        },
    )

    def complete() -> bool:
        backfills = cluster.api("GET", "/api/v2/backfills", params={"dag_id": DAG})["backfills"]
        return len(backfills) > len(before) and all(b["completed_at"] for b in backfills)

    wait_for(complete, "the backfill to complete", timeout=BACKFILL_TIMEOUT_S, every=2.0)
    return _succeeded(cluster)


def _succeeded(cluster: AirflowCluster) -> dict[dt.date, dict[str, Any]]:
    runs = _runs(cluster)
    assert {day: run["state"] for day, run in runs.items()} == dict.fromkeys(DAYS, "success")
    return runs


def _asset_events(cluster: AirflowCluster) -> list[tuple[str, str]]:
    """(source run id, pipeline) of the DAG's Asset events, oldest first."""
    events = cluster.api(
        "GET",
        "/api/v2/assets/events",
        params={"source_dag_id": DAG, "limit": 100, "order_by": "timestamp"},
    )["asset_events"]
    return [(e["source_run_id"], (e.get("extra") or {}).get("pipeline_key")) for e in events]


def _log(cluster: AirflowCluster, run_id: str, task_id: str) -> str:
    number = int(cluster.task_instance(DAG, run_id, task_id)["try_number"])
    return cluster.logs(DAG, run_id, task_id, number)


def test_a_deleted_and_recreated_run_recomputes_and_a_clear_still_recomputes_in_place(
    cluster: AirflowCluster,
) -> None:
    for day in DAYS:
        _write_file(day, "part-0.parquet", seed=day.day)
        _write_file(day, "part-1.parquet", seed=day.day + 10)
    _write_dimension(FIRST_DIMENSION)
    cluster.unpause(DAG)  # the DAG's own schedule ended in 2014: only the backfills run
    first = _backfill(cluster)
    ids = {day: run["dag_run_id"] for day, run in first.items()}
    for day in DAYS:  # Airflow 3.3: backfill__<run_after>, the end of the data interval
        assert ids[day] == f"backfill__{day + dt.timedelta(days=1)}T00:00:00+00:00"
    _check_sinks(set().union(*(_expected(day, FIRST_DIMENSION) for day in DAYS)))
    # a manual run of a logical date that has a run is refused by Airflow (docs/scheduling.md)
    manual = {"logical_date": f"{DAYS[0].isoformat()}T00:00:00Z", "conf": {}}
    cluster.api("POST", f"/api/v2/dags/{DAG}/dagRuns", json=manual, expect=(409,))
    engine = make_engine(store_url())
    old_keys = {day: pipeline_of_dag_run(engine, DAG, ids[day]) for day in DAYS}
    assert len(_asset_events(cluster)) == len(DAYS)

    # a user deletes both runs, a late file arrives, the dimension is corrected, backfill again
    for day in DAYS:
        path = f"/api/v2/dags/{quote(DAG, safe='')}/dagRuns/{quote(ids[day], safe='')}"
        cluster.api("DELETE", path, expect=(204,))
    _write_file(LATE, "part-2.parquet", seed=LATE.day + 20)
    _write_dimension(CORRECTED_DIMENSION)
    again = _backfill(cluster)
    assert {day: run["dag_run_id"] for day, run in again.items()} == ids  # the same run ids
    _check_sinks(set().union(*(_expected(day, CORRECTED_DIMENSION) for day in DAYS)))
    new_keys = {day: pipeline_of_dag_run(engine, DAG, ids[day]) for day in DAYS}
    assert all(new_keys[day] != old_keys[day] for day in DAYS), (old_keys, new_keys)
    for day in DAYS:  # the run's first stage task moves it to a new pipeline; none re-publishes
        assert "was deleted and created again" in _log(cluster, ids[day], "read_day")
        for task_id in ("read_day", "by_group"):
            assert "no Spark job submitted" not in _log(cluster, ids[day], task_id), task_id
    events = _asset_events(cluster)
    assert len(events) == 2 * len(DAYS)  # one per new commit, none for a re-publication
    assert {key for _, key in events[len(DAYS) :]} == set(new_keys.values())

    # a clear of a re-created run (its input changed again) recomputes in the same pipeline
    _write_file(CORRECTED, "part-2.parquet", seed=CORRECTED.day + 30)
    cluster.clear_task(DAG, ids[CORRECTED], ["read_day", "by_group"])
    cluster.wait_for_run(DAG, ids[CORRECTED], timeout=BACKFILL_TIMEOUT_S)
    _succeeded(cluster)
    _check_sinks(set().union(*(_expected(day, CORRECTED_DIMENSION) for day in DAYS)))
    assert pipeline_of_dag_run(engine, DAG, ids[CORRECTED]) == new_keys[CORRECTED]
    log = _log(cluster, ids[CORRECTED], "by_group")
    assert "was cleared after it succeeded" in log and "recomputing it from scratch" in log
    assert "was deleted and created again" not in log
    events = _asset_events(cluster)
    assert len(events) == 2 * len(DAYS) + 1
    assert events[-1] == (ids[CORRECTED], new_keys[CORRECTED])
    engine.dispose()
