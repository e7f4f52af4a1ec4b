"""Incremental sources: a source stage's ``splits=`` that reads only what is new since the
last committed run (docs/sources.md). The range a run reads is recorded when it starts; the
source's cursor advances with the run's committed outputs (``core.source_cursor``).
"""

from airflow_finalckpt.sources.base import IncrementalSource, is_incremental_source
from airflow_finalckpt.sources.delta import DeltaAppends
from airflow_finalckpt.sources.iceberg import IcebergAppends
from airflow_finalckpt.sources.landing import LandingDirectory

__all__ = [
    "DeltaAppends",
    "IcebergAppends",
    "IncrementalSource",
    "LandingDirectory",
    "is_incremental_source",
]
