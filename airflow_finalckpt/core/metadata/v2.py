"""Body schema of metadata format version 2 and the pure upgrade from version 1. Frozen: never
change it, add a version instead.

What changed against version 1 (issue 16: a checkpoint costs what is running, not the graph):

- ``fully_finished``: the FULLY_FINISHED stages, packed (``compact.pack_json``) as
  ``{stage_id: FinishedStageV2}``: the flag, ``end_of_data`` (with its manifest), the
  transactions still to commit, the final watermark and how many splits finished. No split
  ids and no state: a fully finished stage is restored from the flag and its end_of_data alone.
- ``stages``: the stages with progress or state (RUNNING, PARTIALLY_FINISHED, and NOT_STARTED
  ones that carry anything), readable; finished split ids as a compact split set
  (``compact.encode_split_set``: front-coded, compressed, with the set's sha256 fingerprint)
  and the fingerprint of the split list the stage declared (``split_list_sha256``, so a
  changed split list is detected on restore; "unknown" (null) when upgraded from version 1).
- ``not_started``: the ids of the NOT_STARTED stages that carry nothing.
- ``graph``: packed (it is O(stages) and only read on restore).

Sub-schemas that did not change (state handles, transactions, end_of_data) are version 1's.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from airflow_finalckpt.core.metadata.compact import encode_split_set, pack_json
from airflow_finalckpt.core.metadata.v1 import (
    CheckpointBodyV1,
    EndOfDataV1,
    SinkTransactionV1,
    StageV1,
    StateHandleV1,
)

VERSION = 2

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_SHA256 = r"^[0-9a-f]{64}$"


class _V2Model(BaseModel):
    # strict: JSON types must match exactly (no "5" for 5, no 1.0 for an id).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class SplitSetV2(_V2Model):
    """Finished split ids, front-coded and compressed (see ``compact``)."""

    encoding: Literal["front-coded+zlib+base64"]
    count: int = Field(ge=1)
    sha256: str = Field(pattern=_SHA256)
    data: str


class PackedV2(_V2Model):
    """A JSON value, compressed (see ``compact``)."""

    encoding: Literal["zlib+base64"]
    size: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    data: str


class FinishedStageV2(_V2Model):
    """A FULLY_FINISHED stage: ``finished_count`` None when the writer did not know it."""

    finished_count: int | None = Field(ge=0)
    pending_transactions: list[SinkTransactionV1]
    watermark: int | None = Field(ge=_INT64_MIN, le=_INT64_MAX)
    end_of_data: EndOfDataV1 | None


#: Validates the unpacked ``fully_finished`` value.
FINISHED_STAGES = TypeAdapter(dict[str, FinishedStageV2])


class StageV2(_V2Model):
    """A stage that is not fully finished; ``finished_splits`` None: none finished."""

    status: Literal["PARTIALLY_FINISHED", "RUNNING", "NOT_STARTED"]
    finished_splits: SplitSetV2 | None
    state: list[StateHandleV1]
    pending_transactions: list[SinkTransactionV1]
    watermark: int | None = Field(ge=_INT64_MIN, le=_INT64_MAX)
    end_of_data: EndOfDataV1 | None
    #: sha256 of the split list the stage declared, in declared order (``core.split_list``);
    #: None: not known (written before it was kept, or upgraded from version 1).
    split_list_sha256: str | None = Field(pattern=_SHA256)


class CheckpointBodyV2(_V2Model):
    """The body of a version 2 ``_metadata``."""

    pipeline_key: str
    checkpoint_id: int = Field(ge=1)
    kind: Literal["checkpoint", "savepoint", "drained_savepoint"]
    reason: Literal["periodic", "eager_final", "savepoint", "drain", "manual"]
    graph: PackedV2
    graph_fingerprint: str
    triggered_at: float = Field(allow_inf_nan=False)
    completed_at: float = Field(allow_inf_nan=False)
    fully_finished: PackedV2
    stages: dict[str, StageV2]
    not_started: list[str]

    @field_validator("not_started")
    @classmethod
    def _sorted_and_unique(cls, ids: list[str]) -> list[str]:
        """Sorted, unique ids make the file diffable and its checksum deterministic."""
        if any(a >= b for a, b in pairwise(ids)):
            raise ValueError("not_started must be sorted and free of duplicates")
        return ids


def _finished_v1_to_v2(stage: StageV1) -> dict[str, Any]:
    return {
        "finished_count": len(stage.finished_splits),
        "pending_transactions": [t.model_dump(mode="json") for t in stage.pending_transactions],
        "watermark": stage.watermark,
        "end_of_data": None if stage.end_of_data is None else stage.end_of_data.model_dump(),
    }


def _stage_v1_to_v2(stage: StageV1) -> dict[str, Any]:
    splits = stage.finished_splits
    return {
        "status": stage.status,
        "finished_splits": encode_split_set(splits) if splits else None,
        "state": [h.model_dump() for h in stage.state],
        "pending_transactions": [t.model_dump(mode="json") for t in stage.pending_transactions],
        "watermark": stage.watermark,
        "end_of_data": None if stage.end_of_data is None else stage.end_of_data.model_dump(),
        "split_list_sha256": None,
    }


def _is_bare(stage: StageV1) -> bool:
    """A NOT_STARTED stage carrying nothing: only its id is listed."""
    return stage.status == "NOT_STARTED" and stage.model_dump() == {
        "status": "NOT_STARTED",
        "finished_splits": [],
        "state": [],
        "pending_transactions": [],
        "watermark": None,
        "end_of_data": None,
    }


def upgrade_v1_to_v2(body: CheckpointBodyV1) -> CheckpointBodyV2:
    """A version 1 body in version 2: fully finished stages lose their split ids (kept as a
    count), finished split sets become compact, the graph is packed. Pure: no I/O.
    """
    finished = {s: v for s, v in body.stages.items() if v.status == "FULLY_FINISHED"}
    others = {s: v for s, v in body.stages.items() if v.status != "FULLY_FINISHED"}
    return CheckpointBodyV2.model_validate(
        {
            "pipeline_key": body.pipeline_key,
            "checkpoint_id": body.checkpoint_id,
            "kind": body.kind,
            "reason": body.reason,
            "graph": pack_json(body.graph),
            "graph_fingerprint": body.graph_fingerprint,
            "triggered_at": body.triggered_at,
            "completed_at": body.completed_at,
            "fully_finished": pack_json(
                {sid: _finished_v1_to_v2(v) for sid, v in sorted(finished.items())}
            ),
            "stages": {
                sid: _stage_v1_to_v2(v) for sid, v in sorted(others.items()) if not _is_bare(v)
            },
            "not_started": sorted(sid for sid, v in others.items() if _is_bare(v)),
        }
    )
