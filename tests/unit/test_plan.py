"""The checkpoint plan calculator.

The scenarios port Flink's DefaultCheckpointPlanCalculatorTest to stages: Flink's finished
subtasks become finished stages (FINISHED, i.e. waiting for the final checkpoint, or CLOSED),
its partially finished vertices become stages with finished splits.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.errors import InvalidGraphError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import StageLifecycle, StageProgress, StageStatus
from airflow_finalckpt.core.plan import (
    CheckpointPlan,
    calculate_plan,
    checkpoint_status,
    lifecycle_status,
    plan_of_lifecycles,
)

RUNNING = StageProgress(lifecycle=StageLifecycle.RUNNING)
SUSPENDED = StageProgress(lifecycle=StageLifecycle.SUSPENDED)
FINISHED = StageProgress(lifecycle=StageLifecycle.FINISHED)
CLOSED = StageProgress(lifecycle=StageLifecycle.CLOSED)
NOT_STARTED = StageProgress(lifecycle=StageLifecycle.NOT_STARTED)


def running_with(*splits: str) -> StageProgress:
    return StageProgress(lifecycle=StageLifecycle.RUNNING, finished_splits=frozenset(splits))


def graph_of(edges: Mapping[str, tuple[str, ...]]) -> StageGraph:
    """Stage id -> its upstream stage ids."""
    return StageGraph.build(Stage(sid, ups) for sid, ups in edges.items())


def two_sources_one_join() -> StageGraph:
    """src_a, src_b -> join -> sink."""
    return graph_of({"src_a": (), "src_b": (), "join": ("src_a", "src_b"), "sink": ("join",)})


# -- ported scenarios -------------------------------------------------------------------------


def test_all_running_triggers_only_the_sources_and_everyone_acks() -> None:
    graph = two_sources_one_join()
    plan = calculate_plan(graph, dict.fromkeys(graph.stage_ids, RUNNING))
    assert plan.to_trigger == ("src_a", "src_b")
    assert plan.to_ack == ("src_a", "src_b", "join", "sink")
    assert plan.fully_finished == ()
    assert plan.not_started == ()
    assert plan.partially_finished == {}
    assert set(plan.statuses.values()) == {StageStatus.RUNNING}


def test_some_sources_finished() -> None:
    # src_a finished: its own downstream map_a becomes a trigger target; map_b, behind the
    # still running src_b, is only acknowledged.
    graph = graph_of({"src_a": (), "src_b": (), "map_a": ("src_a",), "map_b": ("src_b",)})
    progress = {"src_a": FINISHED, "src_b": RUNNING, "map_a": RUNNING, "map_b": RUNNING}
    plan = calculate_plan(graph, progress)
    assert plan.to_trigger == ("map_a", "src_b")
    assert set(plan.to_ack) == {"src_b", "map_a", "map_b"}
    assert plan.fully_finished == ("src_a",)
    assert plan.statuses["src_a"] is StageStatus.FULLY_FINISHED


def test_all_sources_finished_moves_the_trigger_to_the_next_level() -> None:
    graph = two_sources_one_join()
    progress = {"src_a": CLOSED, "src_b": FINISHED, "join": RUNNING, "sink": RUNNING}
    plan = calculate_plan(graph, progress)
    assert plan.to_trigger == ("join",)
    assert plan.to_ack == ("join", "sink")
    assert set(plan.fully_finished) == {"src_a", "src_b"}


def test_multiple_inputs_with_one_finished_and_one_running() -> None:
    graph = two_sources_one_join()
    progress = {"src_a": FINISHED, "src_b": RUNNING, "join": RUNNING, "sink": RUNNING}
    plan = calculate_plan(graph, progress)
    # join still has a running input: it is reached through src_b, not triggered directly.
    assert plan.to_trigger == ("src_b",)
    assert "join" in plan.to_ack and "join" not in plan.to_trigger


def test_multiple_levels() -> None:
    #   l1a ─┬─> l2a ─┬─> l3 ──> l4
    #   l1b ─┘        │     ^
    #   l1b ───> l2b ─┼─────┘
    #                 └─> l3x
    graph = graph_of(
        {
            "l1a": (),
            "l1b": (),
            "l2a": ("l1a", "l1b"),
            "l2b": ("l1b",),
            "l3": ("l2a", "l2b"),
            "l3x": ("l2a",),
            "l4": ("l3",),
        }
    )
    progress = {
        "l1a": CLOSED,
        "l1b": CLOSED,
        "l2a": FINISHED,
        "l2b": RUNNING,
        "l3": RUNNING,
        "l3x": RUNNING,
        "l4": RUNNING,
    }
    plan = calculate_plan(graph, progress)
    assert plan.to_trigger == ("l2b", "l3x")
    assert plan.to_ack == ("l2b", "l3", "l3x", "l4")
    assert set(plan.fully_finished) == {"l1a", "l1b", "l2a"}


def test_all_finished_triggers_and_acks_nobody() -> None:
    graph = two_sources_one_join()
    progress = {"src_a": CLOSED, "src_b": CLOSED, "join": FINISHED, "sink": FINISHED}
    plan = calculate_plan(graph, progress)
    assert plan.to_trigger == ()
    assert plan.to_ack == ()
    assert set(plan.fully_finished) == set(graph.stage_ids)
    assert set(plan.statuses.values()) == {StageStatus.FULLY_FINISHED}


def test_not_started_stages_are_recorded_not_started() -> None:
    graph = two_sources_one_join()
    # "sink" is missing from the progress, "join" explicitly has not started.
    progress = {"src_a": RUNNING, "src_b": FINISHED, "join": NOT_STARTED}
    plan = calculate_plan(graph, progress)
    assert set(plan.not_started) == {"join", "sink"}
    assert plan.statuses["join"] is StageStatus.NOT_STARTED
    assert plan.statuses["sink"] is StageStatus.NOT_STARTED
    assert plan.to_ack == ("src_a",)
    assert plan.to_trigger == ("src_a",)


def test_partially_finished_split_sets_are_recorded() -> None:
    graph = two_sources_one_join()
    progress = {
        "src_a": running_with("a-0", "a-3"),
        "src_b": running_with(),
        # Restored with finished splits but not started again yet: recorded with its splits,
        # nobody to ask for an acknowledgement.
        "join": StageProgress(
            lifecycle=StageLifecycle.NOT_STARTED, finished_splits=frozenset({"j-1"})
        ),
    }
    plan = calculate_plan(graph, progress)
    assert plan.partially_finished == {
        "src_a": frozenset({"a-0", "a-3"}),
        "join": frozenset({"j-1"}),
    }
    assert plan.statuses["src_a"] is StageStatus.PARTIALLY_FINISHED
    assert plan.statuses["src_b"] is StageStatus.RUNNING
    assert plan.statuses["join"] is StageStatus.PARTIALLY_FINISHED
    assert "src_a" in plan.to_ack and "join" not in plan.to_ack
    assert "join" not in plan.not_started


def test_trigger_target_that_finishes_after_planning() -> None:
    graph = two_sources_one_join()
    progress = {"src_a": CLOSED, "src_b": CLOSED, "join": RUNNING, "sink": NOT_STARTED}
    before = calculate_plan(graph, progress)
    assert before.to_trigger == ("join",)

    # join finishes before it answers the trigger: the coordinator must not wait for an ack
    # that will never come. Re-planning on the new progress shows why.
    progress["join"] = FINISHED
    progress["sink"] = RUNNING
    after = calculate_plan(graph, progress)
    assert "join" not in after.to_ack
    assert "join" in after.fully_finished
    assert after.to_trigger == ("sink",)
    assert after.to_ack != before.to_ack


def test_suspended_stages_acknowledge_and_are_recorded_running() -> None:
    graph = graph_of({"a": (), "b": ("a",)})
    plan = calculate_plan(graph, {"a": SUSPENDED, "b": SUSPENDED})
    assert plan.to_ack == ("a", "b")
    assert plan.to_trigger == ("a",)
    assert plan.statuses == {"a": StageStatus.RUNNING, "b": StageStatus.RUNNING}


def test_progress_for_an_unknown_stage_is_refused() -> None:
    with pytest.raises(InvalidGraphError, match="unknown stages: \\['ghost'\\]"):
        calculate_plan(graph_of({"a": ()}), {"a": RUNNING, "ghost": RUNNING})


@pytest.mark.parametrize(
    ("progress", "status"),
    [
        (NOT_STARTED, StageStatus.NOT_STARTED),
        (RUNNING, StageStatus.RUNNING),
        (SUSPENDED, StageStatus.RUNNING),
        (running_with("s1"), StageStatus.PARTIALLY_FINISHED),
        (FINISHED, StageStatus.FULLY_FINISHED),
        (CLOSED, StageStatus.FULLY_FINISHED),
    ],
)
def test_checkpoint_status(progress: StageProgress, status: StageStatus) -> None:
    assert checkpoint_status(progress) is status


def test_plan_round_trips_through_dict() -> None:
    graph = two_sources_one_join()
    plan = calculate_plan(graph, {"src_a": CLOSED, "src_b": running_with("b1"), "join": RUNNING})
    assert CheckpointPlan.from_dict(plan.to_dict()) == plan


# -- property ---------------------------------------------------------------------------------

LIFECYCLES = list(StageLifecycle)


@st.composite
def dags_with_progress(draw: st.DrawFn) -> tuple[StageGraph, dict[str, StageProgress]]:
    """A random DAG (edges only go from lower to higher index) and random live progress."""
    size = draw(st.integers(min_value=1, max_value=12))
    ids = [f"s{i}" for i in range(size)]
    stages = []
    for i, sid in enumerate(ids):
        ups = draw(st.lists(st.sampled_from(ids[:i]), unique=True)) if i else []
        stages.append(Stage(sid, tuple(ups)))
    graph = StageGraph.build(draw(st.permutations(stages)))
    progress: dict[str, StageProgress] = {}
    for sid in ids:
        if draw(st.booleans()):  # otherwise left out: not started
            progress[sid] = StageProgress(
                lifecycle=draw(st.sampled_from(LIFECYCLES)),
                finished_splits=draw(st.frozensets(st.sampled_from(["p0", "p1", "p2"]))),
            )
    return graph, progress


@settings(max_examples=300, deadline=None)
@given(dags_with_progress())
def test_plan_properties_hold_for_any_dag_and_progress(
    case: tuple[StageGraph, dict[str, StageProgress]],
) -> None:
    graph, progress = case
    plan = calculate_plan(graph, progress)
    lifecycle = {sid: progress.get(sid, NOT_STARTED).lifecycle for sid in graph.stage_ids}

    assert set(plan.to_trigger) <= set(plan.to_ack)
    for sid in plan.to_ack:
        assert lifecycle[sid] in (StageLifecycle.RUNNING, StageLifecycle.SUSPENDED)
        assert plan.statuses[sid] is not StageStatus.FULLY_FINISHED
    # Every running/suspended stage acks, every one whose inputs all finished is triggered.
    running = {
        s for s, lc in lifecycle.items() if lc in (StageLifecycle.RUNNING, StageLifecycle.SUSPENDED)
    }
    assert set(plan.to_ack) == running
    for sid in running:
        inputs_done = all(lifecycle[up].is_finished for up in graph.upstream(sid))
        assert (sid in plan.to_trigger) == inputs_done
    # Statuses cover every stage exactly once; the summary tuples agree with them.
    assert list(plan.statuses) == graph.stage_ids
    assert len(plan.to_ack) == len(set(plan.to_ack))
    assert set(plan.fully_finished) == {s for s, lc in lifecycle.items() if lc.is_finished}
    assert not set(plan.fully_finished) & set(plan.to_ack)
    assert not set(plan.fully_finished) & set(plan.not_started)
    for sid, splits in plan.partially_finished.items():
        assert plan.statuses[sid] is StageStatus.PARTIALLY_FINISHED
        assert splits == progress[sid].finished_splits and splits
    # to_ack follows the topological order, so upstream stages are asked first.
    order = graph.topological_order()
    assert list(plan.to_ack) == [s for s in order if s in running]


@settings(max_examples=300, deadline=None)
@given(dags_with_progress())
def test_the_plan_of_lifecycles_is_the_plan_the_store_keeps(
    case: tuple[StageGraph, dict[str, StageProgress]],
) -> None:
    """What a trigger plans from lifecycles and "holds finished splits" alone (no progress
    JSON) is ``calculate_plan``'s plan without the split ids: the plan as it is stored and
    read back.
    """
    graph, progress = case
    full = calculate_plan(graph, progress)
    lifecycles = {sid: p.lifecycle for sid, p in progress.items()}
    with_splits = {sid for sid, p in progress.items() if p.finished_splits}
    lean = plan_of_lifecycles(graph, lifecycles, with_splits)
    assert lean == CheckpointPlan.from_dict(full.to_dict(splits=False))
    assert list(lean.statuses) == list(full.statuses)
    assert lean.to_dict(splits=False) == full.to_dict(splits=False)


def test_the_plan_of_lifecycles_refuses_unknown_stages() -> None:
    with pytest.raises(InvalidGraphError, match="ghost"):
        plan_of_lifecycles(graph_of({"a": ()}), {"ghost": StageLifecycle.RUNNING}, ())


@pytest.mark.parametrize("lifecycle", LIFECYCLES)
@pytest.mark.parametrize("splits", [False, True])
def test_lifecycle_status_is_checkpoint_status(lifecycle: StageLifecycle, splits: bool) -> None:
    progress = StageProgress(
        lifecycle=lifecycle, finished_splits=frozenset({"p"} if splits else ())
    )
    assert lifecycle_status(lifecycle, splits) is checkpoint_status(progress)
