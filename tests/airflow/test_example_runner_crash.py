"""``--crash-mid-enrich`` through real Airflow ``dag.test()``: what the runner reports about the
first DAG run (``run.crash_report``) is what happened.

- 3 days: enrich has two or more splits (ingest's output parts); the crash fires when
  enrich starts its second batch, the DAG run fails, one split is recorded, and the report
  says so; a second DAG run of the same key resumes and succeeds;
- 1 day: enrich has one split, there is no second batch: no crash is injected, the DAG run
  succeeds, and the report says the crash did not fire and why (the runner's old message
  claimed a crash here).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.examples.nycflights13.run import CRASH_SPEC, crash_report

pytestmark = pytest.mark.slow

DAG_SOURCE = """
from airflow_finalckpt.examples.nycflights13.crash import crash_batch_sizes, crash_hook
from airflow_finalckpt.examples.nycflights13.dag import build_dag

dag = build_dag(
    DAG_ID,
    input_dir=INPUT,
    output_dir=OUTPUT,
    days=DAYS,
    retries=0,
    batch_sizes=crash_batch_sizes(DAYS),
    batch_hooks={"enrich": crash_hook(lambda: CRASH[0])},
)
"""


def _example(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, days: int
) -> Any:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", f"sqlite:///{tmp_path}/coordination.db")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    return write_dag(
        DAG_SOURCE,
        DAG_ID=f"crash_runner_{uuid.uuid4().hex[:8]}",
        INPUT=str(tmp_path / "input"),
        OUTPUT=str(tmp_path / "output"),
        DAYS=days,
        CRASH=[CRASH_SPEC],
    )


def test_a_crash_that_fires_is_reported_and_the_next_run_resumes(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = _example(write_dag, tmp_path, monkeypatch, days=3)
    key = f"crash-{uuid.uuid4().hex[:8]}"
    first = dag.test(run_conf={"pipeline_key": key})
    state = str(first.state)
    report = crash_report(key, state)
    assert state.endswith("failed"), state
    assert report.fired, report.message
    assert report.message.startswith(f"first DAG run {state}: the injected crash fired in enrich")
    found = re.search(
        r"after 1 batch\(es\); enrich is RUNNING with 1 of (\d+) splits", report.message
    )
    assert found is not None and int(found[1]) >= 2, report.message
    second = dag.test(run_conf={"pipeline_key": key})  # the marker keeps the crash from repeating
    assert str(second.state).endswith("success")


def test_a_crash_that_cannot_fire_is_reported_as_not_fired(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = _example(write_dag, tmp_path, monkeypatch, days=1)
    key = f"crash-{uuid.uuid4().hex[:8]}"
    first = dag.test(run_conf={"pipeline_key": key})
    state = str(first.state)
    report = crash_report(key, state)
    assert state.endswith("success"), state
    assert not report.fired
    assert report.message == (
        "the injected crash did not fire (stage enrich processes its 1 split(s) in 1 batch(es); "
        f"the crash needs a batch 2); first DAG run: {state}, enrich is CLOSED with 1 of 1 "
        "splits recorded"
    )
