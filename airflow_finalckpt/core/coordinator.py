"""Where the coordinator used to live: a re-export for old imports.

The coordinator is split (issue 15): the values it answers with are in ``core.views``, its rules
in ``core.transitions*``, its SQL in ``store/`` and the ``Coordinator`` facade in
``airflow_finalckpt.coordination``. Import from there.
"""

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
