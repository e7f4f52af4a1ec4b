"""What one attempt of a stage task produced, and the pipeline options every attempt writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_finalckpt.coordination import CoordinatorOptions
from airflow_finalckpt.runtime.runner import RunResult, StageCloser


@dataclass
class StageRun:
    """What running an attempt produced: its result, its epoch, whether Spark was used, and
    the closer that commits and closes the stage once its final checkpoint completed.
    """

    result: RunResult
    epoch: int | None
    closer: StageCloser
    spark_started: bool


def coordinator_options(settings: Any) -> CoordinatorOptions:
    """The pipeline's retention and checkpoint timeout from ``[finalckpt]`` (every stage start
    writes them, so a changed setting applies from the next stage on).
    """
    return CoordinatorOptions(
        retain_checkpoints=int(settings.retain_checkpoints),
        checkpoint_timeout_s=float(settings.checkpoint_timeout_s),
    )
