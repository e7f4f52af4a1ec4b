"""Pure parts of the concurrent fault campaign: shapes, plans and the out-of-order count.

``closes_after_later_checkpoints`` is what the campaign reports as out-of-order completions; it
must tell a checkpoint that was still pending when the later one was triggered (FLIP-147's "43
completes first") from one that had already failed before (a plain retry).
"""

from __future__ import annotations

import random

import pytest

from airflow_finalckpt.coordination import CheckpointInfo, StageView
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    StageLifecycle,
    StageSnapshot,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan
from faults.concurrent import (
    CONCURRENT,
    ShapeCoverage,
    closes_after_later_checkpoints,
    plan_concurrent,
    stage_points,
    straggler,
)
from faults.points import POINTS, Action
from faults.shapes import PUBLISHING, RANDOM_SHAPES, SHAPES, reference_rows

EMPTY_PLAN = CheckpointPlan((), (), (), ())


def _checkpoint(
    cid: int, triggered: float, completed: float | None = None, reason: str | None = None
) -> CheckpointInfo:
    state = CheckpointState.COMPLETED if completed is not None else CheckpointState.ABORTED
    return CheckpointInfo(
        cid,
        CheckpointKind.CHECKPOINT,
        TriggerReason.EAGER_FINAL,
        state,
        EMPTY_PLAN,
        0,
        triggered,
        completed,
        reason,
        None,
        None,
    )


def _closed(threshold: int, closed_on: int) -> StageView:
    return StageView(
        "x", StageLifecycle.CLOSED, 1, 2, StageSnapshot(), threshold, StageSnapshot(), closed_on
    )


@pytest.mark.parametrize(
    ("reason", "acks", "overlapping"),
    [
        ("subsumed by checkpoint 43", {}, True),
        ("writing checkpoint metadata failed: EIO", {42: 10.5}, True),  # failed in 43's ack
        ("writing checkpoint metadata failed: EIO", {42: 10.1}, False),  # failed before 43
        ("timed out after 1 s", {}, True),  # 10.0 + 1 s >= 10.2: still pending at 43
    ],
)
def test_a_close_past_a_failed_candidate_is_out_of_order_only_if_it_overlapped(
    reason: str, acks: dict[int, float], overlapping: bool
) -> None:
    checkpoints = [_checkpoint(42, 10.0, reason=reason), _checkpoint(43, 10.2, completed=10.6)]
    [close] = closes_after_later_checkpoints({"x": _closed(42, 43)}, checkpoints, acks, 1.0)
    assert (close.stage_id, close.threshold, close.earlier, close.closed_on) == ("x", 42, 42, 43)
    assert close.overlapping is overlapping


def test_a_close_on_the_first_candidate_is_in_order() -> None:
    checkpoints = [_checkpoint(42, 10.0, completed=10.1), _checkpoint(43, 10.2, completed=10.3)]
    assert closes_after_later_checkpoints({"x": _closed(42, 42)}, checkpoints, {}, 1.0) == []


def test_every_planned_fault_is_at_a_point_its_stage_passes() -> None:
    plans = plan_concurrent(60, seed=4, first_index=100)
    assert [p.run_id for p in plans[:2]] == ["r0100", "r0101"]
    assert {p.shape for p in plans} == set(RANDOM_SHAPES)
    assert {p.kind for p in plans} == {CONCURRENT}
    for plan in plans:
        shape = SHAPES[plan.shape or ""]
        for attempt in plan.attempts:
            for spec in attempt:
                assert spec.stage in shape.stage_ids
                assert spec.action in POINTS[spec.point].actions
                role = shape.stage(spec.stage or "").role
                if POINTS[spec.point].sink_stage_only:
                    assert role in PUBLISHING, spec
    assert plan_concurrent(60, seed=4, first_index=100) == plans  # deterministic per seed


def test_stage_points_leave_out_what_a_stage_never_passes() -> None:
    shape = SHAPES["fan"]
    assert "sink-mid-write" not in stage_points(shape, "wa")
    assert "sink-mid-write" in stage_points(shape, "pa")
    assert "state-mid-write" not in stage_points(shape, "pa")
    assert "sink-before-abort" not in stage_points(shape, "pa")  # needs an orphan first


def test_coverage_arms_every_point_of_a_stage_before_repeating_one() -> None:
    coverage = ShapeCoverage(random.Random(1))
    shape = SHAPES["diamond"]
    points = stage_points(shape, "d")
    drawn = [coverage.next_point(shape, "d") for _ in points]
    assert sorted(drawn) == sorted(points)


@pytest.mark.parametrize("name", RANDOM_SHAPES)
def test_every_random_shape_has_three_stages_side_by_side(name: str) -> None:
    """FLIP-147's out-of-order completion needs three running stages (docs/guarantees.md):
    siblings with the same upstream stages, which Airflow starts at once."""
    shape = SHAPES[name]
    assert len(shape.parallel) >= 3
    assert len({shape.stage(sid).upstream for sid in shape.parallel}) == 1
    assert not any(shape.ancestors(sid) & set(shape.parallel) for sid in shape.parallel)


@pytest.mark.parametrize("name", RANDOM_SHAPES)
def test_a_straggler_run_orders_three_parallel_stages_and_fails_the_last_ones_completion(
    name: str,
) -> None:
    shape = SHAPES[name]
    sizes = dict.fromkeys(shape.stage_ids, 2)
    specs = straggler(random.Random(3), shape, [], sizes)
    [write] = [s for s in specs if s.point == "metadata-before-write"]
    slow = write.stage
    assert write.nth == 1 and write.action in (Action.EIO, Action.ENOSPC)
    upstream = {up for sid in shape.parallel for up in shape.stage(sid).upstream}
    assert sizes[slow] == 1 and all(sizes[up] == 1 for up in upstream)
    assert sorted(sizes[s] for s in shape.parallel) == [1, 4, 4]
    holds = {s.stage: set(s.until) for s in specs if s.action is Action.DELAY}
    assert all(s.point == "before-batch" and s.nth == 1 for s in specs if s.until)
    [a] = [sid for sid, until in holds.items() if all(c.endswith(":started") for c in until)]
    [b] = set(shape.parallel) - {a, slow}
    assert holds == {
        a: {f"{b}:started", f"{slow}:started"},  # N waits for b and the straggler
        b: {f"{a}:finished"},  # b acknowledges N at a batch boundary: its finish triggers N+1
        slow: {f"{a}:finished", f"{b}:finished"},  # then it answers N and N+1 at once
    }


@pytest.mark.parametrize("name", RANDOM_SHAPES)
def test_straggler_runs_never_time_out_their_pending_checkpoint(name: str) -> None:
    plans = plan_concurrent(60, 4, 0, shapes=(name,))
    straggling = [p for p in plans if any(s.until for a in p.attempts for s in a)]
    assert 10 <= len(straggling) < 60
    assert {p.checkpoint_timeout_s for p in straggling} == {600.0}
    assert 1.0 in {p.checkpoint_timeout_s for p in plans if p not in straggling}


def test_the_reference_has_every_branch_with_its_own_key_prefix() -> None:
    for name, prefixes in {
        "diamond": {"b", "c", "e"},
        "fan": {"a", "b"},
        "wide": {"x", "y", "z"},
        "branching": {"d", "c"},
    }.items():
        rows = reference_rows(SHAPES[name])
        assert {r["key"].split(":")[0] for r in rows} == prefixes
        assert len({(r["key"], r["window_start"]) for r in rows}) == len(rows)


def test_a_branch_that_failed_for_good_publishes_nothing_in_the_reference() -> None:
    shape = SHAPES["branching"]
    prefixes = {
        failed: {r["key"].split(":")[0] for r in reference_rows(shape, failed=(failed,))}
        for failed in ("delay_windows", "publish", "carrier_daily", "enrich")
    }
    # delay_windows' windows reach the sinks through publish: either failing drops them
    assert prefixes == {
        "delay_windows": {"c"},
        "publish": {"c"},
        "carrier_daily": {"d"},
        "enrich": set(),
    }
    assert shape.descendants("enrich") == {"delay_windows", "publish", "carrier_daily"}


def test_random_branching_runs_arm_sink_points_in_both_publishing_stages() -> None:
    plans = plan_concurrent(40, seed=9, first_index=0, shapes=("branching",))
    stages = {
        spec.stage
        for plan in plans
        for attempt in plan.attempts
        for spec in attempt
        if POINTS[spec.point].sink_stage_only
    }
    assert stages == {"publish", "carrier_daily"}
