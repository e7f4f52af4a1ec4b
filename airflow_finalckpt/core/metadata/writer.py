"""The port through which the coordinator persists and discards completed checkpoints."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from airflow_finalckpt.core.model import CheckpointRecord


@runtime_checkable
class CheckpointWriter(Protocol):
    """Checkpoint storage as the coordinator sees it (storage.CheckpointStorage implements it)."""

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        """Durably write the record's ``_metadata``; returns (metadata path, size in bytes).

        ``replace_orphan``: the id was never completed, so an existing directory of it is a
        leftover of a failed or rolled-back completion and is replaced (else: refused).
        """
        ...

    def discard_checkpoint(self, metadata_path: str) -> None:
        """Delete a checkpoint (metadata first, then its directory); idempotent."""
        ...

    def discard_checkpoint_dir(self, pipeline_key: str, checkpoint_id: int) -> None:
        """Delete ``chk-<id>`` (complete or not), metadata first; idempotent."""
        ...

    def checkpoint_dir_ids(self, pipeline_key: str) -> list[int]:
        """Ids of every ``chk-<id>`` directory of the pipeline, with or without ``_metadata``."""
        ...
