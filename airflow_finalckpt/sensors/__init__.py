"""Sensors of airflow-finalckpt."""

from __future__ import annotations

from airflow_finalckpt.sensors.final_checkpoint import FinalCheckpointSensor

__all__ = ["FinalCheckpointSensor"]
