"""`finalckpt checkpoints list|show` on checkpoints written by a real coordinator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StageSnapshot, StageStatus, TriggerReason
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

STATUSES = {s.value for s in StageStatus}


@pytest.fixture
def written(store_url: str, tmp_path: Path) -> tuple[str, str, Coordinator]:
    """A pipeline with one stage of each status in its latest checkpoint."""
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(make_engine(store_url), "cli-demo", writer=storage)
    coord.register(
        StageGraph.from_edges(
            ["ingest", "enrich", "windows", "side"],
            [("ingest", "enrich"), ("enrich", "windows")],
        )
    )
    ingest = coord.start_attempt("ingest", total_splits=2)
    coord.finish("ingest", ingest.epoch, StageSnapshot(finished_splits=frozenset({"d1", "d2"})))
    enrich = coord.start_attempt("enrich", total_splits=3)
    side = coord.start_attempt("side", total_splits=1)
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    coord.record_batch("enrich", enrich.epoch, finished_splits=["d1"])
    coord.record_batch("side", side.epoch)
    path = coord.checkpoint(cid).metadata_path
    assert path is not None
    return store_url, path, coord


def test_show_path_json_prints_every_stage_status(written: tuple[str, str, Coordinator]) -> None:
    _, path, _ = written
    result = CliRunner().invoke(main, ["checkpoints", "show", path, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    by_stage = {s["stage_id"]: s for s in doc["stages"]}
    assert {s["status"] for s in doc["stages"]} <= STATUSES
    assert by_stage["ingest"]["status"] == "FULLY_FINISHED"
    assert doc["metadata_version"] == 2
    # metadata v2: a fully finished stage is a flag and a count, not its split ids
    assert by_stage["ingest"]["finished_splits"] == []
    assert by_stage["ingest"]["finished_count"] == 2
    assert by_stage["enrich"]["status"] == "PARTIALLY_FINISHED"
    assert by_stage["enrich"]["finished_splits"] == ["d1"]
    assert by_stage["enrich"]["finished_count"] == 1
    assert by_stage["side"]["status"] == "RUNNING"
    assert by_stage["windows"]["status"] == "NOT_STARTED"
    assert by_stage["windows"]["finished_splits"] == []


def test_show_by_id_and_list(written: tuple[str, str, Coordinator], tmp_path: Path) -> None:
    url, _path, coord = written
    env = {"AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints")}
    runner = CliRunner(env=env)
    cid = coord.latest_completed().checkpoint_id  # type: ignore[union-attr]
    shown = runner.invoke(
        main,
        ["checkpoints", "show", str(cid), "--pipeline", "cli-demo", "--store-url", url, "--json"],
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["checkpoint_id"] == cid
    listed = runner.invoke(
        main, ["checkpoints", "list", "--pipeline", "cli-demo", "--store-url", url, "--json"]
    )
    assert listed.exit_code == 0, listed.output
    ids = [c["checkpoint_id"] for c in json.loads(listed.output)]
    assert ids == sorted(ids, reverse=True) and cid in ids
    table = runner.invoke(
        main, ["checkpoints", "list", "--pipeline", "cli-demo", "--store-url", url]
    )
    assert table.exit_code == 0 and "COMPLETED" in table.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["checkpoints", "show", "/nonexistent/p/chk-1"], "no checkpoint metadata"),
        (["checkpoints", "show", "3"], "needs --pipeline"),
    ],
)
def test_bad_targets_fail_clearly(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert message in result.output


def test_unknown_pipeline_and_corrupt_metadata(
    written: tuple[str, str, Coordinator],
) -> None:
    url, path, _ = written
    result = CliRunner().invoke(
        main, ["checkpoints", "list", "--pipeline", "nope", "--store-url", url, "--json"]
    )
    assert result.exit_code == 0 and json.loads(result.output) == []
    shown = CliRunner().invoke(
        main, ["checkpoints", "show", "1", "--pipeline", "nope", "--store-url", url]
    )
    assert shown.exit_code == 2 and "no checkpoint 1" in shown.output
    Path(path).write_bytes(Path(path).read_bytes()[:40])
    corrupt = CliRunner().invoke(main, ["checkpoints", "show", path])
    assert corrupt.exit_code == 2 and "Traceback" not in corrupt.output
    # one line that names the file and what is wrong with it
    assert corrupt.output.count("\n") == 1 and corrupt.output.startswith("error: "), corrupt.output
    assert f"checkpoint metadata {path} is not valid JSON" in corrupt.output, corrupt.output
    assert "truncated or corrupt" in corrupt.output


def test_console_script_runs(written: tuple[str, str, Coordinator]) -> None:
    _, path, _ = written
    exe = Path(sys.executable).with_name("finalckpt")
    proc = subprocess.run(
        [str(exe), "checkpoints", "show", path, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert {s["status"] for s in json.loads(proc.stdout)["stages"]} == STATUSES
