"""Triggers of airflow-finalckpt (run in Airflow's triggerer; importable by their classpath)."""

from __future__ import annotations

from airflow_finalckpt.triggers.final_checkpoint import (
    FinalCheckpointTrigger,
    StageClosedTrigger,
    StageResumeTrigger,
)

__all__ = ["FinalCheckpointTrigger", "StageClosedTrigger", "StageResumeTrigger"]
