"""Restore planning: stage actions, graph-change rules, foreign and drained checkpoints."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from airflow_finalckpt.core.assignment import assign_splits, remaining_splits
from airflow_finalckpt.core.errors import (
    DrainedSavepointError,
    ForeignCheckpointError,
    IllegalGraphChangeError,
    MetadataError,
)
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    SinkTransaction,
    StageCheckpointRecord,
    StageStatus,
    StateHandle,
    TriggerReason,
)
from airflow_finalckpt.core.restore import (
    FINISHED_NEEDS_FINISHED_UPSTREAM,
    GRAPH_CHANGE_RULES,
    PARTIAL_NEEDS_FINISHED_UPSTREAM,
    REKEYED_STAGE,
    REMOVED_STAGE,
    StageAction,
    StageRestore,
    find_graph_change_violations,
    plan_restore,
    validate_graph_change,
)

FULL = StageStatus.FULLY_FINISHED
PARTIAL = StageStatus.PARTIALLY_FINISHED
RUNNING = StageStatus.RUNNING
NOT_STARTED = StageStatus.NOT_STARTED

ALL_SPLITS = [f"day-{i:03d}" for i in range(365)]
ENRICH_DONE = frozenset(ALL_SPLITS[:120])


def handle(name: str) -> StateHandle:
    return StateHandle(
        name=name,
        path=f"chk-7/{name}.parquet",
        size=len(name),
        sha256=hashlib.sha256(name.encode()).hexdigest(),
    )


def txn(sink: str, txn_id: str, checkpoint_id: int = 7) -> SinkTransaction:
    return SinkTransaction(sink_id=sink, txn_id=txn_id, checkpoint_id=checkpoint_id)


def entry(stage_id: str, status: StageStatus, **fields: Any) -> StageCheckpointRecord:
    """A stage record with plausible content for its status unless given explicitly."""
    if status is PARTIAL:
        fields.setdefault("finished_splits", frozenset({"s-0"}))
    return StageCheckpointRecord(stage_id=stage_id, status=status, **fields)


def record(
    graph: StageGraph,
    statuses: dict[str, StageStatus | StageCheckpointRecord],
    *,
    key: str = "sales-daily",
    checkpoint_id: int = 7,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
) -> CheckpointRecord:
    stages = {
        sid: value if isinstance(value, StageCheckpointRecord) else entry(sid, value)
        for sid, value in statuses.items()
    }
    return CheckpointRecord(
        pipeline_key=key,
        checkpoint_id=checkpoint_id,
        kind=kind,
        reason=TriggerReason.SAVEPOINT if kind.is_savepoint else TriggerReason.PERIODIC,
        graph=graph.to_dict(),
        graph_fingerprint=graph.fingerprint,
        triggered_at=1000.0,
        completed_at=1001.5,
        stages=stages,
    )


def graph_of(edges: dict[str, tuple[str, ...]], tasks: dict[str, str] | None = None) -> StageGraph:
    tasks = tasks or {}
    return StageGraph.build(Stage(sid, ups, tasks.get(sid)) for sid, ups in edges.items())


CHAIN = graph_of({"ingest": (), "enrich": ("ingest",), "publish": ("enrich",)})


def chain_savepoint(**kwargs: Any) -> CheckpointRecord:
    """ingest fully finished, enrich 120/365 splits done, publish not started."""
    return record(
        CHAIN,
        {
            "ingest": entry(
                "ingest",
                FULL,
                end_of_data=EndOfData(manifest=["ingest/part-0"], finished_at_checkpoint=6),
                pending_transactions=(txn("raw", "ingest-6", 6),),
            ),
            "enrich": entry(
                "enrich",
                PARTIAL,
                finished_splits=ENRICH_DONE,
                state=(handle("enrich-split-state"), handle("broadcast-rates")),
                pending_transactions=(txn("curated", "enrich-7"),),
                watermark=1_700_000_000_000,
            ),
            "publish": NOT_STARTED,
        },
        kind=CheckpointKind.SAVEPOINT,
        **kwargs,
    )


def raises_rule(rule: str) -> Any:
    """pytest.raises for an IllegalGraphChangeError of ``rule``; check_error checks the rest."""
    return pytest.raises(IllegalGraphChangeError, match=f"violates restore rule '{rule}'")


def check_error(info: pytest.ExceptionInfo[IllegalGraphChangeError], stage: str, rule: str) -> None:
    assert info.value.stage_id == stage
    assert info.value.rule == rule
    assert rule in GRAPH_CHANGE_RULES


# -- actions ----------------------------------------------------------------------------------


def test_restore_of_a_typical_savepoint() -> None:
    plan = plan_restore(chain_savepoint(), CHAIN, pipeline_key="sales-daily")
    assert (plan.pipeline_key, plan.checkpoint_id, plan.kind) == (
        "sales-daily",
        7,
        CheckpointKind.SAVEPOINT,
    )
    assert plan.skipped == ["ingest"]
    assert plan.resumed == ["enrich"]
    assert plan.fresh == ["publish"]
    assert list(plan.stages) == ["ingest", "enrich", "publish"]
    assert plan.dropped_stages == ()


def test_fully_finished_stage_is_skipped_with_its_end_of_data_and_transactions() -> None:
    ingest = plan_restore(chain_savepoint(), CHAIN).stage("ingest")
    assert ingest.action is StageAction.SKIP
    assert ingest.end_of_data == EndOfData(manifest=["ingest/part-0"], finished_at_checkpoint=6)
    assert ingest.pending_transactions == (txn("raw", "ingest-6", 6),)
    assert ingest.state == ()


def test_partially_finished_stage_resumes_with_splits_and_every_state_handle() -> None:
    enrich = plan_restore(chain_savepoint(), CHAIN).stage("enrich")
    assert enrich.action is StageAction.RESUME
    assert enrich.finished_splits == ENRICH_DONE
    assert enrich.pending_transactions == (txn("curated", "enrich-7"),)
    assert enrich.watermark == 1_700_000_000_000
    assert enrich.end_of_data is None


def test_global_state_survives_partial_finishing() -> None:
    # The broadcast table is stage-global: the splits that finished must not take it with
    # them, and nothing is aborted because of it (Flink would refuse such a checkpoint).
    enrich = plan_restore(chain_savepoint(), CHAIN).stage("enrich")
    assert [h.name for h in enrich.state] == ["enrich-split-state", "broadcast-rates"]
    # Only the unfinished splits are redistributed over today's parallelism.
    groups = assign_splits(remaining_splits(ALL_SPLITS, enrich.finished_splits), 4)
    flat = [s for g in groups for s in g]
    assert len(flat) == 245 and not set(flat) & ENRICH_DONE


def test_running_stage_with_state_resumes() -> None:
    graph = graph_of({"a": ()})
    running = entry("a", RUNNING, state=(handle("window-state"),), watermark=42)
    stage = plan_restore(record(graph, {"a": running}), graph).stage("a")
    assert stage.action is StageAction.RESUME
    assert stage.state == (handle("window-state"),)
    assert stage.watermark == 42
    assert stage.finished_splits == frozenset()


@pytest.mark.parametrize(
    "snapshot",
    [
        {"pending_transactions": (txn("out", "t1"),)},
        {"watermark": 5},
        {"state": (handle("h"),)},
    ],
)
def test_running_stage_with_any_snapshot_content_resumes(snapshot: dict[str, Any]) -> None:
    graph = graph_of({"a": ()})
    plan = plan_restore(record(graph, {"a": entry("a", RUNNING, **snapshot)}), graph)
    assert plan.stage("a").action is StageAction.RESUME


def test_running_stage_without_state_starts_fresh() -> None:
    graph = graph_of({"a": ()})
    assert plan_restore(record(graph, {"a": RUNNING}), graph).stage("a").action is (
        StageAction.FRESH
    )


def test_not_started_stage_and_stage_without_entry_start_fresh() -> None:
    graph = graph_of({"a": (), "b": ("a",)})
    plan = plan_restore(record(graph, {"a": NOT_STARTED}), graph)
    assert plan.fresh == ["a", "b"]
    assert plan.stage("b") == StageRestore("b", StageAction.FRESH)


def test_new_stage_starts_fresh() -> None:
    new_graph = graph_of(
        {"ingest": (), "enrich": ("ingest",), "publish": ("enrich",), "audit": ("enrich",)}
    )
    plan = plan_restore(chain_savepoint(), new_graph)
    assert plan.stage("audit").action is StageAction.FRESH
    assert plan.fresh == ["audit", "publish"]


def test_describe_for_the_task_log() -> None:
    plan = plan_restore(chain_savepoint(), CHAIN)
    assert plan.describe({"enrich": 365}) == (
        "restoring from checkpoint 7 (savepoint): skip ingest (fully finished); "
        "resume enrich (120/365 splits finished); fresh publish"
    )
    assert "resume enrich (120 splits finished)" in plan.describe()


def test_describe_names_dropped_stages_and_drained_kind() -> None:
    graph = graph_of({"a": (), "b": ()})
    rec = record(graph, {"a": FULL, "b": FULL}, kind=CheckpointKind.DRAINED_SAVEPOINT)
    plan = plan_restore(rec, graph_of({"a": ()}), allow_drained=True, allow_removed_stages=True)
    assert plan.describe() == (
        "restoring from checkpoint 7 (drained savepoint): skip a (fully finished); "
        "state not restored: b"
    )


def test_unknown_stage_lookup_names_the_stage() -> None:
    plan = plan_restore(chain_savepoint(), CHAIN)
    with pytest.raises(KeyError, match="'nope' is not part of the restore plan"):
        plan.stage("nope")


# -- foreign and drained checkpoints ----------------------------------------------------------


def test_foreign_checkpoint_is_refused_naming_both_keys() -> None:
    with pytest.raises(ForeignCheckpointError) as info:
        plan_restore(chain_savepoint(), CHAIN, pipeline_key="sales-hourly")
    assert "'sales-daily'" in str(info.value) and "'sales-hourly'" in str(info.value)


def test_no_pipeline_key_means_no_ownership_check() -> None:
    assert plan_restore(chain_savepoint(), CHAIN).pipeline_key == "sales-daily"


def test_drained_savepoint_is_refused() -> None:
    rec = record(CHAIN, dict.fromkeys(CHAIN.stage_ids, FULL), kind=CheckpointKind.DRAINED_SAVEPOINT)
    with pytest.raises(DrainedSavepointError, match=r"drained savepoint.*cannot be resumed"):
        plan_restore(rec, CHAIN)


def test_drained_savepoint_allowed_skips_everything() -> None:
    rec = record(CHAIN, dict.fromkeys(CHAIN.stage_ids, FULL), kind=CheckpointKind.DRAINED_SAVEPOINT)
    plan = plan_restore(rec, CHAIN, allow_drained=True)
    assert plan.skipped == ["ingest", "enrich", "publish"]
    assert plan.kind is CheckpointKind.DRAINED_SAVEPOINT


def test_foreign_key_is_checked_before_the_drain_flag() -> None:
    rec = record(CHAIN, dict.fromkeys(CHAIN.stage_ids, FULL), kind=CheckpointKind.DRAINED_SAVEPOINT)
    with pytest.raises(ForeignCheckpointError):
        plan_restore(rec, CHAIN, pipeline_key="other")


# -- rule: removed-stage ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [FULL, PARTIAL, RUNNING])
def test_removed_stage_with_progress_is_refused(status: StageStatus) -> None:
    old = graph_of({"a": (), "b": ()})
    rec = record(old, {"a": FULL, "b": status})
    with raises_rule(REMOVED_STAGE) as info:
        plan_restore(rec, graph_of({"a": ()}))
    check_error(info, "b", REMOVED_STAGE)
    assert "allow_drop_stages=['b']" in str(info.value).replace('"', "'")


def test_removed_not_started_stage_is_fine() -> None:
    old = graph_of({"a": (), "b": ()})
    plan = plan_restore(record(old, {"a": FULL, "b": NOT_STARTED}), graph_of({"a": ()}))
    assert list(plan.stages) == ["a"]
    assert plan.dropped_stages == ()


def test_allow_removed_stages_drops_their_state() -> None:
    old = graph_of({"a": (), "b": ()})
    rec = record(old, {"a": FULL, "b": PARTIAL})
    plan = plan_restore(rec, graph_of({"a": ()}), allow_removed_stages=True)
    assert list(plan.stages) == ["a"]
    assert plan.dropped_stages == ("b",)


# -- rule: rekeyed-stage ----------------------------------------------------------------------


def test_rekeyed_stage_is_refused_naming_both_ids() -> None:
    old = graph_of({"enrich": ()}, tasks={"enrich": "enrich_task"})
    new = graph_of({"enrich_v2": ()}, tasks={"enrich_v2": "enrich_task"})
    with raises_rule(REKEYED_STAGE) as info:
        plan_restore(record(old, {"enrich": PARTIAL}), new)
    check_error(info, "enrich", REKEYED_STAGE)
    assert "'enrich_v2'" in str(info.value) and "'enrich_task'" in str(info.value)


def test_rekeyed_stage_is_not_waived_by_allow_removed_stages() -> None:
    old = graph_of({"enrich": ()}, tasks={"enrich": "enrich_task"})
    new = graph_of({"enrich_v2": ()}, tasks={"enrich_v2": "enrich_task"})
    with raises_rule(REKEYED_STAGE) as info:
        plan_restore(record(old, {"enrich": FULL}), new, allow_removed_stages=True)
    check_error(info, "enrich", REKEYED_STAGE)


def test_same_stage_on_a_renamed_task_is_fine() -> None:
    old = graph_of({"enrich": ()})
    new = graph_of({"enrich": ()}, tasks={"enrich": "enrich_task_v2"})
    plan = plan_restore(record(old, {"enrich": PARTIAL}), new)
    assert plan.resumed == ["enrich"]


def test_rekeying_a_stage_that_never_ran_is_fine() -> None:
    old = graph_of({"a": (), "b": ("a",)}, tasks={"b": "task_b"})
    new = graph_of({"a": (), "b2": ("a",)}, tasks={"b2": "task_b"})
    plan = plan_restore(record(old, {"a": FULL, "b": NOT_STARTED}), new)
    assert plan.fresh == ["b2"]


# -- rule: finished-needs-finished-upstream ---------------------------------------------------


def test_new_stage_before_a_fully_finished_one_is_refused() -> None:
    old = graph_of({"ingest": (), "enrich": ("ingest",)})
    new = graph_of({"ingest": (), "dedupe": ("ingest",), "enrich": ("dedupe",)})
    with raises_rule(FINISHED_NEEDS_FINISHED_UPSTREAM) as info:
        plan_restore(record(old, {"ingest": FULL, "enrich": FULL}), new)
    check_error(info, "enrich", FINISHED_NEEDS_FINISHED_UPSTREAM)
    assert "'dedupe' is new" in str(info.value)


@pytest.mark.parametrize("upstream_status", [PARTIAL, RUNNING, NOT_STARTED])
def test_new_edge_from_an_unfinished_stage_into_a_finished_one_is_refused(
    upstream_status: StageStatus,
) -> None:
    old = graph_of({"a": (), "b": ()})
    new = graph_of({"a": (), "b": ("a",)})
    with raises_rule(FINISHED_NEEDS_FINISHED_UPSTREAM) as info:
        plan_restore(record(old, {"a": upstream_status, "b": FULL}), new)
    check_error(info, "b", FINISHED_NEEDS_FINISHED_UPSTREAM)
    assert f"'a' is {upstream_status}" in str(info.value)


def test_new_edge_between_fully_finished_stages_is_fine() -> None:
    old = graph_of({"a": (), "b": ()})
    new = graph_of({"a": (), "b": ("a",)})
    plan = plan_restore(record(old, {"a": FULL, "b": FULL}), new)
    assert plan.skipped == ["a", "b"]


def test_new_stage_after_a_fully_finished_one_is_fine() -> None:
    new = graph_of({"ingest": (), "enrich": ("ingest",), "publish": ("enrich",), "x": ("ingest",)})
    plan = plan_restore(chain_savepoint(), new)
    assert plan.stage("x").action is StageAction.FRESH


# -- rule: partial-needs-finished-upstream ----------------------------------------------------


@pytest.mark.parametrize("upstream_status", [RUNNING, PARTIAL, NOT_STARTED])
def test_partially_finished_stage_after_an_unfinished_one_is_refused(
    upstream_status: StageStatus,
) -> None:
    old = graph_of({"a": (), "b": ()})
    new = graph_of({"a": (), "b": ("a",)})
    with raises_rule(PARTIAL_NEEDS_FINISHED_UPSTREAM) as info:
        plan_restore(record(old, {"a": upstream_status, "b": PARTIAL}), new)
    check_error(info, "b", PARTIAL_NEEDS_FINISHED_UPSTREAM)


def test_partially_finished_stage_after_a_new_stage_is_refused() -> None:
    old = graph_of({"b": ()})
    new = graph_of({"a": (), "b": ("a",)})
    with raises_rule(PARTIAL_NEEDS_FINISHED_UPSTREAM) as info:
        plan_restore(record(old, {"b": PARTIAL}), new)
    check_error(info, "b", PARTIAL_NEEDS_FINISHED_UPSTREAM)
    assert "'a' is new" in str(info.value)


def test_partially_finished_stage_after_a_fully_finished_one_is_fine() -> None:
    assert plan_restore(chain_savepoint(), CHAIN).resumed == ["enrich"]


def test_running_stage_may_follow_anything() -> None:
    old = graph_of({"b": ()})
    new = graph_of({"a": (), "b": ("a",)})
    plan = plan_restore(record(old, {"b": entry("b", RUNNING, state=(handle("s"),))}), new)
    assert plan.resumed == ["b"] and plan.fresh == ["a"]


# -- all rules together, retry mode -----------------------------------------------------------


def broken_restore() -> tuple[CheckpointRecord, StageGraph]:
    """A checkpoint and a graph that break every rule at once."""
    old = graph_of(
        {"gone": (), "renamed": (), "fin": (), "part": ()},
        tasks={"renamed": "t_renamed"},
    )
    rec = record(old, {"gone": RUNNING, "renamed": FULL, "fin": FULL, "part": PARTIAL})
    new = graph_of(
        {"renamed2": (), "newcomer": (), "fin": ("newcomer",), "part": ("newcomer",)},
        tasks={"renamed2": "t_renamed"},
    )
    return rec, new


def test_every_violation_is_found_and_reported() -> None:
    rec, new = broken_restore()
    found = [(v.stage_id, v.rule) for v in find_graph_change_violations(rec, new)]
    assert found == [
        ("gone", REMOVED_STAGE),
        ("renamed", REKEYED_STAGE),
        ("fin", FINISHED_NEEDS_FINISHED_UPSTREAM),
        ("part", PARTIAL_NEEDS_FINISHED_UPSTREAM),
    ]
    with pytest.raises(IllegalGraphChangeError) as info:
        validate_graph_change(rec, new)
    check_error(info, "gone", REMOVED_STAGE)
    for stage, rule in found[1:]:
        assert f"stage {stage!r} breaks {rule!r}" in str(info.value)


def test_validate_graph_change_accepts_an_unchanged_graph() -> None:
    validate_graph_change(chain_savepoint(), CHAIN)
    assert find_graph_change_violations(chain_savepoint(), CHAIN) == []


def test_retry_mode_checks_no_rule() -> None:
    rec, new = broken_restore()
    plan = plan_restore(rec, new, check_graph_changes=False)
    assert plan.skipped == ["fin"]
    assert plan.resumed == ["part"]
    assert set(plan.fresh) == {"newcomer", "renamed2"}
    assert set(plan.dropped_stages) == {"gone", "renamed"}


def test_retry_mode_still_refuses_foreign_and_drained_checkpoints() -> None:
    with pytest.raises(ForeignCheckpointError):
        plan_restore(chain_savepoint(), CHAIN, pipeline_key="x", check_graph_changes=False)
    rec = record(CHAIN, dict.fromkeys(CHAIN.stage_ids, FULL), kind=CheckpointKind.DRAINED_SAVEPOINT)
    with pytest.raises(DrainedSavepointError):
        plan_restore(rec, CHAIN, check_graph_changes=False)


# -- inconsistent records ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (entry("a", PARTIAL, finished_splits=frozenset()), "PARTIALLY_FINISHED with no finished"),
        (entry("a", RUNNING, finished_splits=frozenset({"s"})), "RUNNING but has finished"),
        (entry("a", NOT_STARTED, state=(handle("h"),)), "NOT_STARTED but carries"),
        (entry("a", NOT_STARTED, pending_transactions=(txn("o", "t"),)), "NOT_STARTED but"),
    ],
)
def test_self_contradicting_stage_records_are_refused(
    stage: StageCheckpointRecord, message: str
) -> None:
    graph = graph_of({"a": ()})
    with pytest.raises(MetadataError, match=message) as info:
        plan_restore(record(graph, {"a": stage}), graph)
    assert "'a'" in str(info.value)


def test_record_of_a_stage_outside_its_graph_is_refused() -> None:
    rec = record(graph_of({"a": ()}), {"a": FULL, "b": FULL})
    with pytest.raises(MetadataError, match="records stage 'b', which is not in its graph"):
        plan_restore(rec, graph_of({"a": ()}))


def test_record_under_the_wrong_key_is_refused() -> None:
    rec = record(graph_of({"a": (), "b": ()}), {"a": entry("b", FULL)})
    with pytest.raises(MetadataError, match="the entry 'a' holds stage 'b'"):
        plan_restore(rec, graph_of({"a": (), "b": ()}))


def test_invalid_recorded_graph_is_refused() -> None:
    rec = record(graph_of({"a": ()}), {}).model_copy(update={"graph": {"stages": "nonsense"}})
    with pytest.raises(MetadataError, match="checkpoint 7 of pipeline 'sales-daily' records"):
        plan_restore(rec, graph_of({"a": ()}))
