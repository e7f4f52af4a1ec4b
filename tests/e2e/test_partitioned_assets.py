"""Partitions on a REAL Airflow (api-server, scheduler, dag-processor, triggerer, LocalExecutor,
PostgreSQL; coordination store on PostgreSQL): a partition is committed, announced and
consumed exactly once (issue 41). DAGs: tests/e2e/partition_dags/partitioned_pipeline.py.

1. ``airflow backfill create`` of the daily ``CronPartitionTimetable`` producer over three
   partitions, three runs at a time; one run's stage task is SIGKILLed in its second batch
   and Airflow's retry resumes it. Every partition's rows then equal an independent
   computation from the input files, once; exactly one partitioned Asset event per partition;
   the ``PartitionedAssetTimetable`` consumer ran exactly once per partition and read exactly
   that partition's committed rows (so it ran after the commit).
   Meanwhile a ``PartitionedAtRuntime`` producer commits 24 hours of one day and 12 of the
   next, naming them with ``ctx.add_partitions``: one event per committed hour, and the
   rollup consumer (``StartOfDayMapper`` + ``DayWindow``) runs once, for the complete day.
2. One partition's input changes and its stage task is cleared: the stage recomputes (rule
   ``clear-recomputes``) and replaces the partition's rows; one new event for that partition;
   the consumer runs once more, for that partition only, and reads the new rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.sinks import ParquetTableSink, partition_slice

from .airflow_cluster import AirflowCluster

pytestmark = pytest.mark.postgres

DAGS = Path(__file__).resolve().parent / "partition_dags"
PRODUCER = "finalckpt_e2e_part_producer"
CONSUMER = "finalckpt_e2e_part_consumer"
HOURLY = "finalckpt_e2e_hourly_producer"
ROLLUP = "finalckpt_e2e_daily_rollup"
#: 24 hours of the first day (two files), 12 of the second (incomplete: no rollup for it).
HOURS = {
    "d1-am.json": [[f"2026-03-01T{h:02d}:00:00", h] for h in range(12)],
    "d1-pm.json": [[f"2026-03-01T{h:02d}:00:00", h] for h in range(12, 24)],
    "d2-am.json": [[f"2026-03-02T{h:02d}:00:00", h] for h in range(12)],
}
DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]
HELD = DAYS[1]
#: Hang guards on 2 busy cores, not timing assertions.
TIMEOUT_S = 600
#: Scheduler loops (heartbeat 2 s in the harness) that must pass without another consumer run.
QUIET_S = 10.0


def _wait(predicate: Callable[[], Any], what: str, cluster: AirflowCluster, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{cluster.log_tails(40)}"
        time.sleep(1.0)


def _write_input(work: Path, day: str, files: dict[str, list[list[Any]]]) -> None:
    folder = work / "input" / day
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for name, rows in files.items():
        (folder / name).write_text(json.dumps(rows))


def _expected(work: Path, day: str) -> list[list[Any]]:
    """The partition's rows computed from its input files, without the pipeline."""
    rows = []
    for path in sorted((work / "input" / day).glob("*.json")):
        rows.extend([str(item), int(amount)] for item, amount in json.loads(path.read_text()))
    return sorted(rows)


def _committed(work: Path) -> dict[str, list[list[Any]]]:
    frame = ParquetTableSink(
        "rows", str(work / "rows"), replace_slice=partition_slice("day")
    ).read_pandas()
    out: dict[str, list[list[Any]]] = {}
    for rec in frame.itertuples():
        out.setdefault(str(rec.day), []).append([str(rec.item), int(rec.amount)])
    return {day: sorted(rows) for day, rows in sorted(out.items())}


def _runs(cluster: AirflowCluster, dag_id: str) -> list[dict[str, Any]]:
    runs = cluster.api(
        "GET", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", params={"limit": 100}
    )["dag_runs"]
    return sorted(runs, key=lambda r: (r["run_after"], r["dag_run_id"]))


def _events(cluster: AirflowCluster, source: str = PRODUCER) -> list[dict[str, Any]]:
    return cluster.api(
        "GET",
        "/api/v2/assets/events",
        params={"source_dag_id": source, "limit": 100, "order_by": "timestamp"},
    )["asset_events"]


def _finished_consumers(
    cluster: AirflowCluster, count: int, dag_id: str = CONSUMER
) -> list[dict[str, Any]] | None:
    runs = _runs(cluster, dag_id)
    done = [r for r in runs if r["state"] in ("success", "failed")]
    return runs if len(runs) >= count and len(done) == len(runs) else None


def _consumed(work: Path, run: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((work / "consumed" / f"{run['dag_run_id']}.json").read_text()))


def _publish_try(cluster: AirflowCluster, run_id: str) -> int:
    return int(cluster.task_instance(PRODUCER, run_id, "publish")["try_number"])


def test_each_partition_is_committed_announced_and_consumed_once(
    airflow_cluster: Callable[..., AirflowCluster], pg_store_url: str, tmp_path: Path
) -> None:
    work = tmp_path
    for n, day in enumerate(DAYS):
        _write_input(work, day, {"a.json": [[f"a{n}", n]], "b.json": [[f"b{n}", 10 + n]]})
    (work / "hold").write_text(HELD)
    (work / "hourly").mkdir()
    for name, rows in HOURS.items():
        (work / "hourly" / name).write_text(json.dumps(rows))
    cluster = airflow_cluster(
        [DAGS],
        extra_env={
            "AIRFLOW__FINALCKPT__STORE_URL": pg_store_url,
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
            "FINALCKPT_E2E_WORK": str(work),
        },
        expect_dags=[PRODUCER, CONSUMER, HOURLY, ROLLUP],
    )
    cluster.unpause(CONSUMER)
    cluster.unpause(ROLLUP)
    cluster.unpause(HOURLY)
    cluster.unpause(PRODUCER)  # its range ended: only the backfill creates runs

    # 1. a backfill over three partitions, one of them killed mid-run and retried
    cluster.cli(
        "backfill",
        "create",
        "--dag-id",
        PRODUCER,
        "--from-date",
        f"{DAYS[0]}T00:00:00+00:00",
        "--to-date",
        f"{DAYS[-1]}T00:00:00+00:00",
        "--max-active-runs",
        "3",
    )
    hourly_run = cluster.trigger_dag(HOURLY)
    _wait(lambda: (work / "held").exists(), "the held partition's second batch", cluster, TIMEOUT_S)
    by_key = {r["partition_key"]: r for r in _runs(cluster, PRODUCER)}
    held_run = by_key[HELD]["dag_run_id"]
    killed = cluster.kill_task_process(PRODUCER, held_run, "publish", tree=True)
    (work / "hold").unlink()
    for run in by_key.values():
        state = cluster.wait_for_run(PRODUCER, run["dag_run_id"], timeout=TIMEOUT_S)
        assert state == "success", cluster.log_tails(60)
    assert sorted(by_key) == DAYS
    retry = _publish_try(cluster, held_run)
    assert retry > killed.try_number
    assert "1 of 2 splits already finished, 1 to process" in cluster.logs(
        PRODUCER, held_run, "publish", retry
    )
    expected = {day: _expected(work, day) for day in DAYS}
    assert _committed(work) == expected

    events = _events(cluster)
    assert sorted(e["partition_key"] for e in events) == DAYS  # one per partition, no more
    assert {e["source_run_id"] for e in events} == {r["dag_run_id"] for r in by_key.values()}

    consumers = _wait(
        lambda: _finished_consumers(cluster, 3), "3 consumer runs", cluster, TIMEOUT_S
    )
    time.sleep(QUIET_S)
    consumers = _runs(cluster, CONSUMER)
    assert [r["state"] for r in consumers] == ["success"] * 3, cluster.log_tails(60)
    assert sorted(r["partition_key"] for r in consumers) == DAYS
    for run in consumers:
        got = _consumed(work, run)
        assert got["partition_key"] == run["partition_key"]
        assert got["rows"] == expected[run["partition_key"]]
        assert [e["partition_key"] for e in got["events"]] == [run["partition_key"]]

    # the hourly partitions named at run time: one event per committed hour, one rollup run
    # for the complete day, none for the day with 12 hours
    state = cluster.wait_for_run(HOURLY, hourly_run, timeout=TIMEOUT_S)
    assert state == "success", cluster.log_tails(60)
    hours = sorted(hour for rows in HOURS.values() for hour, _ in rows)
    assert sorted(e["partition_key"] for e in _events(cluster, HOURLY)) == hours
    _wait(lambda: _finished_consumers(cluster, 1, ROLLUP), "the rollup run", cluster, TIMEOUT_S)
    time.sleep(QUIET_S)
    [rolled] = _runs(cluster, ROLLUP)
    assert (rolled["state"], rolled["partition_key"]) == ("success", "2026-03-01")
    got = json.loads((work / "rolled" / f"{rolled['dag_run_id']}.json").read_text())
    assert got["hours"] == [h for h in hours if h.startswith("2026-03-01")]

    # 2. a partition's input changes; a clear of its stage recomputes and replaces it
    changed = DAYS[0]
    _write_input(work, changed, {"a.json": [["new", 7]], "b.json": [["newer", 8], ["x", 9]]})
    cluster.clear_task(PRODUCER, by_key[changed]["dag_run_id"], "publish")
    _wait(
        lambda: _publish_try(cluster, by_key[changed]["dag_run_id"]) > 1,
        "the cleared try",
        cluster,
        TIMEOUT_S,
    )
    state = cluster.wait_for_run(PRODUCER, by_key[changed]["dag_run_id"], timeout=TIMEOUT_S)
    assert state == "success", cluster.log_tails(60)
    expected[changed] = _expected(work, changed)
    assert _committed(work) == expected
    events = _events(cluster)
    assert sorted(e["partition_key"] for e in events) == sorted([*DAYS, changed])
    assert events[-1]["partition_key"] == changed

    _wait(lambda: _finished_consumers(cluster, 4), "the 4th consumer run", cluster, TIMEOUT_S)
    time.sleep(QUIET_S)
    consumers = _runs(cluster, CONSUMER)
    assert [r["state"] for r in consumers] == ["success"] * 4, cluster.log_tails(60)
    assert sorted(r["partition_key"] for r in consumers) == sorted([*DAYS, changed])
    newest = max(consumers, key=lambda r: r["start_date"] or "")
    assert newest["partition_key"] == changed
    assert _consumed(work, newest)["rows"] == expected[changed]
