"""Exactly-once under faults: the seeded CI fault campaign, zombie attempts, known issues.

- ``test_ci_campaign``: a seeded campaign (``faults.campaign``) of 36 runs,
  5 of them on real Spark, every fault point fired at least once, plus 42 runs on branching
  graphs (diamond, fan-out/fan-in, wide) whose stages run at the same time in their own
  processes, each run recovered and verified: every figure must be zero, per graph shape too,
  and at least one stage must have closed on a later checkpoint while an earlier one was still
  pending (FLIP-147's out-of-order completion), plus the 6 scenario runs of the branching
  example (issue 25: a branch failing on every try while its sibling waits, a second DAG run
  on the same pipeline key): zero hung runs, zero late closes, one publication per commit, no
  epoch ping-pong. The same as ``python -m faults.campaign --runs 36 --spark-runs 5
  --concurrent 42 --scenarios all --seed 20261122``.
- zombies: two attempts of one stage at once, in two OS processes. The older one stalls in a
  fault point while the newer one runs the stage to the end; then it goes on and must stop itself
  with StaleEpochError (and say so in its log), commit nothing, and leave the result exact.
- known issues (``verify.KNOWN_ISSUES``): each is reproduced deterministically and marked
  ``xfail(strict=True)``: when a fix lands the test passes, fails as XPASS, and its marker (and
  the KNOWN_ISSUES entry) must go. The reproductions of fixed issues (FC-1, FC-2, FC-3, FC-5)
  stay as regression tests: what those issues left behind now counts as leaked.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import CheckpointInfo, Coordinator
from airflow_finalckpt.core.model import CheckpointState
from airflow_finalckpt.store.engine import make_engine
from faults.campaign import CampaignResult, run_campaign
from faults.injector import FaultSpec, append_event, read_events
from faults.points import POINTS, Action
from faults.runs import Environment, RunPlan, RunReport, execute_run, stale_commits, verify_setup
from faults.verify import KNOWN_ISSUES, Verdict
from faults.worker import (
    FAKE,
    AttemptJob,
    AttemptOutcome,
    InProcessWorker,
    WorkerHandle,
    stalled_attempt_main,
)

CI_SEED = 20261122
CI_RUNS = 36
CI_SPARK_RUNS = 5
CI_CONCURRENT_RUNS = 42
CI_SCENARIOS = ("all",)
STALE_MESSAGE = (
    "stage 'publish': attempt epoch 1 is stale (current epoch is 2); a newer attempt of this "
    "stage owns it now, this attempt must stop"
)


@pytest.mark.slow
def test_ci_campaign(tmp_path: Path) -> None:
    start = time.monotonic()
    result: CampaignResult = run_campaign(
        CI_RUNS,
        CI_SEED,
        spark_runs=CI_SPARK_RUNS,
        workdir=tmp_path / "campaign",
        concurrent_runs=CI_CONCURRENT_RUNS,
        scenarios=CI_SCENARIOS,
    )
    figures = result.figures()
    print(f"\n{result.summary()}\n({time.monotonic() - start:.0f} s)")
    problems = [f"{r.plan.run_id}: {p}" for r in result.reports for p in r.problems()]
    assert not problems, "\n".join(problems)
    for name in CampaignResult.ZERO_FIGURES:
        assert figures[name] == 0, (name, figures)
    fired = result.points_fired()
    assert set(fired) == set(POINTS), f"never fired: {sorted(set(POINTS) - set(fired))}"
    actions = set(figures["faults_by_action"])
    assert {a.value for a in Action} | {"kill"} <= actions, figures["faults_by_action"]
    assert figures["faulted_runs"] >= 30
    assert figures["faulted_spark_runs"] >= CI_SPARK_RUNS
    assert set(figures["known_issues"]) <= set(KNOWN_ISSUES)
    assert result.ok
    shapes = figures["shapes"]
    assert set(shapes) == {"diamond", "fan", "wide"}, shapes
    for name, shape in shapes.items():
        assert shape["runs"] == CI_CONCURRENT_RUNS // 3, (name, shape)
        assert shape["faulted"] >= shape["runs"] * 2 // 3, (name, shape)
        assert shape["points"] >= 12, (name, shape)
        zeros = {k: shape[k] for k in CampaignResult.ZERO_FIGURES if k in shape}
        assert set(zeros.values()) == {0}, (name, zeros)
    # FLIP-147's out-of-order completion, forced by the straggler holds, in every shape
    assert all(shape["out_of_order"] >= 1 for shape in shapes.values()), shapes
    scenarios = figures["scenarios"]
    assert {name: f["runs"] for name, f in scenarios.items()} == {
        "failing-branch": 4,
        "two-runs": 2,
    }
    for name, scenario in scenarios.items():
        zeros = {k: scenario[k] for k in CampaignResult.ZERO_FIGURES if k in scenario}
        assert set(zeros.values()) == {0} and scenario["unrecovered"] == 0, (name, scenario)
    assert scenarios["two-runs"]["refused_attempts"] >= 2
    assert scenarios["two-runs"]["taken_over_attempts"] >= 1
    assert scenarios["failing-branch"]["max_close_latency_s"] is not None


def test_command_prints_one_summary_line_and_writes_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from faults.campaign import main

    report = tmp_path / "report.json"
    assert main(["--runs", "3", "--seed", "5", "--report", str(report)]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("fault campaign seed=5 store=sqlite: 3 runs (3 fake, 0 spark)")
    assert "lost 0, duplicated 0" in line
    data = json.loads(report.read_text())
    assert data["ok"] and data["summary"] == line and len(data["runs"]) == 3
    assert set(data["points"]) == set(POINTS)
    assert all(run["verdict"]["rows"] for run in data["runs"])


# ------------------------------------------------------------------------------ zombies


@dataclass
class ZombieRun:
    a: AttemptOutcome
    b: AttemptOutcome
    log_a: str
    events: list[dict[str, Any]]
    verdict: Verdict


def _zombie(tmp_path: Path, point: str, commit_mode: str = "progressive") -> ZombieRun:
    """Attempt 1 (process A) runs the pipeline and stalls at ``point`` in stage publish;
    attempt 2 (process B) runs the pipeline to the end meanwhile; then A goes on."""
    env = Environment(tmp_path / "zombie", gc_grace_s=None)  # production GC settings
    env.prepare(spark=False)
    plan = RunPlan.single(0, commit_mode=commit_mode)
    setup = env.setup(plan)
    ctx = multiprocessing.get_context("spawn")
    stalled, resume = ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    spec = FaultSpec(point, Action.ZOMBIE, stage="publish")
    job_a = AttemptJob(setup, 1, (spec.to_dict(),))
    process_a = ctx.Process(target=stalled_attempt_main, args=(job_a, stalled, resume, send))
    process_a.start()
    newer = WorkerHandle(FAKE, str(tmp_path / "worker.out"))
    try:
        assert stalled.wait(120), "attempt 1 never reached the fault point"
        takeover = {"label": job_a.label, "stage": "publish", "t": time.time()}
        append_event(setup.events_path, {"event": "successor-start", **takeover})
        outcome_b = newer.run(AttemptJob(setup, 2), timeout_s=180)
        resume.set()
        assert receive.poll(180), "attempt 1 never ended"
        outcome_a: AttemptOutcome = receive.recv()
    finally:
        resume.set()
        newer.close()
        process_a.join(30)
        if process_a.is_alive():
            process_a.kill()
    lines = Path(setup.log_path).read_text().splitlines()
    return ZombieRun(
        a=outcome_a,
        b=outcome_b,
        log_a="\n".join(line for line in lines if f" {job_a.label} " in line),
        events=read_events(setup.events_path),
        verdict=verify_setup(env, plan, setup),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "commit_mode"),
    [
        ("before-ack", "progressive"),  # its batch is sealed in the sinks, not recorded
        ("before-commit", "final"),  # its epoch was checked just before: the commit races
        ("before-close", "progressive"),  # it committed everything, it is about to close
    ],
)
def test_zombie_attempt_stops_itself_and_only_the_newest_epoch_commits(
    tmp_path: Path, point: str, commit_mode: str
) -> None:
    run = _zombie(tmp_path, point, commit_mode)
    assert run.b.status == "completed", run.b
    assert run.a.status == "stale" and run.a.error_type == "StaleEpochError", run.a
    assert run.a.error == STALE_MESSAGE
    assert "stage publish: attempt epoch 1 stops itself, epoch 2 owns the stage now" in run.log_a
    assert STALE_MESSAGE in run.log_a
    assert stale_commits(run.events) == []
    commits_a = [
        e for e in run.events if e.get("event") == "sink-commit" and e["label"] == "r0000.a1"
    ]
    if point == "before-commit":
        # A reached the sink after B had committed: its commit was a no-op, then it was fenced
        assert commits_a and not any(e["new"] for e in commits_a)
    assert run.verdict.problems() == [] and run.verdict.known == {}


@pytest.mark.slow
def test_zombie_that_staged_a_batch_before_the_takeover_leaves_nothing_staged(
    tmp_path: Path,
) -> None:
    """FC-3 (fixed): the zombie sealed its batch after the newer attempt's orphan sweep; when
    the coordinator refuses to record it (StaleEpochError) the zombie aborts it itself."""
    run = _zombie(tmp_path, "mid-batch")
    assert run.a.status == "stale" and run.a.error_type == "StaleEpochError", run.a
    assert run.b.status == "completed", run.b
    assert run.verdict.problems() == [], run.verdict.problems()
    assert run.verdict.known == {}, run.verdict.known
    assert "aborted transaction publish." in run.log_a and "this attempt (epoch 1) is stale" in (
        run.log_a
    )


# ------------------------------------------------------------------------------ known issues


def _run(
    tmp_path: Path,
    attempts: list[tuple[FaultSpec, ...]],
    *,
    gc_grace_s: float | None = 0.0,
    **config: Any,
) -> RunReport:
    env = Environment(tmp_path / "known", gc_grace_s=gc_grace_s)
    env.prepare(spark=False)
    plan = RunPlan.single(0, attempts, **config)
    report = execute_run(env, plan, InProcessWorker())
    assert report.completed and report.fired, report.to_dict()
    assert report.problems() == [], report.problems()  # exactly once holds regardless
    return report


def _checkpoints(tmp_path: Path) -> tuple[dict[int, CheckpointInfo], list[str]]:
    """The run's checkpoints in the coordinator, and the ``chk-<id>`` directories in storage
    (of ``_run`` and the hand-written runs below: run r0000 under ``tmp_path / "known"``)."""
    run_dir = tmp_path / "known" / "r0000"
    engine = make_engine(f"sqlite:///{run_dir / 'store.db'}")
    try:
        infos = {c.checkpoint_id: c for c in Coordinator(engine, "faults.r0000").checkpoints()}
    finally:
        engine.dispose()
    pipeline_dir = run_dir / "checkpoints" / "faults.r0000"
    return infos, sorted(p.name for p in pipeline_dir.iterdir() if p.name.startswith("chk-"))


@pytest.mark.parametrize(
    ("point", "action"),
    [
        ("metadata-after-write", Action.EIO),  # _metadata in place, then the write fails
        ("metadata-mid-write", Action.EIO),  # the rename fails: an empty chk-<id>/ is left
        ("metadata-mid-write", Action.ENOSPC),
    ],
)
def test_a_failed_metadata_write_leaves_no_checkpoint_directory(
    tmp_path: Path, point: str, action: Action
) -> None:
    """FC-1 (fixed): the aborted checkpoint's directory is removed once the abort committed."""
    report = _run(tmp_path, [(FaultSpec(point, action),)])
    assert report.known_issues() == {}
    infos, dirs = _checkpoints(tmp_path)
    failed = [
        c
        for c in infos.values()
        if c.state is CheckpointState.ABORTED
        and "writing checkpoint metadata failed" in (c.failure_reason or "")
    ]
    assert failed, "the fault did not abort a checkpoint"
    assert all(f"chk-{c.checkpoint_id}" not in dirs for c in failed), dirs
    retained = {f"chk-{c.checkpoint_id}" for c in infos.values() if c.state.value == "COMPLETED"}
    assert set(dirs) == retained


@pytest.mark.slow
def test_a_crash_after_the_metadata_write_leaves_no_phantom_checkpoint(tmp_path: Path) -> None:
    """FC-1 (fixed): the crash rolls the completion back (the id too); the id's leftover
    directory is replaced when the id is completed again instead of failing that checkpoint."""
    env = Environment(tmp_path / "known")
    env.prepare(spark=False)
    plan = RunPlan.single(0, [(FaultSpec("metadata-after-write", Action.CRASH, stage="agg"),)])
    worker = WorkerHandle(FAKE, str(tmp_path / "worker.out"))
    try:
        report = execute_run(env, plan, worker)
    finally:
        worker.close()
    assert report.completed and report.attempts[0].status == "crashed"
    assert report.problems() == []
    assert report.known_issues() == {}
    infos, dirs = _checkpoints(tmp_path)
    assert not [c for c in infos.values() if "different metadata" in (c.failure_reason or "")]
    retained = {f"chk-{c.checkpoint_id}" for c in infos.values() if c.state.value == "COMPLETED"}
    assert set(dirs) == retained


@pytest.mark.parametrize("point", ["metadata-before-discard", "metadata-mid-discard"])
def test_an_interrupted_discard_is_finished_later(tmp_path: Path, point: str) -> None:
    """FC-2 (fixed): the next retention pass (or close) deletes what the failed one left."""
    report = _run(tmp_path, [(FaultSpec(point, Action.EIO),)], retain_checkpoints=1)
    assert report.known_issues() == {}
    infos, dirs = _checkpoints(tmp_path)
    assert any(c.state is CheckpointState.DISCARDED for c in infos.values())
    retained = {f"chk-{c.checkpoint_id}" for c in infos.values() if c.state.value == "COMPLETED"}
    assert set(dirs) == retained


@pytest.mark.parametrize("point", ["after-start-attempt", "before-batch", "after-record-batch"])
def test_a_zombie_stops_with_stale_epoch_before_doing_more_work(tmp_path: Path, point: str) -> None:
    """FC-4: a zombie stops at its next batch boundary, or, if it stalled inside a batch whose
    inputs garbage collection removed meanwhile, still with StaleEpochError."""
    # garbage collection without a grace period: its inputs are gone when the zombie goes on
    spec = FaultSpec(point, Action.ZOMBIE, stage="publish")
    report = _run(tmp_path, [(spec,)])
    assert report.attempts[0].error_type == "StaleEpochError", report.attempts[0]
    assert report.problems() == [] and report.known_issues() == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [
        # checkpoint 1's write is cut short before its rename; the id is used again and retained
        FaultSpec("metadata-mid-write", Action.CRASH),
        # an output part's write is cut short; the batch is redone and its part is kept
        FaultSpec("state-mid-write", Action.CRASH, stage="gen"),
    ],
    ids=["metadata", "state"],
)
def test_a_crash_inside_an_atomic_write_leaves_no_temporary_file(
    tmp_path: Path, spec: FaultSpec
) -> None:
    """FC-5 (fixed): a completion replaces its id's leftover directory; garbage collection
    deletes stale temporary files inside what it keeps."""
    env = Environment(tmp_path / "known")
    env.prepare(spark=False)
    plan = RunPlan.single(0, [(spec,)], retain_checkpoints=1000)
    worker = WorkerHandle(FAKE, str(tmp_path / "worker.out"))
    try:
        report = execute_run(env, plan, worker)
    finally:
        worker.close()
    assert report.completed and report.attempts[0].status == "crashed"
    assert report.problems() == []
    assert report.known_issues() == {}
