"""The checkpoint plan calculator (Flink's DefaultCheckpointPlanCalculator, carried over).

Given the graph and every stage's live progress, decide which stages a new checkpoint triggers,
which must acknowledge it, and how the others are recorded: fully finished stages as a flag,
stages that have not started as NOT_STARTED.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from airflow_finalckpt.core.errors import InvalidGraphError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StageLifecycle, StageProgress, StageStatus

#: Stage statuses by value: a stored plan names one per stage (a lookup, not an enum call).
_STATUSES = {status.value: status for status in StageStatus}


@dataclass(frozen=True)
class CheckpointPlan:
    """What a checkpoint covers.

    ``to_trigger`` are the running stages whose upstream stages have all finished (the new
    "sources" of FLIP-147); ``to_ack`` are all running stages: each answers at its next split
    batch boundary. ``statuses`` is the status each stage would have if nothing changed until
    the checkpoint completes; acknowledgements refine RUNNING into PARTIALLY_FINISHED.
    """

    to_trigger: tuple[str, ...]
    to_ack: tuple[str, ...]
    fully_finished: tuple[str, ...]
    not_started: tuple[str, ...]
    partially_finished: Mapping[str, frozenset[str]] = field(default_factory=dict)
    statuses: Mapping[str, StageStatus] = field(default_factory=dict)

    def to_dict(self, *, splits: bool = True) -> dict[str, object]:
        """The plan as JSON. ``splits=False`` leaves the finished split ids out (what the store
        keeps: nothing reads them back, the completion records the acknowledged snapshots, and
        they are O(running stages x splits) of JSON written at every trigger).
        """
        data: dict[str, object] = {
            "to_trigger": list(self.to_trigger),
            "to_ack": list(self.to_ack),
            "fully_finished": list(self.fully_finished),
            "not_started": list(self.not_started),
            "statuses": {k: str(v) for k, v in self.statuses.items()},
        }
        if splits:
            data["partially_finished"] = {k: sorted(v) for k, v in self.partially_finished.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CheckpointPlan:
        """A plan from its JSON (a stored one has no finished split ids)."""
        partial = data.get("partially_finished") or {}
        statuses = data.get("statuses") or {}
        assert isinstance(partial, dict) and isinstance(statuses, dict)
        return cls(
            to_trigger=tuple(data["to_trigger"]),  # type: ignore[arg-type]
            to_ack=tuple(data["to_ack"]),  # type: ignore[arg-type]
            fully_finished=tuple(data["fully_finished"]),  # type: ignore[arg-type]
            not_started=tuple(data["not_started"]),  # type: ignore[arg-type]
            partially_finished={k: frozenset(v) for k, v in partial.items()},
            statuses={k: _STATUSES.get(v) or StageStatus(v) for k, v in statuses.items()},
        )


def checkpoint_status(progress: StageProgress) -> StageStatus:
    """The status a stage's live progress maps to in a checkpoint."""
    return lifecycle_status(progress.lifecycle, bool(progress.finished_splits))


def lifecycle_status(lifecycle: StageLifecycle, has_finished_splits: bool) -> StageStatus:
    """The status of a stage in ``lifecycle`` that holds finished splits or not."""
    if lifecycle.is_finished:
        return StageStatus.FULLY_FINISHED
    if lifecycle is StageLifecycle.NOT_STARTED and not has_finished_splits:
        return StageStatus.NOT_STARTED
    if has_finished_splits:
        return StageStatus.PARTIALLY_FINISHED
    return StageStatus.RUNNING


def _check_known(graph: StageGraph, stage_ids: Iterable[str]) -> None:
    unknown = set(stage_ids) - set(graph.stages)
    if unknown:
        raise InvalidGraphError(f"progress reported for unknown stages: {sorted(unknown)}")


def _plan(
    graph: StageGraph,
    lifecycles: Mapping[str, StageLifecycle],
    statuses: dict[str, StageStatus],
    partially_finished: Mapping[str, frozenset[str]],
) -> CheckpointPlan:
    """The plan of stages in ``lifecycles`` (every stage of ``graph``) with ``statuses``."""
    running = (StageLifecycle.RUNNING, StageLifecycle.SUSPENDED)
    to_ack = [sid for sid in graph.topological_order() if lifecycles[sid] in running]
    to_trigger = [
        sid for sid in to_ack if all(lifecycles[up].is_finished for up in graph.upstream(sid))
    ]
    return CheckpointPlan(
        to_trigger=tuple(to_trigger),
        to_ack=tuple(to_ack),
        fully_finished=tuple(s for s, st in statuses.items() if st is StageStatus.FULLY_FINISHED),
        not_started=tuple(s for s, st in statuses.items() if st is StageStatus.NOT_STARTED),
        partially_finished=partially_finished,
        statuses=statuses,
    )


def calculate_plan(graph: StageGraph, progress: Mapping[str, StageProgress]) -> CheckpointPlan:
    """Compute the plan of a checkpoint triggered now.

    A stage missing from ``progress`` has not started. RUNNING and SUSPENDED stages must
    acknowledge; a NOT_STARTED stage that restored finished splits is recorded with them
    (it has state, but no live attempt to ask).
    """
    _check_known(graph, progress)
    default = StageProgress(lifecycle=StageLifecycle.NOT_STARTED)
    live = {sid: progress.get(sid, default) for sid in graph.stage_ids}
    statuses = {sid: checkpoint_status(p) for sid, p in live.items()}
    partially = {
        s: live[s].finished_splits
        for s, st in statuses.items()
        if st is StageStatus.PARTIALLY_FINISHED
    }
    return _plan(graph, {sid: p.lifecycle for sid, p in live.items()}, statuses, partially)


def plan_of_lifecycles(
    graph: StageGraph, lifecycles: Mapping[str, StageLifecycle], with_splits: Collection[str]
) -> CheckpointPlan:
    """``calculate_plan`` from each stage's lifecycle and whether it holds finished splits
    (``with_splits``), without their ids: the plan as the store keeps it (``to_dict(splits=
    False)``; ``partially_finished`` is empty, as in a plan read back). A trigger reads no
    progress JSON for it: a finished stage is a flag, a running stage is asked.
    """
    _check_known(graph, lifecycles)
    not_started = StageLifecycle.NOT_STARTED
    live = {sid: lifecycles.get(sid, not_started) for sid in graph.stage_ids}
    statuses = {sid: lifecycle_status(lc, sid in with_splits) for sid, lc in live.items()}
    return _plan(graph, live, statuses, {})


def attempt_gone(lifecycle: StageLifecycle, lease_until: float | None, now: float) -> bool:
    """A RUNNING stage's attempt is gone once its lease is past: it failed (its failure path
    set the lease in the past) or it stopped renewing (a SIGKILLed worker). No lease (None: a
    new attempt before its first renewal, an older version's attempt) is alive.
    """
    return lifecycle is StageLifecycle.RUNNING and lease_until is not None and lease_until <= now


def attempts_gone(
    to_ack: Iterable[str],
    lifecycles: Mapping[str, StageLifecycle],
    leases: Mapping[str, float | None],
    now: float,
) -> tuple[str, ...]:
    """The stages of ``to_ack`` that cannot answer a checkpoint themselves: their attempt is
    gone (``attempt_gone``). Their progress is durable at every batch boundary, so the
    coordinator answers for them from their last durable snapshot, exactly what they would have
    answered at that boundary; the others must acknowledge. A later attempt continues from the
    same snapshot (its new epoch fences the gone one), so nothing is lost or counted twice.
    """
    return tuple(
        sid
        for sid in to_ack
        if attempt_gone(lifecycles.get(sid, StageLifecycle.NOT_STARTED), leases.get(sid), now)
    )


def must_acknowledge(
    to_ack: Iterable[str],
    lifecycles: Mapping[str, StageLifecycle],
    leases: Mapping[str, float | None],
    now: float,
) -> tuple[str, ...]:
    """The stages of ``to_ack`` that must acknowledge themselves (the rest: ``attempts_gone``)."""
    gone = set(attempts_gone(to_ack, lifecycles, leases, now))
    return tuple(sid for sid in to_ack if sid not in gone)
