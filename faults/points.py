"""The named fault points and what can happen at each of them.

A fault point is a place in the protocol where a process can die, fail or stall. Points of the
``runtime`` layer are the ``fault(point)`` calls of ``StageRunner``; every other point is injected
from outside by the proxies in :mod:`faults.proxies` (a Coordinator subclass, a
CheckpointStorage subclass, a sink wrapper, and hooks around atomic writes and garbage
collection), so the runtime and the coordinator need no code for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Layer(StrEnum):
    RUNTIME = "runtime"
    COORDINATOR = "coordinator"
    STORAGE = "storage"
    SINK = "sink"
    GC = "gc"


class Action(StrEnum):
    """What a fault does when it fires."""

    #: SIGKILL of the process running the pipeline (worker, Spark driver): nothing runs after it.
    CRASH = "crash"
    #: An InjectedFault exception at the point (a bug, a lost connection, a task failure).
    RAISE = "raise"
    #: Sleep, then go on (a GC pause, a slow disk): checkpoints may time out meanwhile.
    DELAY = "delay"
    #: OSError(EIO) from the I/O at the point (storage or sink write fails).
    EIO = "eio"
    #: OSError(ENOSPC) from the I/O at the point (disk full).
    ENOSPC = "enospc"
    #: This attempt stalls at the point while a newer attempt of the same stage runs to the end
    #: (Airflow's zombie task); then the stale attempt goes on and must stop itself.
    ZOMBIE = "zombie"


#: Actions that end the attempt where they fire (for reports).
FAILING_ACTIONS = frozenset({Action.CRASH, Action.RAISE, Action.EIO, Action.ENOSPC})
_ANY = (Action.CRASH, Action.RAISE, Action.DELAY, Action.ZOMBIE)
_IN_TRANSITION = (Action.CRASH, Action.EIO, Action.ENOSPC, Action.DELAY)


@dataclass(frozen=True)
class FaultPoint:
    name: str
    layer: Layer
    actions: tuple[Action, ...]
    description: str
    #: Only stages with sinks pass this point (the pipeline's last stage in the examples).
    sink_stage_only: bool = False


_POINTS = (
    # --- StageRunner's own fault(point) calls
    FaultPoint(
        "before-batch", Layer.RUNTIME, _ANY, "a split batch is about to run (nothing written yet)"
    ),
    FaultPoint(
        "mid-batch",
        Layer.RUNTIME,
        _ANY,
        "the batch ran: output part, state and sink staging written, nothing recorded",
    ),
    FaultPoint(
        "before-record-batch",
        Layer.RUNTIME,
        _ANY,
        "the batch's output handle is written; its sink transactions are not pre-committed",
    ),
    FaultPoint(
        "after-record-batch",
        Layer.RUNTIME,
        _ANY,
        "the batch is durable and has answered pending checkpoints; nothing committed yet",
    ),
    FaultPoint(
        "before-finish",
        Layer.RUNTIME,
        _ANY,
        "finish() flushed the state and pre-committed the last transactions, not yet recorded",
    ),
    FaultPoint(
        "after-finish",
        Layer.RUNTIME,
        _ANY,
        "the stage is FINISHED and its eager final checkpoint triggered; not closed",
    ),
    FaultPoint(
        "before-commit",
        Layer.RUNTIME,
        _ANY,
        "a covered transaction is about to be committed (its epoch was just checked)",
        sink_stage_only=True,
    ),
    FaultPoint(
        "mid-commit",
        Layer.RUNTIME,
        _ANY,
        "the sink committed the transaction; the coordinator does not know yet",
        sink_stage_only=True,
    ),
    # --- Coordinator transitions (FaultyCoordinator)
    FaultPoint(
        "after-start-attempt",
        Layer.COORDINATOR,
        _ANY,
        "a new attempt holds a new epoch and has done nothing yet",
    ),
    FaultPoint(
        "before-ack",
        Layer.COORDINATOR,
        _ANY,
        "the batch's sink transactions are pre-committed (sealed) but not recorded: the "
        "acknowledgement is about to be sent",
    ),
    FaultPoint(
        "after-checkpoint-complete",
        Layer.COORDINATOR,
        (Action.CRASH, Action.RAISE, Action.DELAY),
        "a checkpoint completed (metadata durable, transition committed); covered "
        "transactions are not committed yet",
    ),
    FaultPoint(
        "before-close",
        Layer.COORDINATOR,
        _ANY,
        "every covered transaction is committed; the stage is about to close",
    ),
    FaultPoint(
        "after-close",
        Layer.COORDINATOR,
        (Action.CRASH, Action.RAISE),
        "the stage is CLOSED; later transactions are not aborted in the sinks yet, no GC ran",
    ),
    # --- Checkpoint storage (FaultyStorage); the metadata points run inside the coordinator's
    # --- completing transition, which holds the pipeline lock
    FaultPoint(
        "metadata-before-write",
        Layer.STORAGE,
        _IN_TRANSITION,
        "a checkpoint is fully acknowledged; its _metadata is about to be written",
    ),
    FaultPoint(
        "metadata-mid-write",
        Layer.STORAGE,
        (Action.CRASH, Action.EIO, Action.ENOSPC),
        "_metadata bytes are in a temporary file, not yet renamed into place",
    ),
    FaultPoint(
        "metadata-after-write",
        Layer.STORAGE,
        _IN_TRANSITION,
        "_metadata is durably in place but the completing transition has not committed",
    ),
    FaultPoint(
        "metadata-before-discard",
        Layer.STORAGE,
        (Action.CRASH, Action.EIO),
        "retention marked a checkpoint DISCARDED (committed); its files are about to go",
    ),
    FaultPoint(
        "metadata-mid-discard",
        Layer.STORAGE,
        (Action.CRASH, Action.EIO),
        "a discarded checkpoint's _metadata is deleted, the rest of its directory is not",
    ),
    FaultPoint(
        "state-mid-write",
        Layer.STORAGE,
        (Action.CRASH, Action.EIO, Action.ENOSPC),
        "a state or output-handle file is in a temporary file, not yet renamed into place",
    ),
    # --- Sinks (FaultySink)
    FaultPoint(
        "sink-mid-write",
        Layer.SINK,
        (Action.CRASH, Action.RAISE, Action.ENOSPC),
        "a sink has just staged a batch's rows; the other sink may not have yet",
        sink_stage_only=True,
    ),
    FaultPoint(
        "sink-after-precommit",
        Layer.SINK,
        (Action.CRASH, Action.RAISE),
        "a sink sealed its transaction (manifest / pre-commit record); the other sink may not "
        "have yet and nothing is recorded",
        sink_stage_only=True,
    ),
    FaultPoint(
        "sink-before-abort",
        Layer.SINK,
        (Action.CRASH, Action.RAISE),
        "an orphaned or dropped transaction is about to be aborted in a sink",
        sink_stage_only=True,
    ),
    FaultPoint(
        "sink-mid-commit",
        Layer.SINK,
        (Action.CRASH, Action.RAISE),
        "inside a sink's commit: an Iceberg / Delta sink's table commit is done, its committed "
        "marker is not written (other sinks: right after their commit returned)",
        sink_stage_only=True,
    ),
    FaultPoint(
        "sink-mid-abort",
        Layer.SINK,
        (Action.CRASH, Action.RAISE),
        "inside a sink's abort: an Iceberg / Delta sink deleted the manifest and one data file, "
        "not the rest (other sinks: right after their abort returned)",
        sink_stage_only=True,
    ),
    # --- Garbage collection after a stage closed
    FaultPoint(
        "gc-mid-collect",
        Layer.GC,
        (Action.CRASH, Action.RAISE),
        "garbage collection after a close deleted one unit and is about to delete more",
    ),
)

POINTS: dict[str, FaultPoint] = {p.name: p for p in _POINTS}

#: The names StageRunner passes to its ``fault`` callback (kept in sync by a unit test).
RUNTIME_POINTS = tuple(p.name for p in _POINTS if p.layer is Layer.RUNTIME)


def point(name: str) -> FaultPoint:
    try:
        return POINTS[name]
    except KeyError:
        raise ValueError(
            f"unknown fault point {name!r}; known points: {', '.join(sorted(POINTS))}"
        ) from None
