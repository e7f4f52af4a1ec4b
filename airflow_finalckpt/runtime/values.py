"""What a stage attempt is made of, as plain values and protocols: its spec, its batches and
their output, its result and progress, and what it needs from outside (the stage logic that does
a batch's work, a logger, where batch throughput is kept between runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from airflow_finalckpt.core.batching import (
    DEFAULT_MAX_BATCH_SPLITS,
    DEFAULT_TARGET_BATCH_S,
    BatchPolicy,
    Throughput,
    policy_from,
)
from airflow_finalckpt.core.drain import check_on_drain
from airflow_finalckpt.core.model import EndOfData, StateHandle


class CommitMode(StrEnum):
    """PROGRESSIVE commits every transaction as soon as a completed checkpoint covers it;
    FINAL publishes the whole stage's output at its final checkpoint only.
    """

    PROGRESSIVE = "progressive"
    FINAL = "final"


class RunStatus(StrEnum):
    """How an attempt ended: input finished, suspended by a stop with savepoint, or closed."""

    FINISHED = "finished"
    SUSPENDED = "suspended"
    CLOSED = "closed"


@dataclass(frozen=True)
class StageSpec:
    """``batch_size``: ``"auto"`` (batches of about ``target_batch_s`` seconds) or a split count."""

    pipeline_key: str
    stage_id: str
    splits: tuple[str, ...]
    batch_size: int | str = "auto"
    checkpoint_interval_s: float = 60.0
    commit_mode: CommitMode = CommitMode.PROGRESSIVE
    target_batch_s: float = DEFAULT_TARGET_BATCH_S
    max_batch_splits: int = DEFAULT_MAX_BATCH_SPLITS
    #: The columns by which the splits partition the data (``core.plan_check``).
    split_keys: tuple[str, ...] = ()
    #: seconds a running attempt stays alive without renewing its lease (``runtime.lease``)
    attempt_lease_s: float = 60.0
    #: what a stop with drain does to a source stage: ``"stop"`` (stop taking input: a fact
    #: source) or ``"complete"`` (read all input: a dimension read whole downstream)
    on_drain: str = "stop"
    #: Resume although finished splits are no longer declared (the operator argument).
    allow_split_list_change: bool = False
    #: where the pipeline key came from (``core.pipeline_keys.KeyOrigin``): what a refusal
    #: may suggest changing
    key_origin: str = "default"

    def __post_init__(self) -> None:
        self.policy  # noqa: B018 - validates batch_size and target_batch_s
        if check_on_drain(self.stage_id, self.on_drain) is None:
            raise ValueError(f"stage {self.stage_id!r}: on_drain must be 'stop' or 'complete'")

    @property
    def policy(self) -> BatchPolicy:
        """The batch sizing policy of ``batch_size``, ``target_batch_s`` and the split cap."""
        return policy_from(self.batch_size, self.target_batch_s, self.max_batch_splits)


@dataclass(frozen=True)
class Batch:
    """One unit of Spark work: a deterministic key (so a redone batch writes the same part)."""

    index: int
    key: str
    splits: tuple[str, ...]
    #: It takes the stage's last unfinished splits: the input ends with this batch.
    last: bool = False
    #: A downstream stage reads the stage's output parts (False: only its sinks keep output).
    output_read: bool = True


@dataclass(frozen=True)
class BatchOutput:
    """What a batch (or the finish) produced: output parts, new state, watermark, and the
    partition keys its transform reported (they ride on the batch's sink transactions).
    """

    parts: tuple[str, ...] = ()
    state: tuple[StateHandle, ...] | None = None
    watermark: int | None = None
    partition_keys: tuple[str, ...] = ()


class Log(Protocol):
    """Any logger with ``info`` (stdlib, or the Task SDK's structlog logger)."""

    def info(self, event: Any, *args: Any, **kw: Any) -> Any:
        """Log ``event`` (a %-format string with ``args``)."""
        ...


class StageLogic(Protocol):
    """What a stage does; the Spark adapter implements it (and may offer ``split_weights``:
    the input bytes of each split, so auto batches are sized by bytes, not split counts).
    """

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        """Load the state and watermark the last recorded batch left (none on a fresh start)."""
        ...

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        """Run one batch, writing sink rows under ``txn_ids`` (sink id -> transaction id)."""
        ...

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        """End of input: flush what state holds back (all windows when ``drain``)."""
        ...


@dataclass(frozen=True)
class RunResult:
    """The outcome of ``StageRunner.run``: status, end-of-data record, splits done or skipped."""

    status: RunStatus
    end_of_data: EndOfData | None = None
    processed_splits: tuple[str, ...] = ()
    skipped_splits: int = 0
    savepoint_id: int | None = None


class ThroughputHints(Protocol):
    """Where a stage's measured batch throughput is kept between attempts and runs."""

    def load(self, stage_id: str) -> Throughput | None:
        """The stage's last stored throughput, or None."""
        ...

    def save(self, stage_id: str, throughput: Throughput) -> None:
        """Keep the stage's throughput for the next attempt or run."""
        ...


@dataclass
class Progress:
    """Split progress of this attempt, for logs and progress bars."""

    total: int
    done: int
    processed: list[str] = field(default_factory=list)
    #: (splits, seconds) of every batch of this attempt, and the current throughput estimate.
    batches: list[tuple[int, float]] = field(default_factory=list)
    throughput: Throughput | None = None
