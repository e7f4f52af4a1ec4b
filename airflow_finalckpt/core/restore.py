"""Restore planning: what each stage of the current graph does when a run restores a checkpoint.

Actions (FLIP-147's three finish states, carried over):

- ``skip``: the stage was FULLY_FINISHED. No Spark job runs; its ``end_of_data`` is
  re-published so downstream stages see the same input, and its pending sink transactions are
  carried so they can be re-committed (commits are idempotent).
- ``resume``: the stage was PARTIALLY_FINISHED, or RUNNING with something snapshotted (state
  handles, pending transactions or a watermark). It processes only its unfinished splits and
  gets *all* its state handles back, stage-global state (a broadcast table, a union of every
  split's state) included: unlike Flink, partial finishing never discards or aborts anything.
- ``fresh``: the stage was NOT_STARTED, RUNNING with an empty snapshot, or is new in the graph.

Graph-change rules (Flink's VertexFinishedStateChecker is the floor), checked before anything is
written whenever a pipeline starts from existing progress: ``restore_from`` (the checkpoint's
graph and statuses, :func:`plan_restore`), and a ``pipeline_key`` continuation or a retry of a
changed DAG (the store's graph and live progress, :func:`plan_graph_change`). Both run the same
rules (:func:`find_violations`). Each violation raises :class:`IllegalGraphChangeError` with
``stage_id`` and one of these ``rule`` names, which are part of the public API:

``removed-stage``
    A stage recorded with any status other than NOT_STARTED is missing from the current graph:
    its state and progress would be lost. Waived for the stages named in ``allow_drop_stages``
    (the explicit opt-in, e.g. the DAG run conf ``{"allow_drop_stages": ["b"]}``; the state is
    then dropped and listed in :attr:`RestorePlan.dropped_stages`), or for every removed stage
    by ``allow_removed_stages``.
``rekeyed-stage``
    The Airflow task that ran stage X (status other than NOT_STARTED) now runs a stage with
    another stage_id while X is gone: almost always an accidental rename that would silently
    start X's work over. ``stage_id`` is X; the message names both ids. Waived only by naming X
    in ``allow_drop_stages``.
``finished-needs-finished-upstream``
    A FULLY_FINISHED stage must have every upstream stage of the *current* graph recorded
    FULLY_FINISHED: a new stage placed before a finished one, or a new edge from a stage that
    had not fully finished, would feed it input it can never consume.
``partial-needs-finished-upstream``
    A PARTIALLY_FINISHED stage cannot follow a RUNNING, PARTIALLY_FINISHED, NOT_STARTED or new
    stage: its finished splits were computed from complete upstream input.

``finished-stage-split-list-changed``, ``finished-splits-stay-declared``
    The split-list rules (:mod:`core.split_list`): a finished stage must declare the split
    list it finished with (else new input would be skipped), and a started one every split it
    finished (unless its ``allow_split_list_change``). Raised as ``SplitListChangedError`` /
    ``LostFinishedSplitsError`` when the task declares its splits; the dry run of a restore or
    continuation checks them for the stages whose DAG declares a fixed list.

Automatic retries of the same, unchanged DAG are not re-checked: the coordinator compares the
graph fingerprints first (:meth:`Coordinator.start_pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from airflow_finalckpt.core.errors import (
    DrainedSavepointError,
    ForeignCheckpointError,
    IllegalGraphChangeError,
    InvalidGraphError,
    MetadataError,
)
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    SinkTransaction,
    StageCheckpointRecord,
    StageProgress,
    StageStatus,
    StateHandle,
)
from airflow_finalckpt.core.plan import checkpoint_status
from airflow_finalckpt.core.split_list import SPLIT_LIST_RULES

REMOVED_STAGE = "removed-stage"
REKEYED_STAGE = "rekeyed-stage"
FINISHED_NEEDS_FINISHED_UPSTREAM = "finished-needs-finished-upstream"
PARTIAL_NEEDS_FINISHED_UPSTREAM = "partial-needs-finished-upstream"

#: Every rule name (part of the public API): the graph's, then the split lists' (checked per
#: stage when its task declares its splits, and by the dry run where the DAG fixes them).
GRAPH_CHANGE_RULES = (
    REKEYED_STAGE,
    REMOVED_STAGE,
    FINISHED_NEEDS_FINISHED_UPSTREAM,
    PARTIAL_NEEDS_FINISHED_UPSTREAM,
    *SPLIT_LIST_RULES,
)


class StageAction(StrEnum):
    """What a stage does on restore (see the module docstring)."""

    SKIP = "skip"
    RESUME = "resume"
    FRESH = "fresh"


@dataclass(frozen=True)
class StageRestore:
    """What one stage does on restore, with everything it restores from."""

    stage_id: str
    action: StageAction
    finished_splits: frozenset[str] = frozenset()
    state: tuple[StateHandle, ...] = ()
    pending_transactions: tuple[SinkTransaction, ...] = ()
    watermark: int | None = None
    end_of_data: EndOfData | None = None
    #: How many splits a skipped stage finished (its split ids are not kept: metadata v2).
    finished_count: int | None = None
    #: The fingerprint of the split list the resumed stage declared (None: not known).
    split_list_sha256: str | None = None


@dataclass(frozen=True)
class RestorePlan:
    """The restore decision for every stage of the current graph (in topological order).

    ``dropped_stages`` are checkpointed stages absent from the current graph whose state is
    not restored (allowed removals, or any missing stage in retry mode).
    """

    pipeline_key: str
    checkpoint_id: int
    kind: CheckpointKind
    stages: Mapping[str, StageRestore]
    dropped_stages: tuple[str, ...] = field(default=())

    def _with_action(self, action: StageAction) -> list[str]:
        return [sid for sid, stage in self.stages.items() if stage.action is action]

    @property
    def skipped(self) -> list[str]:
        """Stages restored as fully finished: no Spark job."""
        return self._with_action(StageAction.SKIP)

    @property
    def resumed(self) -> list[str]:
        """Stages that redo only their unfinished splits."""
        return self._with_action(StageAction.RESUME)

    @property
    def fresh(self) -> list[str]:
        """Stages that start from nothing."""
        return self._with_action(StageAction.FRESH)

    def stage(self, stage_id: str) -> StageRestore:
        """The restore decision of one stage; KeyError naming the stage if it is unknown."""
        try:
            return self.stages[stage_id]
        except KeyError:
            raise KeyError(
                f"stage {stage_id!r} is not part of the restore plan of checkpoint "
                f"{self.checkpoint_id} (stages: {sorted(self.stages)})"
            ) from None

    def describe(self, total_splits: Mapping[str, int] | None = None) -> str:
        """One line for the task log; ``total_splits`` adds "of N" to resumed stages."""
        totals = total_splits or {}
        parts: list[str] = []
        for sid, stage in self.stages.items():
            if stage.action is StageAction.SKIP:
                parts.append(f"skip {sid} (fully finished)")
            elif stage.action is StageAction.RESUME:
                done = len(stage.finished_splits)
                count = f"{done}/{totals[sid]}" if sid in totals else str(done)
                parts.append(f"resume {sid} ({count} splits finished)")
            else:
                parts.append(f"fresh {sid}")
        if self.dropped_stages:
            parts.append("state not restored: " + ", ".join(self.dropped_stages))
        kind = self.kind.value.replace("_", " ")
        return f"restoring from checkpoint {self.checkpoint_id} ({kind}): " + "; ".join(parts)


@dataclass(frozen=True)
class GraphChangeViolation:
    """One broken graph-change rule; :meth:`error` turns it into the exception to raise."""

    stage_id: str
    rule: str
    detail: str

    def error(self) -> IllegalGraphChangeError:
        """The exception naming the stage and the rule."""
        return IllegalGraphChangeError(self.stage_id, self.rule, self.detail)


# -- record consistency -------------------------------------------------------------------


def _checkpoint_graph(record: CheckpointRecord) -> StageGraph:
    """The graph the checkpoint was taken with, checked against the recorded stages."""
    where = f"checkpoint {record.checkpoint_id} of pipeline {record.pipeline_key!r}"
    try:
        old = StageGraph.from_dict(record.graph)
    except InvalidGraphError as exc:
        raise MetadataError(f"{where} records an invalid graph: {exc}") from exc
    for key, stage in record.stages.items():
        if key != stage.stage_id:
            raise MetadataError(f"{where}: the entry {key!r} holds stage {stage.stage_id!r}")
        if key not in old:
            raise MetadataError(f"{where} records stage {key!r}, which is not in its graph")
        _check_stage_record(stage, where)
    return old


def _check_stage_record(stage: StageCheckpointRecord, where: str) -> None:
    """Refuse records whose status contradicts their content (a corrupt or buggy writer)."""
    sid = stage.stage_id
    if stage.status is StageStatus.PARTIALLY_FINISHED and not stage.finished_splits:
        raise MetadataError(f"{where}: stage {sid!r} is PARTIALLY_FINISHED with no finished split")
    if stage.status is StageStatus.RUNNING and stage.finished_splits:
        raise MetadataError(
            f"{where}: stage {sid!r} is RUNNING but has finished splits "
            "(it should be recorded PARTIALLY_FINISHED)"
        )
    if stage.status is StageStatus.NOT_STARTED and (
        stage.finished_splits or stage.state or stage.pending_transactions
    ):
        raise MetadataError(
            f"{where}: stage {sid!r} is NOT_STARTED but carries finished splits, state or "
            "sink transactions"
        )


def _status(record: CheckpointRecord, stage_id: str) -> StageStatus:
    """A stage's recorded status; a stage of the old graph without an entry had not started."""
    entry = record.stages.get(stage_id)
    return entry.status if entry is not None else StageStatus.NOT_STARTED


# -- graph-change rules -------------------------------------------------------------------


def _record_statuses(record: CheckpointRecord, old: StageGraph) -> dict[str, StageStatus]:
    return {sid: _status(record, sid) for sid in old.stage_ids}


def find_graph_change_violations(
    record: CheckpointRecord,
    graph: StageGraph,
    *,
    allow_removed_stages: bool = False,
    allow_drop_stages: Collection[str] = (),
) -> list[GraphChangeViolation]:
    """Every graph-change rule the current ``graph`` breaks against a checkpoint."""
    old = _checkpoint_graph(record)
    return find_violations(
        old,
        _record_statuses(record, old),
        graph,
        where=f"checkpoint {record.checkpoint_id}",
        allow_removed_stages=allow_removed_stages,
        allow_drop_stages=allow_drop_stages,
    )


def find_violations(
    old: StageGraph,
    statuses: Mapping[str, StageStatus],
    graph: StageGraph,
    *,
    where: str,
    allow_removed_stages: bool = False,
    allow_drop_stages: Collection[str] = (),
) -> list[GraphChangeViolation]:
    """Every rule ``graph`` breaks against the ``old`` graph and its stages' ``statuses`` (a
    stage without a status had not started), in a deterministic order. ``where`` names the
    progress in messages ("checkpoint 7", "the stored progress of pipeline 'k'").
    """
    status = _status_of(statuses)
    return [
        *_removed_and_rekeyed(
            old, status, graph, where, allow_removed_stages, frozenset(allow_drop_stages)
        ),
        *_upstream_violations(old, status, graph, where),
    ]


def raise_violations(violations: list[GraphChangeViolation]) -> None:
    """Raise IllegalGraphChangeError for the first violation; the message lists the rest."""
    if not violations:
        return
    first, others = violations[0], violations[1:]
    if not others:
        raise first.error()
    also = "; ".join(f"stage {v.stage_id!r} breaks {v.rule!r}" for v in others)
    raise IllegalGraphChangeError(first.stage_id, first.rule, f"{first.detail} (also: {also})")


def validate_graph_change(
    record: CheckpointRecord,
    graph: StageGraph,
    *,
    allow_removed_stages: bool = False,
    allow_drop_stages: Collection[str] = (),
) -> None:
    """Raise IllegalGraphChangeError for the first broken rule; the message lists the rest."""
    raise_violations(
        find_graph_change_violations(
            record,
            graph,
            allow_removed_stages=allow_removed_stages,
            allow_drop_stages=allow_drop_stages,
        )
    )


def _status_of(statuses: Mapping[str, StageStatus]) -> Callable[[str], StageStatus]:
    return lambda sid: statuses.get(sid, StageStatus.NOT_STARTED)


def _removed_and_rekeyed(
    old: StageGraph,
    status_of: Callable[[str], StageStatus],
    graph: StageGraph,
    where: str,
    allow_removed: bool,
    allow_drop: frozenset[str],
) -> list[GraphChangeViolation]:
    current_by_task = {stage.airflow_task_id: sid for sid, stage in graph.stages.items()}
    found: list[GraphChangeViolation] = []
    for sid in old.topological_order():
        status = status_of(sid)
        if sid in graph or status is StageStatus.NOT_STARTED or sid in allow_drop:
            continue
        task_id = old.stages[sid].airflow_task_id
        successor = current_by_task.get(task_id)
        if successor is not None:
            found.append(
                GraphChangeViolation(
                    sid,
                    REKEYED_STAGE,
                    f"Airflow task {task_id!r} ran stage {sid!r} ({status}) in {where} "
                    f"but now runs stage {successor!r}; state is mapped by stage id, so "
                    f"{sid!r}'s progress would be lost. Give task {task_id!r} its old stage id "
                    f"{sid!r} again, or drop its progress on purpose with "
                    f'allow_drop_stages=["{sid}"]',
                )
            )
        elif not allow_removed:
            found.append(
                GraphChangeViolation(
                    sid,
                    REMOVED_STAGE,
                    f"it is {status} in {where} but missing from the current graph, "
                    "so its state would be lost; put it back, or drop its progress on purpose "
                    f'with allow_drop_stages=["{sid}"]',
                )
            )
    return found


def _upstream_violations(
    old: StageGraph,
    status_of: Callable[[str], StageStatus],
    graph: StageGraph,
    where: str,
) -> list[GraphChangeViolation]:
    rules = {
        StageStatus.FULLY_FINISHED: (FINISHED_NEEDS_FINISHED_UPSTREAM, "fully finished"),
        StageStatus.PARTIALLY_FINISHED: (PARTIAL_NEEDS_FINISHED_UPSTREAM, "partially finished"),
    }
    found: list[GraphChangeViolation] = []
    for sid in graph.topological_order():
        if sid not in old or status_of(sid) not in rules:
            continue
        rule, what = rules[status_of(sid)]
        for up in graph.upstream(sid):
            if up not in old:
                why = "is new in the graph"
            elif (up_status := status_of(up)) is not StageStatus.FULLY_FINISHED:
                why = f"is {up_status} in {where}"
            else:
                continue
            found.append(
                GraphChangeViolation(
                    sid,
                    rule,
                    f"it is {what} in {where} but its upstream stage {up!r} {why}; "
                    f"a {what} stage can only follow fully finished stages",
                )
            )
    return found


# -- continuation of stored progress --------------------------------------------------------


@dataclass(frozen=True)
class GraphChange:
    """What a ``pipeline_key`` continuation (or a retry of a changed DAG) does to the stored
    progress: ``kept`` stages keep it, ``fresh`` ones are new, ``dropped`` ones lose it (named
    in ``allow_drop_stages``), ``forgotten`` ones were removed before they started.
    """

    statuses: Mapping[str, StageStatus]
    kept: tuple[str, ...]
    fresh: tuple[str, ...]
    dropped: tuple[str, ...]
    forgotten: tuple[str, ...]

    def describe(self) -> str:
        """One line for the task log."""
        parts = [f"keep {sid} ({self.statuses[sid]})" for sid in self.kept]
        parts += [f"new {sid}" for sid in self.fresh]
        if self.dropped:
            parts.append("progress dropped (allow_drop_stages): " + ", ".join(self.dropped))
        if self.forgotten:
            parts.append("removed before they started: " + ", ".join(self.forgotten))
        return "graph changed: " + "; ".join(parts)


def stored_statuses(progress: Mapping[str, StageProgress]) -> dict[str, StageStatus]:
    """The status each stage's live progress would have in a checkpoint taken now."""
    return {sid: checkpoint_status(p) for sid, p in progress.items()}


def plan_graph_change(
    old: StageGraph,
    progress: Mapping[str, StageProgress],
    graph: StageGraph,
    *,
    pipeline_key: str,
    allow_drop_stages: Collection[str] = (),
) -> GraphChange:
    """Check a continuation of ``old``'s stored ``progress`` into ``graph`` with the same rules
    as a restore; IllegalGraphChangeError (naming the stage and the rule) if it breaks one.
    """
    statuses = stored_statuses(progress)
    raise_violations(
        find_violations(
            old,
            statuses,
            graph,
            where=f"the stored progress of pipeline {pipeline_key!r}",
            allow_drop_stages=allow_drop_stages,
        )
    )
    gone = [sid for sid in old.topological_order() if sid not in graph]
    started = [
        sid
        for sid in gone
        if statuses.get(sid, StageStatus.NOT_STARTED) is not StageStatus.NOT_STARTED
    ]
    return GraphChange(
        statuses={sid: statuses.get(sid, StageStatus.NOT_STARTED) for sid in old.stage_ids},
        kept=tuple(sid for sid in graph.topological_order() if sid in old),
        fresh=tuple(sid for sid in graph.topological_order() if sid not in old),
        dropped=tuple(started),
        forgotten=tuple(sid for sid in gone if sid not in started),
    )


# -- planning -----------------------------------------------------------------------------


def _has_snapshot(entry: StageCheckpointRecord) -> bool:
    return bool(entry.state or entry.pending_transactions or entry.watermark is not None)


def _stage_restore(sid: str, entry: StageCheckpointRecord | None) -> StageRestore:
    if entry is None or entry.status is StageStatus.NOT_STARTED:
        return StageRestore(sid, StageAction.FRESH)
    if entry.status is StageStatus.FULLY_FINISHED:
        # Nothing runs, so state is useless; end_of_data and transactions are what matter.
        return StageRestore(
            sid,
            StageAction.SKIP,
            finished_splits=entry.finished_splits,
            pending_transactions=entry.pending_transactions,
            watermark=entry.watermark,
            end_of_data=entry.end_of_data,
            finished_count=entry.done_splits,
        )
    if entry.status is StageStatus.RUNNING and not _has_snapshot(entry):
        return StageRestore(sid, StageAction.FRESH)
    # Every state handle comes back, stage-global ones included: they survive partial finish.
    return StageRestore(
        sid,
        StageAction.RESUME,
        finished_splits=entry.finished_splits,
        state=entry.state,
        pending_transactions=entry.pending_transactions,
        watermark=entry.watermark,
        end_of_data=entry.end_of_data,
        split_list_sha256=entry.split_list_sha256,
    )


def plan_restore(
    record: CheckpointRecord,
    graph: StageGraph,
    *,
    pipeline_key: str | None = None,
    check_graph_changes: bool = True,
    allow_removed_stages: bool = False,
    allow_drop_stages: Collection[str] = (),
    allow_drained: bool = False,
) -> RestorePlan:
    """Decide what every stage of ``graph`` does when restoring ``record``.

    Raises ForeignCheckpointError (the checkpoint belongs to another pipeline),
    DrainedSavepointError (a drained savepoint without ``allow_drained``), MetadataError (the
    record contradicts itself) or IllegalGraphChangeError (see the module docstring), always
    before anything is planned.
    """
    if pipeline_key is not None and pipeline_key != record.pipeline_key:
        raise ForeignCheckpointError(
            f"checkpoint {record.checkpoint_id} belongs to pipeline {record.pipeline_key!r}, "
            f"not to pipeline {pipeline_key!r}; restore a checkpoint of {pipeline_key!r} or "
            f"run under the pipeline key {record.pipeline_key!r}"
        )
    if record.kind is CheckpointKind.DRAINED_SAVEPOINT and not allow_drained:
        raise DrainedSavepointError(
            f"checkpoint {record.checkpoint_id} of pipeline {record.pipeline_key!r} is a "
            "drained savepoint: every stage finished and every event-time window already "
            "fired, so it cannot be resumed; start a new pipeline run instead"
        )
    old = _checkpoint_graph(record)
    if check_graph_changes:
        validate_graph_change(
            record,
            graph,
            allow_removed_stages=allow_removed_stages,
            allow_drop_stages=allow_drop_stages,
        )
    stages = {sid: _stage_restore(sid, record.stages.get(sid)) for sid in graph.topological_order()}
    dropped = tuple(
        sid
        for sid in old.topological_order()
        if sid not in graph and _status(record, sid) is not StageStatus.NOT_STARTED
    )
    return RestorePlan(
        pipeline_key=record.pipeline_key,
        checkpoint_id=record.checkpoint_id,
        kind=record.kind,
        stages=stages,
        dropped_stages=dropped,
    )


def plan_document(plan: RestorePlan) -> dict[str, object]:
    """The restore plan as data (``finalckpt restore --dry-run --json``, the REST answer): per
    stage what runs, the splits already done (the rest is redone), the state and transactions
    mapped onto it; the checkpointed stages whose progress is dropped.
    """
    stages = []
    for sid, stage in plan.stages.items():
        stages.append(
            {
                "stage_id": sid,
                "action": stage.action.value,
                "finished_splits": sorted(stage.finished_splits),
                "finished_count": stage.finished_count
                if stage.action is StageAction.SKIP
                else len(stage.finished_splits),
                "redo": {
                    StageAction.SKIP: "nothing (fully finished: no Spark job, end_of_data "
                    "re-published)",
                    StageAction.RESUME: f"every split but the {len(stage.finished_splits)} "
                    "finished ones",
                    StageAction.FRESH: "every split",
                }[stage.action],
                "state_files": len(stage.state),
                "state_bytes": sum(h.size for h in stage.state),
                "pending_transactions": [t.txn_id for t in stage.pending_transactions],
                "watermark": stage.watermark,
                "end_of_data_parts": None
                if stage.end_of_data is None
                else len(stage.end_of_data.manifest),
            }
        )
    return {
        "pipeline_key": plan.pipeline_key,
        "checkpoint_id": plan.checkpoint_id,
        "kind": plan.kind.value,
        "skipped": plan.skipped,
        "resumed": plan.resumed,
        "fresh": plan.fresh,
        "dropped_stages": list(plan.dropped_stages),
        "stages": stages,
        "summary": plan.describe(),
    }
