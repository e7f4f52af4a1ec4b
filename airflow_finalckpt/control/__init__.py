"""Operator controls (stop with drain / savepoint, resume, restore checks, status), Airflow-free.

The REST API, the UI page and the ``finalckpt`` CLI are thin adapters over ``PipelineControl``,
so all three give the same answers and the same errors.
"""

from airflow_finalckpt.control.reset import ResetSummary, reset_stage
from airflow_finalckpt.control.service import (
    CheckpointSummary,
    PipelineControl,
    PipelineDetail,
    PipelineRunSummary,
    RestoreCheck,
    StageSummary,
    StopSummary,
    check_stages,
    dag_stage_graph,
)
from airflow_finalckpt.control.split_lists import dag_declared_splits
from airflow_finalckpt.control.states import PipelineRunState

__all__ = [
    "CheckpointSummary",
    "PipelineControl",
    "PipelineDetail",
    "PipelineRunState",
    "PipelineRunSummary",
    "ResetSummary",
    "RestoreCheck",
    "StageSummary",
    "StopSummary",
    "check_stages",
    "dag_declared_splits",
    "dag_stage_graph",
    "reset_stage",
]
