"""Checkpoint storage: ``_metadata`` files and state files under one fsspec root, confined."""

from __future__ import annotations

from airflow_finalckpt.storage.checkpoint_storage import CheckpointLocation, CheckpointStorage
from airflow_finalckpt.storage.paths import (
    METADATA_FILE_NAME,
    decode_run_id,
    encode_run_id,
    validate_pipeline_key,
    validate_state_path,
)

__all__ = [
    "METADATA_FILE_NAME",
    "CheckpointLocation",
    "CheckpointStorage",
    "decode_run_id",
    "encode_run_id",
    "validate_pipeline_key",
    "validate_state_path",
]
