"""Retention on a real store (SQLite / PostgreSQL) and real checkpoint storage: 50 daily
pipelines driven through the coordinator (tiny files, no Spark), closed one day apart; `finalckpt
gc` without keys keeps the last `retention_days` of them and removes the rest (files and every
store row), keeps savepoints unless asked, and removes pipelines whose DAG runs were deleted.
`finalckpt pipelines list | show | delete` print one JSON document each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import MetaData, func, select

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.control.retention import apply_retention
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import CheckpointKind, EndOfData, StageSnapshot, StopMode
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

DAG = "daily"
DAY = 86_400.0
DAYS = 50


@dataclass
class Env:
    url: str
    root: Path
    storage: CheckpointStorage
    runner: CliRunner

    def invoke(self, *args: str) -> tuple[int, str, str]:
        result = self.runner.invoke(main, [*args, "--store-url", self.url])
        return result.exit_code, result.stdout, result.stderr

    def rows(self) -> int:
        engine = make_engine(self.url)
        try:
            meta = MetaData()
            meta.reflect(engine)
            with engine.connect() as conn:
                return sum(
                    int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                    for name, t in meta.tables.items()
                    if name.startswith("finalckpt_")
                )
        finally:
            engine.dispose()

    def files(self) -> int:
        return sum(1 for p in self.root.rglob("*") if p.is_file())


@pytest.fixture
def env(store_url: str, tmp_path: Path, isolated_settings_env: Path) -> Iterator[Env]:
    root = tmp_path / "checkpoints"
    runner = CliRunner(env={"AIRFLOW__FINALCKPT__STORAGE_URI": str(root)})
    yield Env(store_url, root, CheckpointStorage(str(root)), runner)


def daily_pipeline(env: Env, day: int, closed_at: float, *, close: bool = True) -> str:
    """One day's pipeline: read_day -> aggregate, with state and output files, closed at
    ``closed_at`` (the coordinator's clock) unless ``close`` is False.
    """
    run_id = f"scheduled__2013-02-{day:02d}"
    key = f"{DAG}.{run_id}"
    engine = make_engine(env.url)
    coord = Coordinator(engine, key, writer=env.storage, clock=lambda: closed_at)
    coord.register(StageGraph.from_edges(["read_day", "aggregate"], [("read_day", "aggregate")]))
    coord.link_dag_run(DAG, run_id)
    for stage in ("read_day", "aggregate") if close else ("read_day",):
        epoch = coord.start_attempt(stage, total_splits=1).epoch
        part = f"data/{stage}/b{day}"
        env.storage.write_state(key, f"{part}/part-0.parquet", b"x" * 64)
        handle = env.storage.write_state(
            key, f"state/{stage}/win/{day}.json", b"{}", name="state:win"
        )
        coord.record_batch(stage, epoch, finished_splits=["s"], state=[handle])
        if not close:
            break
        outcome = coord.finish(stage, epoch, StageSnapshot(end_of_data=EndOfData(manifest=[part])))
        latest = coord.latest_completed()
        assert latest is not None and latest.checkpoint_id >= outcome.threshold
        coord.close(stage, epoch, latest.checkpoint_id)
    engine.dispose()
    return key


def test_fifty_daily_pipelines_are_bounded_by_retention(env: Env) -> None:
    now = time.time()
    keys = [daily_pipeline(env, d, now - (DAYS - d) * DAY - 60) for d in range(1, DAYS + 1)]
    rows_before, files_before = env.rows(), env.files()
    assert len(list(env.root.iterdir())) == DAYS

    code, out, err = env.invoke("gc", "--grace", "0", "--json")

    assert code == 0, err
    doc = json.loads(out)
    removed = {r["pipeline_key"] for r in doc["retention"]["removed"]}
    kept = [p["pipeline_key"] for p in doc["pipelines"]]
    # closed 1..7 days ago (plus the grace minute) are kept, older ones removed
    assert kept == keys[-7:]
    assert removed == set(keys[:-7])
    assert all(r["files"] > 0 and r["store_rows"] > 0 for r in doc["retention"]["removed"])
    assert sorted(p.name for p in env.root.iterdir()) == sorted(keys[-7:])
    rows_after, files_after = env.rows(), env.files()
    assert rows_after <= rows_before * 8 // DAYS + 1  # rows of 7 pipelines (of 50) are left
    assert files_after <= files_before * 8 // DAYS
    code, out, _ = env.invoke("pipelines", "list", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [p["pipeline_key"] for p in listed["pipelines"]] == keys[-7:]
    assert all(p["closed"] and p["expires_at"] > now for p in listed["pipelines"])

    # a second pass changes nothing: the bound holds run after run
    code, out, _ = env.invoke("gc", "--grace", "0", "--json")
    assert code == 0 and json.loads(out)["retention"]["removed"] == []
    assert env.rows() == rows_after


def test_dry_run_on_a_closed_pipeline_reports_what_expiry_deletes(env: Env) -> None:
    key = daily_pipeline(env, 1, time.time() - 60)
    rows, files = env.rows(), env.files()

    code, out, err = env.invoke("gc", "--pipeline", key, "--dry-run", "--json")

    assert code == 0, err
    doc = json.loads(out)
    on_expiry = doc["retention"]["on_expiry"]
    assert doc["retention"]["closed"] is True
    assert {"data", "state"} <= set(on_expiry["paths"])
    assert any(p.startswith("chk-") for p in on_expiry["paths"])
    assert on_expiry["files"] >= 6 and on_expiry["store_rows"] > 5
    assert (env.rows(), env.files()) == (rows, files)
    code, out, err = env.invoke(
        "gc", "--pipeline", key, "--retention-days", "0", "--dry-run", "--json"
    )
    assert code == 0, err
    removal = json.loads(out)["retention"]["removed"][0]
    assert removal["pipeline_key"] == key and removal["reason"] == "expired"
    assert (env.rows(), env.files()) == (rows, files)


def test_open_pipelines_stay_unless_their_dag_runs_were_deleted(env: Env) -> None:
    old = time.time() - 30 * DAY
    running = daily_pipeline(env, 1, old, close=False)
    orphan = daily_pipeline(env, 2, old, close=False)
    engine = make_engine(env.url)
    try:
        deleted = {(DAG, "scheduled__2013-02-02")}
        report = apply_retention(
            engine,
            env.storage,
            retention_days=7,
            run_exists=lambda dag, run: (dag, run) not in deleted,
        )
    finally:
        engine.dispose()
    assert [(r.pipeline_key, r.reason) for r in report.removed] == [(orphan, "dag_run_deleted")]
    assert [k["pipeline_key"] for k in report.kept] == [running]
    assert (env.root / running).exists() and not (env.root / orphan).exists()


def test_savepoints_survive_retention_unless_asked(env: Env) -> None:
    key = daily_pipeline(env, 1, time.time() - 30 * DAY, close=False)
    engine = make_engine(env.url)
    coord = Coordinator(engine, key, writer=env.storage)
    coord.request_stop(StopMode.SAVEPOINT, requested_by="test")
    view = coord.stage("read_day")
    coord.record_batch("read_day", view.epoch)
    coord.suspend("read_day", view.epoch)
    (savepoint,) = [c for c in coord.checkpoints() if c.kind is CheckpointKind.SAVEPOINT]
    engine.dispose()

    code, out, err = env.invoke("pipelines", "delete", key, "--json")
    assert code == 2 and out == "" and "is open" in err and err.count("\n") == 1
    code, out, err = env.invoke("pipelines", "delete", key, "--force", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kept_savepoints"] == [f"chk-{savepoint.checkpoint_id}"]
    assert sorted(p.name for p in (env.root / key).iterdir()) == [f"chk-{savepoint.checkpoint_id}"]
    assert (env.root / key / f"chk-{savepoint.checkpoint_id}" / "_metadata").exists()
    code, _, err = env.invoke("pipelines", "show", key, "--json")
    assert code == 2 and "not registered" in err and err.count("\n") == 1


def test_pipelines_show_and_unknown_keys(env: Env) -> None:
    key = daily_pipeline(env, 3, time.time() - 60)
    code, out, err = env.invoke("pipelines", "show", key, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pipeline_key"] == key and doc["closed"] is True
    assert doc["dag_runs"] == [[DAG, "scheduled__2013-02-03"]]
    assert [s["stage_id"] for s in doc["detail"]["stages"]] == ["read_day", "aggregate"]
    code, out, err = env.invoke("gc", "--pipeline", "nope", "--json")
    assert code == 2 and out == "" and "'nope' is not registered" in err
    code, out, err = env.invoke("pipelines", "delete", "nope")
    assert code == 2 and "'nope' is not registered" in err
