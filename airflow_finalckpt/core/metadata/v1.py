"""Body schema of metadata format version 1. Frozen: never change it, add a version instead.

This schema deliberately does not reuse the in-memory model classes: the model may evolve, the
bytes of version 1 on disk may not. Every field is required, so a file states everything.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

VERSION = 1

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class _V1Model(BaseModel):
    # strict: JSON types must match exactly (no "5" for 5, no 1.0 for an id).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class StateHandleV1(_V1Model):
    """A state file: its path under the pipeline directory, size and sha256."""

    name: str
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class SinkTransactionV1(_V1Model):
    """A pre-committed sink transaction and the checkpoint that covers it."""

    sink_id: str
    txn_id: str
    checkpoint_id: int | None
    payload: dict[str, JsonValue]


class EndOfDataV1(_V1Model):
    """What a finished stage publishes downstream."""

    drain: bool
    manifest: list[str]
    watermark: int = Field(ge=_INT64_MIN, le=_INT64_MAX)
    finished_at_checkpoint: int | None
    unread_splits: int


class StageV1(_V1Model):
    """One stage, whatever its status, with its finished split ids."""

    status: Literal["FULLY_FINISHED", "PARTIALLY_FINISHED", "RUNNING", "NOT_STARTED"]
    finished_splits: list[str]
    state: list[StateHandleV1]
    pending_transactions: list[SinkTransactionV1]
    watermark: int | None = Field(ge=_INT64_MIN, le=_INT64_MAX)
    end_of_data: EndOfDataV1 | None

    @field_validator("finished_splits")
    @classmethod
    def _sorted_and_unique(cls, splits: list[str]) -> list[str]:
        """Sorted, unique ids make the file diffable and its checksum deterministic."""
        if any(a >= b for a, b in pairwise(splits)):
            raise ValueError("finished_splits must be sorted and free of duplicates")
        return splits


class CheckpointBodyV1(_V1Model):
    """The body of a version 1 ``_metadata`` (documentation only changes here)."""

    pipeline_key: str
    checkpoint_id: int = Field(ge=1)
    kind: Literal["checkpoint", "savepoint", "drained_savepoint"]
    reason: Literal["periodic", "eager_final", "savepoint", "drain", "manual"]
    graph: dict[str, JsonValue]
    graph_fingerprint: str
    triggered_at: float = Field(allow_inf_nan=False)
    completed_at: float = Field(allow_inf_nan=False)
    stages: dict[str, StageV1]
