"""Scenario runs of the branching example's graph (``faults.shapes`` "branching"): who waits for
whom when a branch fails for good, and who drives when two DAG runs share a pipeline key
(issue 25). Driven by the concurrent campaign's scheduler (:mod:`faults.concurrent`: one OS
process per stage attempt, retries, the real ``FinalCheckpointTrigger``) and verified like its
runs, plus what each scenario promises:

- ``failing-branch``: one branch's stage (``delay_windows``, or in the mirror case
  ``carrier_daily``) fails on every try (a raised error: its failure path releases its lease; or
  a SIGKILL: its lease expires) while the other branch finished and waits at its final
  checkpoint. Holds order it: the sibling's first batch waits until the failing stage started
  (so its eager final checkpoint must wait for that stage), the failing stage waits until the
  sibling finished, then fails before its first batch, never acknowledging. The waiting branch
  must close, commit and publish exactly once (and in the mirror case ``publish`` must run and
  close) within the documented bound after the failing stage's last try ended: at once (plus
  ``LATE_GRACE_S``) for a raised error, ``attempt_lease_s`` (plus the grace) for a SIGKILL. The
  failing branch publishes nothing, and the run ends: nothing hangs.
- ``two-runs``: while DAG run 1's ``delay_windows`` attempt runs (held before its first batch
  until the second run ended), a continuation (DAG run 2, same pipeline key) starts its tasks.
  Without ``take_over`` every one of them is refused (``PipelineDrivenError`` naming run 1) and
  run 1 completes; with it, run 2 drives the pipeline to the end and run 1's attempts fail for
  good, fenced or refused. Either way: no epoch ping-pong (no attempt of run 1 takes an epoch
  once run 2 drives, no attempt of the driving run is fenced by the other), one publication
  per commit over both runs.

``python -m faults.campaign --runs 0 --scenarios all`` runs them.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from typing import Any

from faults.concurrent import (
    DAG_ID,
    DAG_RUN,
    RUN_TIMEOUT_S,
    StageScheduler,
    closed_stages,
    publication_problems,
)
from faults.injector import FaultSpec, append_event, read_events
from faults.points import Action
from faults.runs import Environment, RunPlan, RunReport, _classify, stale_commits, verify_against
from faults.shapes import SHAPES
from faults.worker import CONCURRENT, AttemptOutcome

FAILING_BRANCH = "failing-branch"
TWO_RUNS = "two-runs"
NAMES = (FAILING_BRANCH, TWO_RUNS)
SHAPE = "branching"
#: The two branches after ``enrich``: a stage of one fails for good while the other waits.
BRANCHES = {"delay_windows": "carrier_daily", "carrier_daily": "delay_windows"}
#: Tries of the failing stage (the issue's trial: killed on each of its 3 tries).
TRIES = 3
#: A SIGKILLed attempt stops blocking after its lease: short here so the runs stay short.
CRASH_LEASE_S = 3.0
#: What the bound allows on top of the documented latency (one trigger poll, then commit and
#: close): the processes' own start, exit and reporting on a loaded 2-core machine.
LATE_GRACE_S = 15.0
#: The longest a hold waits for its condition.
HOLD_S = 60.0
REFUSED = "refused"
TAKE_OVER = "take-over"
SECOND_RUN = "run-2"
#: Marker event that releases run 1's held attempt once run 2 ended.
SECOND_ENDED = "second-run-ended"
#: The stage run 1 holds while run 2 starts.
HELD = "delay_windows"


def expand(names: Sequence[str]) -> list[str]:
    """Scenario names, ``all`` for every one; ValueError naming the unknown ones."""
    wanted = [n for name in names for n in (NAMES if name == "all" else (name,))]
    unknown = sorted(set(wanted) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(NAMES)}, all")
    return list(dict.fromkeys(wanted))


def _hold(stage: str, *until: str) -> FaultSpec:
    return FaultSpec("before-batch", Action.DELAY, stage=stage, delay_s=HOLD_S, until=until)


def _config(rng: random.Random) -> dict[str, Any]:
    shape = SHAPES[SHAPE]
    return {
        "batch_sizes": {sid: rng.choice((1, 2, "auto")) for sid in shape.stage_ids},
        "commit_mode": rng.choice(("progressive", "final")),
        "checkpoint_interval_s": rng.choice((0.0, 3600.0)),
        "retain_checkpoints": rng.choice((1, 2, 3)),
        # no checkpoint timeout while the sibling waits: only the failure may end the wait
        "checkpoint_timeout_s": 600.0,
    }


def failing_branch_plan(index: int, doomed: str, action: Action, rng: random.Random) -> RunPlan:
    """``doomed`` fails before its first batch on each of its ``TRIES`` tries, after its
    sibling finished (raised: ``action`` RAISE, SIGKILLed: CRASH)."""
    sibling = BRANCHES[doomed]
    fail = FaultSpec("before-batch", action, stage=doomed, nth=1)
    first = (_hold(sibling, f"{doomed}:started"), _hold(doomed, f"{sibling}:finished"), fail)
    later = (_hold(doomed, f"{sibling}:finished"), fail)
    return RunPlan(
        index=index,
        kind=CONCURRENT,
        purpose=f"scenario {FAILING_BRANCH}: {doomed} {action.value} on every try",
        attempts=(first, *[later] * (TRIES - 1)),
        kills=(),
        shape=SHAPE,
        scenario=FAILING_BRANCH,
        doomed=(doomed,),
        attempt_lease_s=CRASH_LEASE_S if action is Action.CRASH else 60.0,
        **_config(rng),
    )


def two_runs_plan(index: int, second_run: str, rng: random.Random) -> RunPlan:
    """Run 1 holds ``HELD`` before its first batch until run 2 ended; run 2 starts meanwhile,
    with ``{"take_over": true}`` if ``second_run`` is TAKE_OVER."""
    return RunPlan(
        index=index,
        kind=CONCURRENT,
        purpose=f"scenario {TWO_RUNS}: the second run {second_run}",
        attempts=((_hold(HELD, f"@{SECOND_ENDED}:finished"),),),
        kills=(),
        shape=SHAPE,
        scenario=TWO_RUNS,
        second_run=second_run,
        **_config(rng),
    )


def plan_scenarios(names: Sequence[str], seed: int, first_index: int) -> list[RunPlan]:
    """The scenario runs: ``failing-branch`` 4 (each branch, raised and SIGKILLed),
    ``two-runs`` 2 (refused, taken over); configurations drawn from ``seed``."""
    rng = random.Random(seed * 7 + 25)
    plans: list[RunPlan] = []
    for name in expand(names):
        if name == FAILING_BRANCH:
            for doomed in BRANCHES:
                for action in (Action.RAISE, Action.CRASH):
                    plans.append(failing_branch_plan(first_index + len(plans), doomed, action, rng))
        else:
            for second in (REFUSED, TAKE_OVER):
                plans.append(two_runs_plan(first_index + len(plans), second, rng))
    return plans


# ------------------------------------------------------------------------------ execution


def execute_scenario(env: Environment, plan: RunPlan) -> RunReport:
    """Run a scenario plan to its end (or the run timeout), then verify it."""
    start = time.monotonic()
    if plan.scenario == FAILING_BRANCH:
        report = _failing_branch(env, plan)
    elif plan.scenario == TWO_RUNS:
        report = _two_runs(env, plan)
    else:
        raise ValueError(f"not a scenario plan: {plan.purpose!r}")
    report.seconds = time.monotonic() - start
    return report


def _unexpected(outcomes: Sequence[AttemptOutcome], allowed: Any = None) -> list[str]:
    found = []
    for outcome in outcomes:
        if allowed is not None and allowed(outcome):
            continue
        _issue, problem = _classify(outcome, kill_planned=False)
        if problem is not None:
            found.append(problem)
    return found


def _finish(
    report: RunReport, env: Environment, plan: RunPlan, events: list[dict[str, Any]]
) -> None:
    """Verify the run's sinks, store and storage; a failed branch's stages stay unclosed."""
    from faults.fake import KEY_COLUMNS

    setup = env.setup(plan)
    shape = SHAPES[SHAPE]
    failed = {sid for d in plan.doomed for sid in (d, *shape.descendants(d))}
    report.stale_commits = stale_commits(events)
    report.verdict = verify_against(setup, env.expected(plan), KEY_COLUMNS)
    report.verdict.unclosed = [s for s in report.verdict.unclosed if s not in failed]
    report.republished = publication_problems(events, closed_stages(setup))


def _failing_branch(env: Environment, plan: RunPlan) -> RunReport:
    setup = env.setup(plan)
    shape = SHAPES[SHAPE]
    [doomed] = plan.doomed
    sibling = BRANCHES[doomed]
    scheduler = StageScheduler(plan, setup, shape)
    scheduler.run()
    report = RunReport(plan, hung=scheduler.hung)
    events = read_events(setup.events_path)
    _attach_faults(scheduler.outcomes, events)
    report.attempts = scheduler.outcomes
    report.unexpected = _unexpected(scheduler.outcomes)
    healthy = set(shape.stage_ids) - {doomed, *shape.descendants(doomed)}
    report.completed = healthy <= scheduler.closed and scheduler.gave_up == [doomed]
    if scheduler.started[doomed] != TRIES:
        report.unexpected.append(f"{doomed} ran {scheduler.started[doomed]} tries, not {TRIES}")
    _finish(report, env, plan, events)
    # The bound (docs/protocol.md): a raised error releases the attempt's lease, so the sibling
    # closes at once after the first failure; a SIGKILLed try holds the stage until its lease
    # expires, and each retry renews it: the sibling closes within the lease of the last try.
    ends = sorted(t for label, t in scheduler.ended_at.items() if f".{doomed}." in label)
    closes = [t for label, t in scheduler.ended_at.items() if f".{sibling}." in label]
    if ends and closes and report.completed:
        crashed = plan.attempt_lease_s == CRASH_LEASE_S
        since = ends[-1] if crashed else ends[0]
        latency = max(closes) - since
        report.close_latency_s = round(latency, 2)
        bound = (plan.attempt_lease_s if crashed else 0.0) + LATE_GRACE_S
        if latency > bound:
            which = "last" if crashed else "first"
            report.late.append(
                f"{sibling} closed {latency:.1f} s after the {which} failed try of {doomed} "
                f"(bound {bound:.0f} s)"
            )
    return report


def _attach_faults(outcomes: Sequence[AttemptOutcome], events: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        outcome.fired = [
            e for e in events if e.get("event") == "fault" and e.get("label") == outcome.label
        ]


def _two_runs(env: Environment, plan: RunPlan) -> RunReport:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.store.engine import make_engine

    setup = env.setup(plan)
    shape = SHAPES[SHAPE]
    first = StageScheduler(plan, setup, shape)
    quiet = dataclasses.replace(plan, attempts=(), kills=())
    second = StageScheduler(
        quiet, setup, shape, dag_run=SECOND_RUN, take_over=plan.second_run == TAKE_OVER
    )
    held = f"{plan.run_id}.{HELD}.a1"
    started = ended = False
    drives_at: float | None = None
    report = RunReport(plan)
    engine = make_engine(setup.store_url)
    reader = Coordinator(engine, setup.pipeline_key)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while True:
            going = first.step()
            if not started:
                # run 2 starts once run 1's attempt of HELD is alive in its hold
                events = read_events(setup.events_path)
                started = any(e.get("event") == "fault" and e.get("label") == held for e in events)
            else:
                going = second.step() or going
                if drives_at is None and reader.driver() == (DAG_ID, SECOND_RUN):
                    drives_at = time.monotonic()
                if not ended and not second.running and not second.ready():
                    ended = True  # releases run 1's hold
                    append_event(setup.events_path, {"event": "marker", "name": SECOND_ENDED})
            if not going and ended:
                break
            if time.monotonic() > deadline:
                report.hung = True
                break
            time.sleep(0.02)
    finally:
        first.stop()
        second.stop()
        engine.dispose()
    events = read_events(setup.events_path)
    outcomes = first.outcomes + second.outcomes
    _attach_faults(outcomes, events)
    report.attempts = outcomes
    driving = second if plan.second_run == TAKE_OVER else first
    other = first if driving is second else second
    report.completed = driving.closed == set(shape.stage_ids)
    # the run that does not drive ends its attempts for good (refused or fenced), not retried
    report.unexpected = _unexpected(
        outcomes,
        allowed=lambda o: o in other.outcomes and o.status in ("refused", "taken-over"),
    )
    if plan.second_run == REFUSED:
        for outcome in second.outcomes:
            if outcome.status != "refused" or f"DAG run {DAG_RUN!r}" not in (outcome.error or ""):
                report.unexpected.append(
                    f"{outcome.label}: not refused naming {DAG_RUN!r}: {outcome.status} "
                    f"{outcome.error}"
                )
    report.ping_pong = _ping_pong(first, second, driving, drives_at)
    _finish(report, env, plan, events)
    return report


def _ping_pong(
    first: StageScheduler,
    second: StageScheduler,
    driving: StageScheduler,
    drives_at: float | None,
) -> list[str]:
    """Attempts that took the epoch back and forth: one of the driving run fenced or refused,
    or one of run 1 launched after run 2 drove that did not end refused."""
    found = [
        f"{o.label} of the driving run ended {o.status}: {o.error}"
        for o in driving.outcomes
        if o.status in ("stale", "taken-over", "refused")
    ]
    if driving is second and drives_at is not None:
        for outcome in first.outcomes:
            launched = first.launched_at.get(outcome.label, 0.0)
            if launched > drives_at and outcome.status != "refused":
                found.append(
                    f"{outcome.label} of run 1 started after run 2 took over and ended "
                    f"{outcome.status}"
                )
    return found


# ------------------------------------------------------------------------------ figures


def scenario_figures(reports: Sequence[RunReport]) -> dict[str, dict[str, Any]]:
    """Per scenario: runs, attempts, how the runs ended, the healthy branch's close latency
    after the failure (max, s) and the figures that must be zero."""
    figures: dict[str, dict[str, Any]] = {}
    for report in reports:
        name = report.plan.scenario
        if name is None:
            continue
        f = figures.setdefault(
            name,
            {
                "runs": 0,
                "attempts": 0,
                "refused_attempts": 0,
                "taken_over_attempts": 0,
                "max_close_latency_s": None,
                "lost": 0,
                "duplicated": 0,
                "wrong": 0,
                "leaked": 0,
                "pending": 0,
                "unrecovered": 0,
                "hung": 0,
                "late": 0,
                "republished": 0,
                "ping_pong": 0,
                "unexpected": 0,
            },
        )
        f["runs"] += 1
        f["attempts"] += len(report.attempts)
        f["refused_attempts"] += sum(1 for a in report.attempts if a.status == "refused")
        f["taken_over_attempts"] += sum(1 for a in report.attempts if a.status == "taken-over")
        if report.close_latency_s is not None:
            f["max_close_latency_s"] = max(f["max_close_latency_s"] or 0.0, report.close_latency_s)
        v = report.verdict
        if v is not None:
            f["lost"] += v.lost
            f["duplicated"] += v.duplicated
            f["wrong"] += v.wrong
            f["leaked"] += len(v.leaked)
            f["pending"] += len(v.pending)
        f["unrecovered"] += int(not report.completed)
        f["hung"] += int(report.is_hung)
        f["late"] += len(report.late)
        f["republished"] += len(report.republished)
        f["ping_pong"] += len(report.ping_pong)
        f["unexpected"] += len(report.unexpected)
    return dict(sorted(figures.items()))


def scenario_lines(figures: dict[str, dict[str, Any]]) -> list[str]:
    """One summary line per scenario."""
    lines = []
    for name, f in figures.items():
        latency = f["max_close_latency_s"]
        waited = (
            f", healthy branch closed at most {latency:.1f} s after the failure"
            if latency is not None
            else ""
        )
        lines.append(
            f"scenario {name}: {f['runs']} runs, {f['attempts']} attempts "
            f"({f['refused_attempts']} refused, {f['taken_over_attempts']} taken over){waited} | "
            f"lost {f['lost']}, duplicated {f['duplicated']}, wrong {f['wrong']}, "
            f"leaked {f['leaked']}, pending {f['pending']}, unrecovered {f['unrecovered']}, "
            f"hung runs {f['hung']}, late {f['late']}, publications off {f['republished']}, "
            f"ping-pong {f['ping_pong']}, unexpected {f['unexpected']}"
        )
    return lines
