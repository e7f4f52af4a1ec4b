"""The coordinator as the runtime, the triggers and garbage collection use it: a protocol, so
they depend on what they call and not on the SQL-backed ``coordination.Coordinator`` (a fault
harness or a test wraps or fakes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import (
    CheckpointKind,
    SinkTransaction,
    StageSnapshot,
    StateHandle,
    TriggerReason,
)
from airflow_finalckpt.core.views import (
    BatchOutcome,
    CheckpointInfo,
    FinishOutcome,
    PipelineSnapshot,
    StageView,
    StopRequest,
)


class CoordinatorPort(Protocol):
    """What a stage attempt, a waiting trigger and the garbage collector ask of a pipeline's
    coordinator (every method is one transition or one read of ``Coordinator``).
    """

    @property
    def pipeline_key(self) -> str:
        """The pipeline coordinated."""
        ...

    @property
    def writer(self) -> CheckpointWriter | None:
        """Checkpoint storage, if the coordinator writes checkpoints."""
        ...

    # stage attempts (runtime.runner)

    def start_attempt(
        self,
        stage_id: str,
        *,
        total_splits: int | None = None,
        split_list_sha256: str | None = None,
    ) -> StageView:
        """A new attempt of the stage with its new epoch."""
        ...

    def renew_lease(self, stage_id: str, epoch: int, lease_s: float) -> bool:
        """The running attempt is alive ``lease_s`` more seconds; False if it is not running."""
        ...

    def release_attempt(self, stage_id: str, epoch: int) -> tuple[str, ...]:
        """The attempt failed: checkpoints stop waiting for it (answered from its progress)."""
        ...

    def restored_from(self) -> str | None:
        """The checkpoint or savepoint the pipeline was last restored from, if any."""
        ...

    def batch_boundary(self, stage_id: str, epoch: int) -> StopRequest | None:
        """Fence the attempt before a batch; the latest stop request."""
        ...

    def check_epoch(self, stage_id: str, epoch: int) -> None:
        """StaleEpochError unless ``epoch`` is current."""
        ...

    def record_batch(
        self,
        stage_id: str,
        epoch: int,
        *,
        finished_splits: Iterable[str] = (),
        state: Sequence[StateHandle] | None = None,
        transactions: Sequence[SinkTransaction] = (),
        watermark: int | None = None,
    ) -> BatchOutcome:
        """Make a batch durable and acknowledge what waits for the stage."""
        ...

    def finish(self, stage_id: str, epoch: int, snapshot: StageSnapshot) -> FinishOutcome:
        """Record the final snapshot and trigger the eager final checkpoint."""
        ...

    def suspend(self, stage_id: str, epoch: int) -> None:
        """Stop a running stage for a savepoint."""
        ...

    def trigger(
        self,
        reason: TriggerReason = TriggerReason.PERIODIC,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> int | None:
        """Trigger a checkpoint if one is due."""
        ...

    def committable_transactions(self, stage_id: str) -> list[SinkTransaction]:
        """Transactions covered by a completed checkpoint."""
        ...

    def mark_committed(self, stage_id: str, epoch: int, sink_id: str, txn_id: str) -> bool:
        """Record a sink commit."""
        ...

    def close(self, stage_id: str, epoch: int, checkpoint_id: int) -> list[SinkTransaction]:
        """CLOSE the stage on a completed checkpoint; the transactions to abort."""
        ...

    def transactions(self, stage_id: str | None = None) -> list[tuple[SinkTransaction, str]]:
        """Recorded transactions with their states."""
        ...

    # waiting (triggers, sensors)

    def closable_checkpoint(self, stage_id: str) -> int | None:
        """The checkpoint a finished stage may close on now."""
        ...

    def ensure_final_checkpoint(self, stage_id: str) -> int | None:
        """Replace an aborted final checkpoint of a finished stage."""
        ...

    def stop_request(self) -> StopRequest | None:
        """The latest stop request."""
        ...

    def waiting_snapshot(self) -> PipelineSnapshot:
        """The read model waiting stages share."""
        ...

    # reads (runner, gc)

    def graph(self) -> StageGraph:
        """The stored graph."""
        ...

    def stage(self, stage_id: str) -> StageView:
        """One stage."""
        ...

    def stages(self) -> dict[str, StageView]:
        """Every stage."""
        ...

    def checkpoints(self, *, limit: int | None = None) -> list[CheckpointInfo]:
        """Checkpoints, newest first."""
        ...

    def pending_ack_snapshots(self) -> list[tuple[int, str, bool, StageSnapshot]]:
        """Acknowledgements of pending checkpoints (what gc must keep)."""
        ...
