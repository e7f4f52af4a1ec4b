"""Copies of the example pipeline for the stop / resume end-to-end tests, each with its own
output and pace (FINALCKPT_E2E_WORK and FINALCKPT_E2E_DAYS are set by the tests' cluster, see
tests/e2e/ui_cluster.py). ``retries=1``: a stage task that Airflow fails for its own reasons
(e.g. apache/airflow#72716, a deferred task failed by a stale executor event under load) is
retried, and the retry continues the stage from its durable progress.

The stages a test stops are paced by order, not by timing: every batch but the stage's first
waits until the DAG run's pipeline has a stop request (``_until_stopped``) or until the test
writes a gate file (``_gate``), so a stop requested after the first batch always lands mid-stage
however slowly the machine runs, and no batch sleeps."""

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
#: A hang guard for a held batch, never reached when the test works.
HOLD_S = 600.0


def _gate(path: str, *, at_most_s: float = HOLD_S) -> Callable[[Any], None]:
    """A batch hook: every batch but the stage's first waits (at most ``at_most_s``) for the
    file ``path``, which the test writes when it lets the stage go on."""

    def hook(ctx: Any) -> None:
        if first_days(1)[0] in {day_of_split(s) for s in ctx.splits}:
            return  # the first batch
        deadline = time.monotonic() + at_most_s
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.2)

    return hook


def _until_stopped(*, at_most_s: float = HOLD_S) -> Callable[[Any], None]:
    """A batch hook: every batch after the stage's first recorded one waits (at most
    ``at_most_s``) until the DAG run's pipeline has a stop request, in any state (a resumed
    stage goes on at once). The first batch runs at once, so a test sees progress, stops, and
    the stop always lands before the stage's last split. A DAG run restored from a savepoint
    is not held (test_stop_api leaves one queued; a later unpause starts it)."""

    def hook(ctx: Any) -> None:
        if ctx.conf.get("restore_from"):
            return
        from airflow_finalckpt.coordination import Coordinator
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.repository import pipeline_of_dag_run

        engine = make_engine(os.environ["AIRFLOW__FINALCKPT__STORE_URL"])
        try:
            key = pipeline_of_dag_run(engine, ctx.run.dag_id, ctx.run.run_id)
            if key is None:
                return
            coord = Coordinator(engine, key)
            if not coord.stage(ctx.stage_id).progress.finished_splits:
                return  # the first batch
            deadline = time.monotonic() + at_most_s
            while coord.stop_request() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            engine.dispose()

    return hook


def _copy(
    dag_id: str,
    name: str,
    *,
    ingest_hook: Callable[[Any], None] | None = None,
    enrich_hook: Callable[[Any], None] | None = None,
) -> object:
    hooks = {"ingest": ingest_hook, "enrich": enrich_hook}
    return build_dag(
        dag_id,
        input_dir=f"{WORK}/input",
        output_dir=f"{WORK}/{name}/output",
        days=DAYS,
        retries=1,
        asset=f"{dag_id}_windows",
        batch_sizes=BATCH_SIZES,
        batch_hooks={stage: hook for stage, hook in hooks.items() if hook is not None},
    )


# stop with savepoint / resume through the REST API and the UI page: enrich's second batch
# waits for the stop request
savepoint_dag = _copy("finalckpt_e2e_savepoint", "savepoint", enrich_hook=_until_stopped())
# stop with savepoint / resume through the CLI, sinks compared row for row
# (tests/e2e/test_stop_resume.py): enrich's second batch waits for the stop request
resume_dag = _copy("finalckpt_e2e_resume", "resume", enrich_hook=_until_stopped())
# stop with drain mid-ingest: ingest's second batch waits until the test has stored its drain
# request and seen a second stop refused (it writes the gate file then)
DRAIN_GATE = f"{WORK}/drain/stop-sent"
drain_dag = _copy("finalckpt_e2e_drain", "drain", ingest_hook=_gate(DRAIN_GATE))
# stop with drain clicked in the UI page (tests/e2e/test_ui_browser.py): its own sinks;
# ingest's second batch waits for the drain request
ui_drain_dag = _copy("finalckpt_e2e_ui_drain", "ui_drain", ingest_hook=_until_stopped())
