"""`finalckpt progress` and `finalckpt gc` on a real coordinator (SQLite / PostgreSQL)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from airflow_finalckpt.cli import progress as progress_cli
from airflow_finalckpt.cli.main import main
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

KEY = "cli-progress"
OLD = time.time() - 5 * 3600


@dataclass
class Env:
    url: str
    coord: Coordinator
    storage: CheckpointStorage
    runner: CliRunner

    def invoke(self, *args: str) -> tuple[int, str, str]:
        result = self.runner.invoke(main, [*args, "--store-url", self.url])
        return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def env(store_url: str, tmp_path: Path, isolated_settings_env: Path) -> Iterator[Env]:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    engine = make_engine(store_url)
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(
        StageGraph.from_edges(
            ["ingest", "enrich", "windows", "side"],
            [("ingest", "enrich"), ("enrich", "windows")],
        )
    )
    runner = CliRunner(env={"AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints")})
    yield Env(store_url, coord, storage, runner)
    engine.dispose()


def _advance(coord: Coordinator) -> int:
    """ingest CLOSED (3/3), enrich RUNNING (1/4), windows NOT_STARTED, side RUNNING (0/2);
    returns the latest completed checkpoint."""
    ingest = coord.start_attempt("ingest", total_splits=3).epoch
    coord.finish("ingest", ingest, StageSnapshot(finished_splits=frozenset({"d1", "d2", "d3"})))
    closable = coord.closable_checkpoint("ingest")
    assert closable is not None
    coord.close("ingest", ingest, closable)
    enrich = coord.start_attempt("enrich", total_splits=4).epoch
    side = coord.start_attempt("side", total_splits=2).epoch
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    coord.record_batch("enrich", enrich, finished_splits=["p1"])
    coord.record_batch("side", side)
    return cid


def _close_all(coord: Coordinator, stage_ids: list[str]) -> None:
    for sid in stage_ids:
        view = coord.stage(sid)
        epoch = coord.start_attempt(sid, total_splits=view.total_splits or 1).epoch
        coord.finish(sid, epoch, StageSnapshot(finished_splits=frozenset({"x"})))
        cid = coord.closable_checkpoint(sid)
        while cid is None:  # a checkpoint other running stages must answer first
            for other, v in coord.stages().items():
                if v.lifecycle is StageLifecycle.RUNNING:
                    coord.record_batch(other, v.epoch)
            cid = coord.closable_checkpoint(sid)
        coord.close(sid, epoch, cid)


# ---------------------------------------------------------------------------- progress


def test_progress_json_reports_every_stage(env: Env) -> None:
    cid = _advance(env.coord)
    code, out, _ = env.invoke("progress", "--pipeline", KEY, "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["pipeline_key"] == KEY and doc["done"] is False
    stages = {s["stage_id"]: s for s in doc["stages"]}
    assert [s["stage_id"] for s in doc["stages"]] == ["ingest", "enrich", "side", "windows"]
    assert stages["ingest"]["lifecycle"] == "CLOSED"
    assert (stages["ingest"]["finished_splits"], stages["ingest"]["total_splits"]) == (3, 3)
    assert stages["ingest"]["checkpoint"]["status"] == "CLOSED_ON"
    assert stages["enrich"]["lifecycle"] == "RUNNING"
    assert (stages["enrich"]["finished_splits"], stages["enrich"]["total_splits"]) == (1, 4)
    assert stages["enrich"]["percent"] == 25.0
    # the checkpoint's metadata records enrich's acknowledgement with one finished split
    assert stages["enrich"]["checkpoint"] == {"checkpoint_id": cid, "status": "PARTIALLY_FINISHED"}
    assert stages["side"]["checkpoint"] == {"checkpoint_id": cid, "status": "RUNNING"}
    assert stages["windows"]["lifecycle"] == "NOT_STARTED"
    assert stages["windows"]["total_splits"] is None
    assert stages["side"]["lifecycle"] == "RUNNING"
    assert doc["latest_checkpoint"]["checkpoint_id"] == cid
    assert doc["latest_completed"]["state"] == "COMPLETED"
    assert doc["stop"] is None


def test_progress_table_shows_bars_lifecycles_and_checkpoint(env: Env) -> None:
    cid = _advance(env.coord)
    code, out, _ = env.invoke("progress", "--pipeline", KEY)
    assert code == 0, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert f"latest checkpoint {cid}" in out
    assert "3/3" in lines["ingest"] and "CLOSED" in lines["ingest"]
    assert "closed on chk" in lines["ingest"]
    assert "1/4" in lines["enrich"] and "25%" in lines["enrich"] and "RUNNING" in lines["enrich"]
    assert f"chk {cid}: PARTIALLY_FINISHED" in lines["enrich"]
    assert "0/?" in lines["windows"] and "NOT_STARTED" in lines["windows"]


def test_progress_without_readable_metadata_falls_back_to_the_plan(env: Env) -> None:
    cid = _advance(env.coord)
    metadata = env.coord.checkpoint(cid).metadata_path
    assert metadata is not None
    Path(metadata).unlink()
    code, out, _ = env.invoke("progress", "--pipeline", KEY, "--json")
    assert code == 0, out
    stages = {s["stage_id"]: s for s in json.loads(out)["stages"]}
    assert stages["enrich"]["checkpoint"] == {"checkpoint_id": cid, "status": "RUNNING"}


def test_progress_unknown_pipeline_exits_2(env: Env) -> None:
    code, out, err = env.invoke("progress", "--pipeline", "no-such-pipeline")
    assert code == 2
    assert "no-such-pipeline" in err and "not registered" in err
    assert "Traceback" not in out + err


def test_progress_rejects_non_positive_interval(env: Env) -> None:
    code, _, err = env.invoke("progress", "--pipeline", KEY, "--watch", "--interval", "0")
    assert code == 2 and "interval" in err.lower()


def test_watch_refreshes_until_every_stage_is_closed(env: Env) -> None:
    _advance(env.coord)
    driver_errors: list[BaseException] = []

    def drive() -> None:
        try:
            time.sleep(0.3)
            _close_all(env.coord, ["enrich", "side", "windows"])
        except BaseException as exc:  # reported by the main thread
            driver_errors.append(exc)

    thread = threading.Thread(target=drive)
    thread.start()
    started = time.monotonic()
    code, out, _ = env.invoke("progress", "--pipeline", KEY, "--watch", "--interval", "0.05")
    thread.join(timeout=30)
    assert driver_errors == []
    assert code == 0, out
    assert time.monotonic() - started >= 0.3  # it did wait for the driver
    snapshots = out.count(f"pipeline {KEY}")
    assert snapshots >= 2  # the first state, then at least the final one
    final = out[out.rindex(f"pipeline {KEY}") :]
    for sid in ("ingest", "enrich", "windows", "side"):
        line = next(x for x in final.splitlines() if x.split() and x.split()[0] == sid)
        assert "CLOSED" in line, line
    assert "RUNNING" in out[: out.index(f"pipeline {KEY}", 1)]


def test_watch_json_prints_one_document_when_settled(env: Env) -> None:
    _advance(env.coord)
    # a stop with savepoint: running stages suspend, the watch ends on SUSPENDED
    stop = env.coord.request_stop(StopMode.SAVEPOINT)
    for sid in ("enrich", "side"):
        env.coord.record_batch(sid, env.coord.stage(sid).epoch)
    for sid in ("enrich", "side"):
        env.coord.suspend(sid, env.coord.stage(sid).epoch)
    code, out, _ = env.invoke(
        "progress", "--pipeline", KEY, "--watch", "--interval", "0.05", "--json"
    )
    # windows never started; the suspended run will not start it: the watch ends
    assert code == 0, out
    doc = json.loads(out)
    assert doc["stop"]["mode"] == "savepoint" and doc["stop"]["savepoint_id"] == stop.savepoint_id
    lifecycles = {s["stage_id"]: s["lifecycle"] for s in doc["stages"]}
    assert lifecycles == {
        "ingest": "CLOSED",
        "enrich": "SUSPENDED",
        "side": "SUSPENDED",
        "windows": "NOT_STARTED",
    }
    assert doc["done"] is True


def test_watch_ctrl_c_exits_130(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _advance(env.coord)

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(progress_cli.time, "sleep", interrupted)
    code, out, err = env.invoke("progress", "--pipeline", KEY, "--watch", "--interval", "5")
    assert code == 130
    assert "interrupted" in err and "RUNNING" in out  # the first snapshot was shown


# ---------------------------------------------------------------------------- gc


def _gc_layout(env: Env) -> tuple[Path, Path]:
    """ingest closed with one output part (enrich still needs it) and one stale state frame."""
    epoch = env.coord.start_attempt("ingest", total_splits=1).epoch
    root = Path(env.storage.pipeline_dir(KEY))
    part = root / "data/ingest/b1"
    part.mkdir(parents=True)
    (part / "part-0.parquet").write_bytes(b"p" * 64)
    handle = env.storage.write_state(
        KEY,
        "data/ingest/_parts/b1.json",
        b'{"parts": ["data/ingest/b1"]}',
        name="output:data/ingest/b1",
    )
    stale = root / "state/ingest/state_win/old"
    stale.mkdir(parents=True)
    (stale / "part-0.parquet").write_bytes(b"s" * 100)
    for path in (part, part / "part-0.parquet", stale, stale / "part-0.parquet"):
        os.utime(path, (OLD, OLD))
    env.coord.finish(
        "ingest",
        epoch,
        StageSnapshot(state=(handle,), end_of_data=EndOfData(manifest=["data/ingest/b1"])),
    )
    return part, stale


def test_gc_dry_run_then_real_run(env: Env) -> None:
    part, stale = _gc_layout(env)
    code, out, _ = env.invoke("gc", "--pipeline", KEY, "--dry-run", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["dry_run"] is True
    assert [d["path"] for d in doc["deleted"]] == ["state/ingest/state_win/old"]
    assert doc["bytes_freed"] == 100
    kept = {k["path"]: k for k in doc["kept"]}
    assert kept["data/ingest/b1"]["reason"] == "referenced"
    assert "needed by enrich" in kept["data/ingest/b1"]["detail"]
    assert stale.exists()

    code, out, _ = env.invoke("gc", "--pipeline", KEY)
    assert code == 0, out
    assert "deleted 1 entries" in out and "state/ingest/state_win/old" in out
    assert not stale.exists() and part.exists()


def test_gc_grace_keeps_young_files(env: Env) -> None:
    _part, stale = _gc_layout(env)
    os.utime(stale, None)  # touched just now
    code, out, _ = env.invoke("gc", "--pipeline", KEY, "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["deleted"] == []
    assert {k["path"]: k["reason"] for k in doc["kept"]}["state/ingest/state_win/old"] == "grace"
    code, out, _ = env.invoke("gc", "--pipeline", KEY, "--grace", "0", "--json")
    assert code == 0, out
    assert [d["path"] for d in json.loads(out)["deleted"]] == ["state/ingest/state_win/old"]


def test_gc_unknown_pipeline_and_bad_grace(env: Env) -> None:
    code, _, err = env.invoke("gc", "--pipeline", "no-such-pipeline")
    assert code == 2 and "no-such-pipeline" in err and "not registered" in err
    code, _, err = env.invoke("gc", "--pipeline", KEY, "--grace", "-5")
    assert code == 2 and "grace" in err.lower()


def test_gc_blocked_by_unreadable_checkpoint_exits_2(env: Env) -> None:
    _part, stale = _gc_layout(env)
    latest = env.coord.latest_completed()
    assert latest is not None and latest.metadata_path
    Path(latest.metadata_path).write_bytes(b"{not json")
    code, out, err = env.invoke("gc", "--pipeline", KEY, "--grace", "0")
    assert code == 2, out
    assert f"checkpoint {latest.checkpoint_id}" in err and "Traceback" not in err
    assert stale.exists()


def test_progress_shows_the_latest_auto_batch_and_throughput(env: Env) -> None:
    from airflow_finalckpt.core.batching import BatchSample, fit
    from airflow_finalckpt.storage.hints import StorageThroughputHints

    _advance(env.coord)
    model = fit([BatchSample(1, 1.0, 2.0), BatchSample(9, 9.0, 6.0)])
    assert model is not None
    StorageThroughputHints(env.storage, "dag-demo", KEY).save("enrich", model)
    code, out, _ = env.invoke("progress", "--pipeline", KEY, "--json")
    assert code == 0, out
    stages = {s["stage_id"]: s for s in json.loads(out)["stages"]}
    assert stages["enrich"]["batches"] == {
        "last_batch_splits": 9,
        "last_batch_s": 6.0,
        "recent_batch_splits": [1, 9],
        "splits_per_s": 2.0,
        "fixed_s_per_batch": 1.5,
        "summary": "last batch 9 splits in 6.0s, 2.00 splits/s + 1.50s per batch",
    }
    assert stages["ingest"]["batches"] is None  # nothing measured for it
    code, out, _ = env.invoke("progress", "--pipeline", KEY)
    assert code == 0 and "last batch 9 splits in 6.0s, 2.00 splits/s" in out
