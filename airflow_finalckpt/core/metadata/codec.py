"""Mapping between the in-memory CheckpointRecord and the body of the *current* format version.

Only the current version needs this mapping: older versions reach it through the upgrade chain.
When a version 2 is added, this module switches to the version 2 body and v1.py stays as is.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata.v1 import CheckpointBodyV1, StageV1
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


def _stage_to_json(stage: StageCheckpointRecord) -> dict[str, Any]:
    eod = stage.end_of_data
    return {
        "status": stage.status.value,
        "finished_splits": sorted(stage.finished_splits),
        "state": [
            {"name": h.name, "path": h.path, "size": h.size, "sha256": h.sha256}
            for h in stage.state
        ],
        "pending_transactions": [
            {
                "sink_id": t.sink_id,
                "txn_id": t.txn_id,
                "checkpoint_id": t.checkpoint_id,
                "payload": dict(t.payload),
            }
            for t in stage.pending_transactions
        ],
        "watermark": stage.watermark,
        "end_of_data": None
        if eod is None
        else {
            "drain": eod.drain,
            "manifest": list(eod.manifest),
            "watermark": eod.watermark,
            "finished_at_checkpoint": eod.finished_at_checkpoint,
            "unread_splits": eod.unread_splits,
        },
    }


def record_to_body(record: CheckpointRecord) -> CheckpointBodyV1:
    """Encode a record; raises pydantic's ValidationError (with full field paths) if it has
    no JSON form.
    """
    for key, stage in record.stages.items():
        if stage.stage_id != key:
            raise MetadataError(
                f"cannot write checkpoint {record.checkpoint_id} of pipeline "
                f"{record.pipeline_key!r}: stages[{key!r}] holds stage {stage.stage_id!r}; "
                "a stage must be stored under its own stage_id"
            )
    return CheckpointBodyV1.model_validate(
        {
            "pipeline_key": record.pipeline_key,
            "checkpoint_id": record.checkpoint_id,
            "kind": record.kind.value,
            "reason": record.reason.value,
            "graph": dict(record.graph),
            "graph_fingerprint": record.graph_fingerprint,
            "triggered_at": record.triggered_at,
            "completed_at": record.completed_at,
            "stages": {key: _stage_to_json(stage) for key, stage in sorted(record.stages.items())},
        }
    )


def _stage_to_record(stage_id: str, stage: StageV1) -> StageCheckpointRecord:
    eod = stage.end_of_data
    return StageCheckpointRecord(
        stage_id=stage_id,
        status=StageStatus(stage.status),
        finished_splits=frozenset(stage.finished_splits),
        state=tuple(StateHandle(**h.model_dump()) for h in stage.state),
        pending_transactions=tuple(
            SinkTransaction(**t.model_dump()) for t in stage.pending_transactions
        ),
        watermark=stage.watermark,
        end_of_data=None if eod is None else EndOfData(**eod.model_dump()),
    )


def body_to_record(body: CheckpointBodyV1) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline_key=body.pipeline_key,
        checkpoint_id=body.checkpoint_id,
        kind=CheckpointKind(body.kind),
        reason=TriggerReason(body.reason),
        graph=dict(body.graph),
        graph_fingerprint=body.graph_fingerprint,
        triggered_at=body.triggered_at,
        completed_at=body.completed_at,
        stages={sid: _stage_to_record(sid, stage) for sid, stage in body.stages.items()},
    )
