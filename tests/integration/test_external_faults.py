"""External faults (``faults.external``): a real full disk, a restarted
PostgreSQL server, faults during a stop with savepoint or drain; each followed by recovery and
verified like a campaign run (lost, duplicated, orphaned, leaked, pending: all zero).

A scenario that cannot run here (not root, no PostgreSQL 15 binaries) skips with the reason,
except under ``CI=true``, where it fails. The PostgreSQL scenario starts a private cluster on a
free port and never touches the shared server.

    .venv/bin/python -m pytest tests/integration/test_external_faults.py -v
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_finalckpt.core.model import StopMode
from faults.campaign import main
from faults.external import (
    STOP_CASES,
    PrivatePostgres,
    StopCase,
    execute_scenario,
    mount_unavailable,
    postgres_unavailable,
    run_external,
    stop_scenario,
    store_restart_scenario,
)
from faults.runs import Environment, RunReport
from faults.worker import FAKE, WorkerHandle

pytestmark = pytest.mark.slow


def require(reason: str | None) -> None:
    """Skip when ``reason`` says the scenario cannot run here; under CI=true, fail instead."""
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerHandle]:
    """One warm worker lane (with a spare for crashes) for every scenario of the module."""
    handle = WorkerHandle(FAKE, str(tmp_path_factory.mktemp("workers") / "worker.out"), spare=True)
    try:
        yield handle
    finally:
        handle.close()


def assert_recovered(report: RunReport) -> None:
    assert report.problems() == [], report.problems()
    verdict = report.verdict
    assert verdict is not None and verdict.rows
    assert (verdict.lost, verdict.duplicated, verdict.wrong) == (0, 0, 0)
    assert (verdict.orphaned, verdict.leaked, verdict.pending) == ([], [], [])
    assert report.completed


def test_disk_full_through_the_campaign_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny tmpfs as checkpoint storage, then as the Parquet sink's directory: attempt 1
    fails with a real ENOSPC and leaves nothing it must not; the disk grows, the retry
    finishes; the tmpfs is unmounted afterwards."""
    require(mount_unavailable())
    report = tmp_path / "report.json"
    workdir = tmp_path / "campaign"
    args = ["--runs", "0", "--seed", "1", "--external", "disk-full", "--workdir", str(workdir)]
    code = main([*args, "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 runs (2 fake, 0 spark, 2 external)" in out
    assert "lost 0, duplicated 0" in out
    runs = json.loads(report.read_text())["runs"]
    assert [r["plan"]["purpose"] for r in runs] == [
        "external disk-full (checkpoints)",
        "external disk-full (sink)",
    ]
    for run in runs:
        first, *rest = run["attempts"]
        assert first["status"] == "failed" and "No space left on device" in first["error"]
        assert [a["status"] for a in rest] == ["completed"]
        assert run["problems"] == [] and run["verdict"]["rows"]
    assert not [p for p in workdir.iterdir() if p.is_mount()], "a tmpfs is still mounted"


def test_store_restart_mid_transition(tmp_path: Path, worker: WorkerHandle) -> None:
    """A private PostgreSQL (store and SQL sink) crashes and restarts while the pipeline holds a
    completing transition open: the attempt fails, the retry finishes exactly once."""
    require(postgres_unavailable())
    with PrivatePostgres() as server:
        env = Environment(tmp_path, store="postgres", pg_admin_url=server.admin_url)
        env.prepare(spark=False)
        try:
            report = execute_scenario(env, store_restart_scenario(0, server), worker)
        finally:
            env.cleanup()
        assert server.restarts == 1
    assert not server.root.exists()
    first = report.attempts[0]
    assert (first.status, first.error_type) == ("failed", "OperationalError"), first
    assert_recovered(report)


@pytest.mark.parametrize("case", STOP_CASES, ids=lambda c: c.name.replace(" ", "_"))
def test_fault_during_a_stop(tmp_path: Path, worker: WorkerHandle, case: StopCase) -> None:
    """A stop requested from outside mid-run, a crash or exception while it is under way, then
    recovery (and a resume after a savepoint): the sinks hold the fault-free result."""
    env = Environment(tmp_path)
    env.prepare(spark=False)
    report = execute_scenario(env, stop_scenario(0, case), worker)
    assert_recovered(report)
    statuses = [a.status for a in report.attempts]
    if case.mode is StopMode.SAVEPOINT:
        assert statuses[-2:] == ["suspended", "completed"], statuses  # resumed once
    else:
        assert "suspended" not in statuses, statuses
    if case.fault is not None:
        assert [f["point"] for f in report.attempts[0].fired][-1] == case.fault.point


def test_a_scenario_that_cannot_run_is_an_error_not_a_silent_pass(
    tmp_path: Path, worker: WorkerHandle
) -> None:
    env = Environment(tmp_path)
    env.prepare(spark=False)
    [report] = run_external(env, ["store-restart"], worker, bindir=tmp_path / "no-postgres")
    assert report.error is not None and "binaries not found" in report.error
    assert report.problems() and not report.attempts


def test_the_command_refuses_unknown_external_faults() -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "0", "--seed", "1", "--external", "disk-ful"])
    with pytest.raises(SystemExit):
        main(["--runs", "0", "--seed", "1"])
