"""Copies of the example pipeline for the stop / resume end-to-end tests, each with its own
output and pace (FINALCKPT_E2E_WORK and FINALCKPT_E2E_DAYS are set by the tests' cluster, see
tests/e2e/ui_cluster.py). ``retries=1``: a stage task that Airflow fails for its own reasons
(e.g. apache/airflow#72716, a deferred task failed by a stale executor event under load) is
retried, and the retry continues the stage from its durable progress."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from airflow_finalckpt.examples.nycflights13.dag import build_dag
from airflow_finalckpt.examples.nycflights13.data import day_of_split, first_days

WORK = os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-stop")
DAYS = int(os.environ.get("FINALCKPT_E2E_DAYS", "21"))
#: Fixed batches (not the default "auto"): the tests stop and drain at known batch boundaries.
BATCH_SIZES = {"ingest": 7, "enrich": 1, "delay_windows": 4, "publish": 4}


def _sleep(seconds: float) -> Callable[[Any], None]:
    """A batch hook pacing a stage: each of its batches first sleeps ``seconds``."""
    return lambda _ctx: time.sleep(seconds)


def _gate(path: str, seconds: float, *, at_most_s: float = 300.0) -> Callable[[Any], None]:
    """A batch hook pacing a stage by order, not by timing: each batch sleeps ``seconds``, and
    every batch but the stage's first then waits (at most ``at_most_s``) for the file ``path``,
    which the test writes once its stop request is stored."""

    def hook(ctx: Any) -> None:
        time.sleep(seconds)
        if first_days(1)[0] in {day_of_split(s) for s in ctx.splits}:
            return  # the first batch
        deadline = time.monotonic() + at_most_s
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.2)

    return hook


def _copy(
    dag_id: str,
    name: str,
    *,
    ingest_delay_s: float = 0.0,
    enrich_delay_s: float = 0.0,
    ingest_hook: Callable[[Any], None] | None = None,
) -> object:
    return build_dag(
        dag_id,
        input_dir=f"{WORK}/input",
        output_dir=f"{WORK}/{name}/output",
        days=DAYS,
        retries=1,
        asset=f"{dag_id}_windows",
        batch_sizes=BATCH_SIZES,
        batch_hooks={
            "ingest": ingest_hook or _sleep(ingest_delay_s),
            "enrich": _sleep(enrich_delay_s),
        },
    )


# stop with savepoint / resume through the REST API and the UI page
savepoint_dag = _copy("finalckpt_e2e_savepoint", "savepoint", enrich_delay_s=3.0)
# stop with savepoint / resume through the CLI, sinks compared row for row; slower batches:
# the stop comes from a console script whose start-up under load can take several seconds, and
# it must land before enrich's second batch ends (tests/e2e/test_stop_resume.py)
resume_dag = _copy("finalckpt_e2e_resume", "resume", enrich_delay_s=8.0)
# stop with drain mid-ingest: ingest's second batch starts only once the test has stored its
# drain request (the CLI's start-up under load took longer than two 3 s batches once)
DRAIN_GATE = f"{WORK}/drain/stop-sent"
drain_dag = _copy("finalckpt_e2e_drain", "drain", ingest_hook=_gate(DRAIN_GATE, 3.0))
# stop with drain clicked in the UI page (tests/e2e/test_ui_browser.py): its own sinks, and
# ingest batches slow enough that the click lands while ingest still has days to read
ui_drain_dag = _copy("finalckpt_e2e_ui_drain", "ui_drain", ingest_delay_s=10.0)
