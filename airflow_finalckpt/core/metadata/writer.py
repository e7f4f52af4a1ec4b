"""The port through which the coordinator persists and discards completed checkpoints."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from airflow_finalckpt.core.model import CheckpointRecord


@runtime_checkable
class CheckpointWriter(Protocol):
    """Checkpoint storage as the coordinator sees it (storage.CheckpointStorage implements it)."""

    def write_checkpoint(self, record: CheckpointRecord) -> tuple[str, int]:
        """Durably write the record's ``_metadata``; returns (metadata path, size in bytes)."""
        ...

    def discard_checkpoint(self, metadata_path: str) -> None:
        """Delete a checkpoint (metadata first, then its directory); idempotent."""
        ...
