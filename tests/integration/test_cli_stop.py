"""`finalckpt stop | resume | restore | status` on a real coordinator (SQLite / PostgreSQL).

Stages are driven through the coordinator's own transitions (what the stage runtime does at its
batch boundaries), so the CLI is exercised against real store state; every refusal is checked
for its message, its exit code and that nothing changed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.control import PipelineControl, PipelineRunState
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    EndOfData,
    StageSnapshot,
    StopMode,
    StopState,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

DAG = "flights"
RUN = "manual__2026-11-22"
KEY = "flights.manual__2026-11-22"
#: the commands that act through the api-server unless told --direct-store
DIRECT_COMMANDS = ("stop", "resume", "reset", "status")


@dataclass
class Env:
    url: str
    coord: Coordinator
    storage: CheckpointStorage
    runner: CliRunner
    control: PipelineControl

    def invoke(self, *args: str) -> tuple[int, str, str]:
        """The command on this test's store (``--direct-store``: no api-server here)."""
        direct = ["--direct-store"] if args[0] in DIRECT_COMMANDS else []
        result = self.runner.invoke(main, [*args, *direct, "--store-url", self.url])
        return result.exit_code, result.stdout, result.stderr

    def stop_rows(self) -> list[tuple[object, ...]]:
        with self.coord.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(t.stop_requests)).all()]


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def env(store_url: str, tmp_path: Path, isolated_settings_env: Path) -> Iterator[Env]:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    engine = make_engine(store_url)
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["ingest", "enrich"], [("ingest", "enrich")]))
    coord.link_dag_run(DAG, RUN)
    # no Airflow api-server here: nothing listens on that port
    runner = CliRunner(
        env={
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"),
            "AIRFLOW__FINALCKPT__API_URL": f"http://127.0.0.1:{closed_port()}",
        }
    )
    yield Env(store_url, coord, storage, runner, PipelineControl(engine, storage))
    engine.dispose()


def finish(coord: Coordinator, stage: str, epoch: int, *, drain: bool = False, unread: int = 0):
    return coord.finish(
        stage,
        epoch,
        StageSnapshot(
            end_of_data=EndOfData(drain=drain, manifest=[f"{stage}/p0"], unread_splits=unread)
        ),
    )


def test_stop_with_savepoint_wait_and_resume(env: Env) -> None:
    epoch = env.coord.start_attempt("ingest", total_splits=4).epoch
    env.coord.record_batch("ingest", epoch, finished_splits=["d1"])

    def stage_reaches_its_batch_boundary() -> None:
        deadline = time.monotonic() + 20
        while env.coord.stop_request() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        env.coord.record_batch("ingest", epoch)  # answers the savepoint
        env.coord.suspend("ingest", epoch)

    stage = threading.Thread(target=stage_reaches_its_batch_boundary)
    stage.start()
    code, out, err = env.invoke("stop", DAG, RUN, "--savepoint", "--wait", "--timeout", "30")
    stage.join()
    assert code == 0, err
    assert "stop with savepoint #1: REQUESTED" in out
    assert "stop with savepoint #1: COMPLETED, savepoint 1 at " in out
    savepoint = env.coord.checkpoint(1)
    assert savepoint.kind is CheckpointKind.SAVEPOINT and savepoint.metadata_path in out

    code, out, err = env.invoke("status", DAG, RUN, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["state"] == PipelineRunState.SUSPENDED.value
    assert [s["status"] for s in doc["stages"]] == ["PARTIALLY_FINISHED", "NOT_STARTED"]

    code, out, err = env.invoke("resume", DAG, RUN)
    assert code == 0, err
    assert "resumed" in out
    assert env.coord.stop_request().state is StopState.RESUMED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stop", DAG, "no-such-run", "--drain"], "no pipeline run is known for DAG run"),
        (["stop", "other_dag", RUN, "--savepoint"], "of DAG 'other_dag'"),
        (["stop", DAG, RUN], "choose how to stop: --drain or --savepoint"),
        (["resume", DAG, RUN], "is not suspended"),
        (["status", DAG, "nope"], "no pipeline run is known"),
    ],
)
def test_bad_requests_fail_clearly_and_change_nothing(
    env: Env, args: list[str], message: str
) -> None:
    env.coord.start_attempt("ingest")
    before = env.stop_rows()
    code, out, err = env.invoke(*args)
    assert code == 2, (out, err)
    assert message in err
    assert err.startswith("error: ") and "Traceback" not in err
    assert env.stop_rows() == before


def test_stopping_twice_a_finished_run_and_a_drained_run_are_refused(env: Env) -> None:
    ingest = env.coord.start_attempt("ingest", total_splits=10).epoch
    code, out, err = env.invoke("stop", DAG, RUN, "--drain")
    assert code == 0, err
    assert "stop with drain #1: REQUESTED" in out
    before = env.stop_rows()
    code, _, err = env.invoke("stop", DAG, RUN, "--savepoint")
    assert code == 2 and "is already stopping (drain requested)" in err
    assert env.stop_rows() == before

    finish(env.coord, "ingest", ingest, drain=True, unread=7)
    env.coord.close("ingest", ingest, env.coord.closable_checkpoint("ingest") or 0)
    enrich = env.coord.start_attempt("enrich", total_splits=1).epoch
    finish(env.coord, "enrich", enrich, drain=True)
    drained = env.coord.stop_request()
    assert drained is not None and drained.state is StopState.COMPLETED
    assert env.coord.checkpoint(drained.savepoint_id or 0).kind is CheckpointKind.DRAINED_SAVEPOINT

    code, _, err = env.invoke("resume", DAG, RUN)
    assert code == 2 and "was drained at savepoint" in err and "cannot be resumed" in err
    code, _, err = env.invoke("stop", DAG, RUN, "--drain")
    assert code == 2 and "was already drained" in err
    note = env.control.drain_note(DAG, RUN)
    assert note is not None and "7 input splits were left unread" in note
    assert "ingest 3/10" in note

    path = env.coord.checkpoint(drained.savepoint_id or 0).metadata_path
    assert path is not None
    code, _, err = env.invoke("restore", DAG, "--from", path, "--dry-run")
    assert code == 2 and "is a drained savepoint" in err and "cannot be restored" in err


def test_restore_checks_the_savepoint(env: Env, tmp_path: Path) -> None:
    epoch = env.coord.start_attempt("ingest").epoch
    env.coord.request_stop(StopMode.SAVEPOINT, "alice")
    env.coord.record_batch("ingest", epoch, finished_splits=["d1"])
    env.coord.suspend("ingest", epoch)
    path = env.coord.checkpoint(1).metadata_path
    assert path is not None

    # the DAG's graph comes from the api-server: unreachable, the restore is refused
    code, out, err = env.invoke("restore", DAG, "--from", path, "--dry-run")
    assert code == 2 and out == "", out
    assert err.startswith("error: cannot reach the Airflow API server at http://127.0.0.1:")
    assert "(from env AIRFLOW__FINALCKPT__API_URL)" in err and "--no-graph-check" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # ... unless the user asks for the savepoint check alone
    code, out, err = env.invoke("restore", DAG, "--from", path, "--dry-run", "--no-graph-check")
    assert code == 0, err
    assert f"savepoint 1 of pipeline {KEY!r} (savepoint)" in out
    assert "graph was NOT checked here (--no-graph-check)" in out
    assert "graph-change rules are checked by the stage tasks" in out
    assert f"can be restored into {DAG}" in out
    # a real restore needs the api-server to create the DAG run: nothing is created without it
    code, out, err = env.invoke("restore", DAG, "--from", path, "--no-graph-check")
    assert code == 2 and "cannot reach the Airflow API server" in err
    assert "--no-graph-check" not in err  # that is not what would help

    code, _, err = env.invoke("restore", "another_dag", "--from", path, "--dry-run")
    assert code == 2
    assert f"belongs to pipeline {KEY!r} of DAG {DAG}, not of DAG 'another_dag'" in err

    code, out, err = env.invoke("restore", DAG, "--from", path, "--allow-drop-stage", " ")
    assert code == 2 and out == "" and err.startswith("error: allow_drop_stages must be a list")

    code, _, err = env.invoke("restore", DAG, "--from", str(tmp_path / "nope"), "--dry-run")
    assert code == 2 and "nope" in err and "Traceback" not in err

    corrupt = tmp_path / "corrupt" / "_metadata"
    corrupt.parent.mkdir()
    corrupt.write_bytes(Path(path).read_bytes()[:40])
    code, _, err = env.invoke("restore", DAG, "--from", str(corrupt), "--dry-run")
    assert code == 2 and "Traceback" not in err and err.startswith("error: ")


def test_control_refuses_a_savepoint_whose_stages_are_not_in_the_dag(env: Env) -> None:
    epoch = env.coord.start_attempt("ingest").epoch
    env.coord.request_stop(StopMode.SAVEPOINT)
    env.coord.record_batch("ingest", epoch)
    env.coord.suspend("ingest", epoch)
    path = env.coord.checkpoint(1).metadata_path
    assert path is not None
    with env.coord.engine.begin() as conn:  # an empty coordination database elsewhere
        conn.execute(t.dag_runs.delete())
    from airflow_finalckpt.core.errors import ForeignCheckpointError

    assert env.control.check_restore("new_dag", path, stage_ids={"ingest", "x"}).checkpoint_id == 1
    with pytest.raises(ForeignCheckpointError, match="none of its stages"):
        env.control.check_restore("new_dag", path, stage_ids={"load", "report"})


def test_the_installed_console_script_stops_a_run(env: Env, tmp_path: Path) -> None:
    env.coord.start_attempt("ingest")
    script = Path(sys.executable).parent / "finalckpt"
    proc = subprocess.run(
        [str(script), "stop", DAG, RUN, "--savepoint", "--direct-store", "--store-url", env.url],
        capture_output=True,
        text=True,
        env={"AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"), "PATH": ""},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "stop with savepoint #1: REQUESTED, savepoint 1" in proc.stdout
    stop = env.coord.stop_request()
    assert stop is not None and stop.requested_by is not None
    assert stop.requested_by.startswith("cli")
