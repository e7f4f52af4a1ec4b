"""The benchmark suite still runs: ``python -m benchmarks.run --quick`` into a temporary directory
writes every results file in the documented shape (docs/benchmarks.md). No timing is asserted:
the numbers of a quick run on a shared machine mean nothing."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STAGES = ("ingest", "enrich", "delay_windows", "publish")
BENCHMARKS = (
    "coordinator_scale",
    "triggerer_load",
    "final_checkpoint_latency",
    "steady_state_overhead",
    "resume_savings",
    "batch_target_curve",
    "stop_latency",
)
TOP_LEVEL: dict[str, type | tuple[type, ...]] = {
    "benchmark": str,
    "schema_version": int,
    "timestamp": str,
    "quick": bool,
    "duration_s": (int, float),
    "machine": dict,
    "parameters": dict,
    "repetitions": int,
    "cases": list,
    "medians": dict,
    "ratios": dict,
    "targets": list,
    "status": str,
    "notes": list,
}
#: Per benchmark: medians every case has, and ratio key prefixes the document must have.
CASE_MEDIANS = {
    "coordinator_scale": {"seconds_per_checkpoint", "trigger_s", "metadata_bytes"},
    "triggerer_load": set(),
    "final_checkpoint_latency": {"p50_s", "p95_s", "reference_p50_s"},
    "steady_state_overhead": {"seconds"},
    "resume_savings": set(),
    "batch_target_curve": {"seconds"},
    "stop_latency": {"batch_s", "prior_batch_s"},
}
RATIO_PREFIXES = {
    "coordinator_scale": (),
    "triggerer_load": ("round_over_poll_interval/",),
    "final_checkpoint_latency": ("reference_over_measured_p50/",),
    "steady_state_overhead": ("ours_over_plain/", "cold_over_plain/", "protocol_over_plain/"),
    "resume_savings": ("ours_over_ideal/", "retry_over_ideal/", "rerun_over_ideal/"),
    "batch_target_curve": ("ours_over_plain/",),
    "stop_latency": (
        "savepoint_over_batch/",
        "suspended_over_batch/",
        "source_finished_over_batch/",
        "drained_savepoint_over_batch/",
    ),
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bench-results")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard, not a timing assertion
        check=False,
    )
    assert proc.returncode == 0, f"suite failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out, proc.stdout + proc.stderr


def _check_types(doc: dict[str, Any], name: str) -> None:
    for key, kind in TOP_LEVEL.items():
        assert key in doc, f"{name}: missing {key!r}"
        assert isinstance(doc[key], kind), f"{name}: {key!r} is {type(doc[key]).__name__}"


@pytest.mark.parametrize("name", BENCHMARKS)
def test_results_have_the_documented_shape(quick_run: tuple[Path, str], name: str) -> None:
    out, _ = quick_run
    doc = json.loads((out / f"{name}.json").read_text())
    _check_types(doc, name)
    assert doc["benchmark"] == name
    assert doc["schema_version"] == 1
    assert doc["quick"] is True
    assert doc["status"] in {"pass", "miss", "partial"}, doc["notes"]
    assert dt.datetime.fromisoformat(doc["timestamp"]).tzinfo is not None
    machine = doc["machine"]
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert machine["python"].count(".") == 2
    assert machine["spark"] and machine["spark"] != "(not installed)"
    assert doc["repetitions"] >= 1

    assert doc["cases"], f"{name}: no cases"
    for case in doc["cases"]:
        assert set(case) == {"name", "params", "samples", "medians"}
        assert isinstance(case["name"], str) and case["name"]
        for metric, values in case["samples"].items():
            assert isinstance(values, list) and values, f"{name}/{case['name']}: {metric}"
            assert all(isinstance(v, int | float) for v in values)
            assert metric in case["medians"]
        missing = CASE_MEDIANS[name] - set(case["medians"])
        assert not missing, f"{name}/{case['name']}: medians lack {missing}"

    for prefix in RATIO_PREFIXES[name]:
        assert any(key.startswith(prefix) for key in doc["ratios"]), f"{name}: no {prefix}*"

    assert doc["targets"], f"{name}: no targets"
    for target in doc["targets"]:
        assert set(target) == {"name", "target", "measured", "unit", "pass", "note"}
        assert target["pass"] in (True, False, None)
        assert isinstance(target["target"], str) and target["target"]


def test_benchmark_specifics(quick_run: tuple[Path, str]) -> None:
    out, _ = quick_run
    scale = json.loads((out / "coordinator_scale.json").read_text())
    assert {c["params"]["backend"] for c in scale["cases"]} >= {"sqlite"}
    assert all(c["params"]["running_stages"] >= 1 for c in scale["cases"])
    assert any(key.startswith("growth_exponent/") for key in scale["medians"])

    waiters = json.loads((out / "triggerer_load.json").read_text())
    polls = [c for c in waiters["cases"] if not c["name"].startswith("fan-in/")]
    fans = [c for c in waiters["cases"] if c["name"].startswith("fan-in/")]
    assert polls and all(c["medians"]["write_txns_per_poll"] >= 0 for c in polls)
    assert fans and all(c["medians"]["pending_checkpoints"] >= 1 for c in fans)

    latency = json.loads((out / "final_checkpoint_latency.json").read_text())
    assert {c["params"]["interval_s"] for c in latency["cases"]} == {10.0, 60.0, 3600.0}
    assert {c["params"]["scenario"] for c in latency["cases"]} == {"alone", "busy", "spark"}

    resume = json.loads((out / "resume_savings.json").read_text())
    crashes = [c for c in resume["cases"] if c["name"].startswith("crash@")]
    assert crashes
    for case in crashes:
        # correctness, not timing: a resume redoes exactly the unfinished splits
        assert case["medians"]["ours_redone_splits"] == case["params"]["unfinished_splits"]
        assert case["samples"]["ours_redone_splits"] == case["samples"]["ours_unfinished_splits"]
        assert 0 < case["medians"]["ours_finished_fraction"] < 1
        assert case["medians"]["ours_ingest_spark_jobs"] == 0
        # the crash lands by split progress: at the point or above it by less than one batch
        reached = case["params"]["finished_fraction_per_repetition"]
        assert len(reached) == resume["repetitions"]
        assert all(f >= case["params"]["crash_fraction"] for f in reached), reached
        assert case["samples"]["ours_within_one_batch"] == [1.0] * len(reached)
    assert any(t["name"].startswith("crash point, crash at ") for t in resume["targets"])

    stop = json.loads((out / "stop_latency.json").read_text())
    assert {c["params"]["mode"] for c in stop["cases"]} == {"savepoint", "drain"}
    for case in stop["cases"]:
        medians = case["medians"]
        if case["params"]["mode"] == "savepoint":
            # the stop kept what enrich had recorded (a kill would have lost it)
            assert medians["splits_kept"] >= 1
            assert {"savepoint_s", "suspended_s"} <= set(medians)
        else:
            # drained: the source read some splits and left the rest unread
            assert medians["read_splits"] >= 1 and medians["unread_splits"] >= 1
            assert {"source_finished_s", "drained_savepoint_s"} <= set(medians)

    steady = json.loads((out / "steady_state_overhead.json").read_text())
    rows = {c["name"]: c["medians"]["output_rows"] for c in steady["cases"]}
    assert len(set(rows.values())) == 1, f"both sides must write the same rows: {rows}"
    assert {c["name"].split("/")[0] for c in steady["cases"]} == {"plain", "ours", "ours-cold"}
    for case in steady["cases"]:
        if case["params"]["side"] != "plain":
            # auto batches: every stage ran at least one batch, and the sizes are recorded
            assert all(case["medians"][f"batches_{s}"] >= 1 for s in STAGES)
            assert case["params"]["batch_sizes"]

    curve = json.loads((out / "batch_target_curve.json").read_text())
    ours = sorted(
        (c for c in curve["cases"] if c["params"]["side"] == "ours"),
        key=lambda c: c["params"]["target_batch_s"],
    )
    assert len(ours) >= 2
    totals = [sum(c["medians"][f"batches_{s}"] for s in STAGES) for c in ours]
    # a smaller target never means fewer batches (sizes, not seconds)
    assert totals == sorted(totals, reverse=True), totals


def test_charts_or_a_clear_skip_message(quick_run: tuple[Path, str]) -> None:
    out, output = quick_run
    if importlib.util.find_spec("matplotlib") is None:
        assert "charts skipped: matplotlib is not installed" in output
        return
    for name in BENCHMARKS:
        png = out / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
