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
    for fmt in (["--json"], []):
        result = CliRunner().invoke(
            main, ["checkpoints", "list", "--pipeline", "nope", "--store-url", url, *fmt]
        )
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        assert "pipeline 'nope' is not registered" in line, line
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


#: The real CLI entry point under a memory limit (the address space it had once warm plus
#: 768 MiB): ``finalckpt checkpoints show`` of a clean checkpoint first (the command's own lazy
#: imports), then of the hostile one, timed from the call, with its peak RSS before and after.
_BOUNDED_CLI = """
import contextlib, io, json, resource, sys, time
from airflow_finalckpt.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["checkpoints", "show", sys.argv[2]])
with open("/proc/self/status") as status:
    vm = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (768 << 20), resource.RLIM_INFINITY))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
try:
    main(sys.argv[3:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
report = {"code": code, "seconds": time.monotonic() - start,
          "rss_growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


def test_a_split_set_bomb_is_refused_fast_in_bounded_memory(
    written: tuple[str, str, Coordinator], tmp_path: Path
) -> None:
    """Issue 37: the 136 KB split set that ended in a MemoryError (40,000 entries sharing
    60,000 characters: 2.4 GB decoded), planted in a real checkpoint with its envelope
    resealed, is refused by ``finalckpt checkpoints show`` in one line, in under a second, its
    peak RSS growing by less than 160 MB, under an address-space limit."""
    from tests.split_set_bombs import bomb_split_set, plant_bomb

    _, path, _ = written
    clean = tmp_path / "clean" / "cli-demo" / "chk-1" / "_metadata"
    clean.parent.mkdir(parents=True)
    clean.write_bytes(Path(path).read_bytes())
    size = plant_bomb(Path(path), "enrich", bomb_split_set(40_000, 60_000))
    assert size < 200_000
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-c", _BOUNDED_CLI, str(report), str(clean), "checkpoints", "show", path],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert report.exists(), out
    result = json.loads(report.read_text())
    assert result["code"] == 2, out
    assert "Traceback" not in out and "MemoryError" not in out, out
    [line] = [x for x in out.splitlines() if x.strip()]
    assert "the split ids expand beyond" in line and "'enrich'" in line, line
    assert result["seconds"] < 1.0, result
    assert result["rss_growth_kb"] < 160 * 1024, result


def test_list_of_an_unknown_pipeline_refuses_and_a_known_empty_one_lists(
    store_url: str,
) -> None:
    """Issue 37: ``checkpoints list --pipeline <unknown>`` exited 0 with an empty table; now one
    line and exit 2 like the other commands (the console script itself), while a registered
    pipeline without checkpoints still lists nothing, successfully."""
    exe = Path(sys.executable).with_name("finalckpt")
    args = [str(exe), "checkpoints", "list", "--pipeline", "typo", "--store-url", store_url]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert "pipeline 'typo' is not registered" in line and "Traceback" not in proc.stderr
    Coordinator(make_engine(store_url), "empty").register(StageGraph.from_edges(["a"], []))
    listed = CliRunner().invoke(
        main, ["checkpoints", "list", "--pipeline", "empty", "--store-url", store_url, "--json"]
    )
    assert listed.exit_code == 0 and json.loads(listed.output) == []
