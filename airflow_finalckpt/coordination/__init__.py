"""The checkpoint coordinator and the values it answers with (one import for callers)."""

from airflow_finalckpt.coordination.coordinator import Coordinator
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.views import (
    AckOutcome,
    BatchOutcome,
    CheckpointInfo,
    CoordinatorOptions,
    FinishOutcome,
    PipelineSnapshot,
    StageView,
    StartOutcome,
    StopRequest,
    WaitingStage,
    draining,
    suspends,
)

__all__ = [
    "AckOutcome",
    "BatchOutcome",
    "CheckpointInfo",
    "CheckpointWriter",
    "Coordinator",
    "CoordinatorOptions",
    "FinishOutcome",
    "PipelineSnapshot",
    "StageView",
    "StartOutcome",
    "StopRequest",
    "WaitingStage",
    "draining",
    "suspends",
]
