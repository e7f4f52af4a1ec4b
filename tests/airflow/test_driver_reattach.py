"""A retry reattaches to a real stage driver whose heartbeat has no epoch yet (issue 31).

The driver is the real one (``spark.driver.run_job``), run by a spark-submit stand-in in this
process on the shared local SparkSession. The test holds it twice: while it loads the stage's
code (it heartbeats, has not taken the stage: its heartbeat has no epoch) and in its first batch
(it took the stage, has reported no progress). Try 1 submits and ends while the driver runs on;
try 2 finds the driver RUNNING on a heartbeat without an epoch and reattaches; the driver then
takes the stage, and its heartbeat carries that epoch before its first progress report (before
the fix it came with the first progress: a heartbeat read there had ``"epoch": null``).
"""

from __future__ import annotations

import dataclasses
import glob
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark.job import (
    STORAGE_OPTIONS_ENV,
    STORAGE_URI_ENV,
    STORE_URL_ENV,
    DriverOutcome,
    Files,
    driver_script,
)
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget
from airflow_finalckpt.spark.launch.resumable import ResumableSubmission
from airflow_finalckpt.spark.launch.submit import SubmitLauncher
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY, STAGE = "held-driver", "enrich"


def _wait_for(predicate: Callable[[], Any], what: str, timeout: float = 300.0) -> Any:
    """Poll until ``predicate`` holds (the timeout only turns a hang into a failure)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waiting for {what}")
        time.sleep(0.02)
    return value


def _hold(marker: str, gate: str) -> str:
    """Mark that the driver got here (with the time), then wait until the test opens the gate."""
    Path(marker).write_text(repr(time.time()))
    _wait_for(Path(gate).exists, f"the test to open {gate}")
    return marker


class HeldWhileLoading:
    """Unpickling it (the driver loading the stage's code) holds the driver at a gate."""

    def __init__(self, marker: Path, gate: Path) -> None:
        self.args = (str(marker), str(gate))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_hold, self.args)


class _StateStore:
    """What ``context["task_state_store"]`` offers (get/set), in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_kw: Any) -> None:
        self.values[key] = value


class InProcessDriver:
    """A SparkSubmitHook stand-in: runs the real driver on the submitted spec, in this process."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def submit(self, application: str) -> None:
        assert application == driver_script()
        args = self.kwargs["application_args"]  # --job <spec> --secrets <file>
        if driver.run_job(args[1], args[args.index("--secrets") + 1]) != 0:
            raise RuntimeError("the driver wrote an error")

    def on_kill(self) -> None:
        pass


def test_a_retry_reattaches_to_a_driver_before_its_epoch_and_its_heartbeat_then_carries_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = Coordinator(engine, KEY, writer=storage)
    coordinator.register(StageGraph.from_edges([STAGE], []))
    monkeypatch.setenv(STORE_URL_ENV, url)
    monkeypatch.setenv(STORAGE_URI_ENV, storage.root_uri)
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    loading, loaded = tmp_path / "loading", tmp_path / "loaded"
    in_batch, go_on = tmp_path / "in-batch", tmp_path / "go-on"
    held_while_loading = HeldWhileLoading(loading, loaded)

    def transform(ctx: Any) -> Any:
        assert held_while_loading  # shipped with the code: unpickling it held the driver
        _hold(str(in_batch), str(go_on))
        return ctx.spark.range(0, 4).selectExpr("id", f"'{ctx.splits[0]}' AS split")

    def launcher() -> SubmitLauncher:
        return SubmitLauncher(
            SparkTarget(ExecutionMode.SUBMIT, "spark://m:7077", "client"),
            storage,
            store_url=url,
            store_url_masked=mask_url(url),
            poll_interval_s=0.05,
            hook_factory=InProcessDriver,
        )

    first = launcher()
    spec = StageSpec(pipeline_key=KEY, stage_id=STAGE, splits=("a",), batch_size=1)
    job, code = first.build_job(StageJob(spec), StageCode(transform=transform))
    job = dataclasses.replace(job, heartbeat_interval_s=0.05)
    sid, files, store = job.submission_id, Files(storage, KEY, STAGE), _StateStore()
    outcome: dict[str, Any] = {}
    second = launcher()
    try:
        # try 1 records the submission, starts the driver and ends there; the driver runs on
        first_try = ResumableSubmission(first, job, code)
        first_try.submit_job({"task_state_store": store})

        # the driver heartbeats while it loads the stage's code: no epoch, the stage untaken
        _wait_for(loading.exists, "the driver to load the stage's code")
        beat = files.read_json(sid, "heartbeat.json")
        assert beat is not None and beat["epoch"] is None, beat
        assert coordinator.stage(STAGE).epoch == 0

        # try 2 decides on that heartbeat: RUNNING, reattach (nothing submitted)
        def second_try() -> None:
            again, again_code = second.build_job(StageJob(spec), StageCode(transform=transform))
            outcome["value"] = second.run(again, again_code, {"task_state_store": store})

        thread = threading.Thread(target=second_try, daemon=True)
        thread.start()
        _wait_for(lambda: second.submission == sid, "try 2 to reattach")
        assert second.resumable.previous == {"submission_id": sid, "status": "RUNNING"}

        # the driver takes the stage and is held in its first batch, before any progress: a
        # heartbeat written from now on carries the epoch it holds
        loaded.touch()
        _wait_for(in_batch.exists, "the driver's first batch")
        since = float(in_batch.read_text())
        beat = _wait_for(
            lambda: (b := files.read_json(sid, "heartbeat.json")) and b["at"] > since and b,
            "a heartbeat written after the driver took the stage",
        )
        epoch = coordinator.stage(STAGE).epoch
        assert not coordinator.stage(STAGE).progress.finished_splits
        assert epoch > 0 and beat["epoch"] == epoch, (beat, epoch)
        go_on.touch()
        thread.join(timeout=300)
    finally:
        loaded.touch()
        go_on.touch()
    result: DriverOutcome = outcome["value"]
    assert result.reconnected and result.submission_id == sid and result.epoch == epoch
    assert result.result.processed_splits == ("a",)
    assert coordinator.stage(STAGE).epoch == epoch  # no attempt but the reattached driver's
    specs = glob.glob(f"{tmp_path}/ckpt/**/drivers/{STAGE}/*/spec.json", recursive=True)
    assert [Path(p).parent.name for p in specs] == [sid]  # one submission for two tries
