"""The concurrent fault campaign's harness and the FLIP-147 cases it exercises.

- every graph shape run without faults (stages in threads, each with its own coordinator over
  one SQLite store) gives exactly the rows of the independent reference;
- out of order, deterministically: three parallel stages, the first two finish while the third
  stalls, the third's next batch acknowledges final checkpoints N and N+1 at once, N fails to
  complete, N+1 completes first and the first finished stage closes on it; with real runners in
  threads (``wide``), and as the campaign plans it (holds, ``straggler``) in every random shape;
- the scheduler: a failed stage attempt is retried in a new process with a new epoch, and a
  run that outlives its timeout is reported hung (a failure), not waited for;
- the scenarios of the branching example (issue 25, ``faults.scenarios``): a branch failing on
  every try while its sibling waits (the sibling closes, ``publish`` runs, the failing branch
  publishes nothing), a second DAG run on the same pipeline key (refused naming the first, or
  taking over: the first run's attempts end for good, one publication per commit).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import CheckpointState, StageLifecycle
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from faults.concurrent import (
    CONCURRENT,
    StageScheduler,
    closes_after_later_checkpoints,
    execute_concurrent_run,
    last_acks,
    run_stage_to_close,
    straggler,
)
from faults.fake import KEY_COLUMNS
from faults.injector import FaultInjector, FaultSpec
from faults.points import Action
from faults.proxies import FaultyStorage
from faults.runs import Environment, RunPlan, RunReport, verify_against
from faults.scenarios import FAILING_BRANCH, TWO_RUNS, execute_scenario, plan_scenarios
from faults.shapes import RANDOM_SHAPES, SHAPES, Shape, reference_rows
from faults.worker import RunSetup, dispose_sinks, make_sinks


def _plan(shape: str, **config: Any) -> RunPlan:
    defaults: dict[str, Any] = {
        "batch_sizes": dict.fromkeys(SHAPES[shape].stage_ids, 1),
        "checkpoint_interval_s": 3600.0,
        "fake": None,
        "shape": shape,
    }
    defaults.update(config)
    return RunPlan.single(0, kind=CONCURRENT, **defaults)


def _setup(tmp_path: Path, plan: RunPlan) -> tuple[Environment, RunSetup]:
    env = Environment(tmp_path / "campaign")
    env.prepare(spark=False)
    return env, env.setup(plan)


def _run_stage(
    setup: RunSetup,
    shape: Shape,
    stage_id: str,
    *,
    storage: CheckpointStorage | None = None,
    fault: Callable[[str], None] | None = None,
    errors: list[BaseException] | None = None,
) -> None:
    storage = storage or CheckpointStorage(setup.storage_root)
    coordinator = Coordinator(make_engine(setup.store_url), setup.pipeline_key, writer=storage)
    sinks = make_sinks(setup)
    try:
        assert run_stage_to_close(
            coordinator, storage, sinks, setup, shape, stage_id, log=_log(), fault=fault
        )
    except BaseException as exc:
        if errors is None:
            raise
        errors.append(exc)
    finally:
        dispose_sinks(sinks)
        coordinator.engine.dispose()


def _log() -> logging.Logger:
    return logging.getLogger("airflow_finalckpt.faults.stage")


def _threads(targets: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a stage did not end within 60 s"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_without_faults_gives_the_reference_rows(tmp_path: Path, name: str) -> None:
    shape = SHAPES[name]
    _env, setup = _setup(tmp_path, _plan(name))
    errors: list[BaseException] = []
    done: set[str] = set()
    while len(done) < len(shape.stages):  # every ready stage at once, like the scheduler
        ready = [
            s.stage_id
            for s in shape.stages
            if s.stage_id not in done and all(up in done for up in s.upstream)
        ]
        _threads([partial(_run_stage, setup, shape, sid, errors=errors) for sid in ready])
        assert errors == []
        done.update(ready)
    expected = pd.DataFrame(reference_rows(shape))
    assert len(expected) > 10 and expected["key"].str.contains(":").all()
    verdict = verify_against(setup, expected, KEY_COLUMNS)
    assert verdict.problems() == []
    assert sum(r.found for r in verdict.rows.values()) == 2 * len(expected)


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(0.02)


def test_a_later_final_checkpoint_completes_first_and_closes_the_first_finished_stage(
    tmp_path: Path,
) -> None:
    """FLIP-147's "finish, 42/43/44 triggered, 43 completes first", with real runners: x and z
    finish while y stalls after its first batch (eager final checkpoints N and N+1 both wait
    for y); y's next batch acknowledges both in one transition, writing N's _metadata fails,
    N+1 completes: the stage that finished first closes on N+1, nothing waits forever.

    z passes a batch boundary after x's finish (it acknowledges N with a pre-finish snapshot),
    so its own finish cannot join N (coalescing, core/transitions_eager.py) and triggers N+1;
    a z that finished without that boundary would join N and no N+1 would be pending. The
    hooks below fix the order the scenario needs: y and z start, y records its first batch and
    stalls, x finishes (N), z acknowledges N and finishes (N+1), y goes on."""
    shape = SHAPES["wide"]
    _env, setup = _setup(tmp_path, _plan("wide"))
    _run_stage(setup, shape, "src")
    probe = Coordinator(make_engine(setup.store_url), setup.pipeline_key)

    def gate(point: str) -> None:
        if point != "after-record-batch" or gate.passed:  # type: ignore[attr-defined]
            return
        gate.passed = True  # type: ignore[attr-defined]
        _wait_until(
            lambda: all(probe.stages()[s].lifecycle.is_finished for s in ("x", "z")),
            "x and z finished while y stalled",
        )

    gate.passed = False  # type: ignore[attr-defined]

    def after_y_and_z_started(point: str) -> None:
        """x and z start their first batch only once y and z run: a stage that has not started
        is not asked to acknowledge a checkpoint. A late y (thread scheduling under load) would
        let x's and z's final checkpoints complete without it; a late z (CI, stop 22) would not
        be asked to acknowledge x's checkpoint N, so its finish would join N and no N+1 would be
        pending. Either way the scenario would not happen."""
        if point != "before-batch" or after_y_and_z_started.seen:  # type: ignore[attr-defined]
            return
        _wait_until(
            lambda: all(
                probe.stages()[s].lifecycle is not StageLifecycle.NOT_STARTED for s in ("y", "z")
            ),
            "y and z started",
        )
        after_y_and_z_started.seen = True  # type: ignore[attr-defined]

    after_y_and_z_started.seen = False  # type: ignore[attr-defined]

    def x_finishes_after_y_stalled(point: str) -> None:
        """x finishes only once y has recorded its first batch and stalls: a y whose first
        batch came after x's finish could acknowledge N before z did, z's acknowledgement would
        then complete N with z's (healthy) storage, and the fault would hit N+1 instead."""
        after_y_and_z_started(point)
        if point == "before-finish":
            _wait_until(lambda: gate.passed, "y stalled after its first batch")  # type: ignore[attr-defined]

    def z_acknowledges_after_x_finished(point: str) -> None:
        after_y_and_z_started(point)
        if point == "before-record-batch" and not z_acknowledges_after_x_finished.done:  # type: ignore[attr-defined]
            z_acknowledges_after_x_finished.done = True  # type: ignore[attr-defined]
            _wait_until(lambda: probe.stages()["x"].lifecycle.is_finished, "x finished")

    z_acknowledges_after_x_finished.done = False  # type: ignore[attr-defined]
    injector = FaultInjector((FaultSpec("metadata-before-write", Action.EIO, stage="y"),))
    injector.stage = "y"
    faulty = FaultyStorage(setup.storage_root, injector)
    errors: list[BaseException] = []
    _threads(
        [
            lambda: _run_stage(setup, shape, "x", fault=x_finishes_after_y_stalled, errors=errors),
            lambda: _run_stage(setup, shape, "y", storage=faulty, fault=gate, errors=errors),
            lambda: _run_stage(
                setup, shape, "z", fault=z_acknowledges_after_x_finished, errors=errors
            ),
        ]
    )
    assert errors == [] and len(injector.fired) == 1
    views = probe.stages()
    checkpoints = {c.checkpoint_id: c for c in probe.checkpoints()}
    first = min(("x", "z"), key=lambda s: views[s].finish_threshold or 0)
    assert first == "x" and views["z"].finish_threshold == (views["x"].finish_threshold or 0) + 1
    threshold = views[first].finish_threshold
    assert threshold is not None
    failed, later = checkpoints[threshold], checkpoints[threshold + 1]
    assert failed.state is CheckpointState.ABORTED
    assert (failed.failure_reason or "").startswith("writing checkpoint metadata failed")
    assert later.is_completed and later.triggered_at < (later.completed_at or 0)
    assert all(views[s].lifecycle is StageLifecycle.CLOSED for s in ("x", "y", "z"))
    assert views[first].closed_checkpoint_id == threshold + 1
    closes = closes_after_later_checkpoints(
        views, list(checkpoints.values()), last_acks(probe.engine, setup.pipeline_key), 600.0
    )
    assert [(c.stage_id, c.earlier, c.closed_on, c.overlapping) for c in closes] == [
        (first, threshold, threshold + 1, True)
    ]
    probe.engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("name", RANDOM_SHAPES)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_straggler_run_closes_a_stage_out_of_order_in_every_shape(
    tmp_path: Path, name: str, seed: int
) -> None:
    """The campaign's straggler plan (holds, then a failed ``_metadata`` write) run as the
    campaign runs it (one process per stage attempt): every shape has three stages side by
    side, so each gives exactly one out-of-order completion, whichever stage straggles."""
    import random

    shape = SHAPES[name]
    sizes: dict[str, int | str] = dict.fromkeys(shape.stage_ids, 2)
    specs = straggler(random.Random(seed), shape, [], sizes)
    plan = _plan(name, attempts=[tuple(specs)], batch_sizes=sizes)
    env = Environment(tmp_path / "campaign")
    env.prepare(spark=False)
    report = execute_concurrent_run(env, plan)
    assert report.problems() == [], report.problems()
    assert report.out_of_order == 1, (report.out_of_order, report.late_closes)
    assert {f["point"] for f in report.fired} >= {"before-batch", "metadata-before-write"}


@pytest.mark.slow
def test_a_failed_stage_attempt_is_retried_while_its_siblings_run(tmp_path: Path) -> None:
    plan = _plan(
        "diamond",
        attempts=[(FaultSpec("after-finish", Action.CRASH, stage="b"),)],
        batch_sizes={"a": 1, "b": 1, "c": 1, "d": 2, "e": 2},
    )
    env = Environment(tmp_path / "campaign")
    env.prepare(spark=False)
    report = execute_concurrent_run(env, plan)
    assert report.problems() == [], report.problems()
    statuses = {o.label: o.status for o in report.attempts}
    assert statuses["r0000.b.a1"] == "crashed" and statuses["r0000.b.a2"] == "completed"
    assert {statuses[f"r0000.{s}.a1"] for s in "acde"} == {"completed"}
    assert [f["point"] for f in report.fired] == ["after-finish"]


@pytest.mark.slow
def test_a_run_that_outlives_its_timeout_is_reported_hung(tmp_path: Path) -> None:
    stall = FaultSpec("before-batch", Action.DELAY, stage="a", delay_s=5.0)
    plan = _plan("diamond", attempts=[(stall,)])
    _env, setup = _setup(tmp_path, plan)
    scheduler = StageScheduler(plan, setup, SHAPES["diamond"], run_timeout_s=1.0)
    start = time.monotonic()
    scheduler.run()
    assert time.monotonic() - start < 4.5  # it did not wait for the stalled stage
    assert scheduler.hung and scheduler.running == {}
    assert [(o.label, o.status) for o in scheduler.outcomes] == [("r0000.a.a1", "hung")]


# ------------------------------------------------------------------------------ scenarios


def _scenario(tmp_path: Path, name: str, index: int) -> tuple[Environment, RunReport]:
    env = Environment(tmp_path / "campaign")
    env.prepare(spark=False)
    plan = plan_scenarios([name], seed=5, first_index=0)[index]
    return env, execute_scenario(env, plan)


def _published_keys(env: Environment, report: RunReport) -> set[str]:
    """The keys every sink of the run holds."""
    sinks = make_sinks(env.setup(report.plan))
    try:
        return {str(k) for sink in sinks for k in sink.read_pandas()["key"]}
    finally:
        dispose_sinks(sinks)


@pytest.mark.slow
def test_a_branch_failing_for_good_lets_its_waiting_sibling_close_and_publish(
    tmp_path: Path,
) -> None:
    """The mirror case of the issue: carrier_daily fails on each of its tries (a raised error)
    while delay_windows finished and waits; delay_windows closes, publish runs and closes,
    carrier_daily publishes nothing and the run ends."""
    env, report = _scenario(tmp_path, FAILING_BRANCH, 2)
    assert report.plan.doomed == ("carrier_daily",) and report.plan.attempt_lease_s == 60.0
    assert report.problems() == [], report.problems()
    statuses = [(o.label.split(".", 1)[1], o.status) for o in report.attempts]
    assert [s for s in statuses if s[0].startswith("carrier_daily")] == [
        (f"carrier_daily.a{n}", "failed") for n in (1, 2, 3)
    ]
    assert ("delay_windows.a1", "completed") in statuses
    assert ("publish.a1", "completed") in statuses
    # at once after the first failed try (its lease of 60 s did not have to expire)
    assert report.close_latency_s is not None and report.close_latency_s < 60.0
    assert report.verdict is not None and set(report.verdict.rows) and report.verdict.lost == 0
    prefixes = {k.split(":")[0] for k in _published_keys(env, report)}
    assert prefixes == {"d"}  # delay_windows' windows only


@pytest.mark.slow
@pytest.mark.parametrize("second_run", ["refused", "take-over"])
def test_a_second_dag_run_on_the_key_is_refused_or_takes_over(
    tmp_path: Path, second_run: str
) -> None:
    _env, report = _scenario(tmp_path, TWO_RUNS, 0 if second_run == "refused" else 1)
    assert report.plan.second_run == second_run
    assert report.problems() == [], report.problems()
    first = {o.label.split(".")[-2]: o for o in report.attempts if ".run-2." not in o.label}
    second = {o.label.split(".")[-2]: o for o in report.attempts if ".run-2." in o.label}
    if second_run == "refused":
        assert {o.status for o in first.values()} == {"completed"} and len(first) == 6
        assert set(second) == {"ingest", "weather"}
        assert all("driven by DAG run 'run-1'" in (o.error or "") for o in second.values())
    else:
        assert {o.status for o in second.values()} == {"completed"} and len(second) == 6
        assert first["delay_windows"].status == "taken-over"  # fenced in its hold, not retried
        assert all(o.status in ("completed", "taken-over") for o in first.values())
    assert report.ping_pong == [] and report.republished == []
