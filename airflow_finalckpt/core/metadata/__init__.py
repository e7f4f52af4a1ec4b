"""Versioned checkpoint metadata: the ``_metadata`` file of every checkpoint and savepoint.

A file is a self-describing JSON document::

    {"format": "airflow-finalckpt/checkpoint-metadata", "version": 1,
     "sha256": "<sha256 of the canonical body>", "body": {...}}

Metadata is data, never code: plain JSON validated by a per-version pydantic schema.

Adding version 2 (see MetadataFormat):
  1. add ``v2.py`` with ``CheckpointBodyV2`` and a pure ``upgrade_v1_to_v2(CheckpointBodyV1)``;
  2. point ``codec.py`` at the version 2 body;
  3. append ``BodyVersion(2, CheckpointBodyV2, upgrade_v1_to_v2)`` to DEFAULT_FORMAT below;
  4. commit a golden v2 file next to the v1 ones in tests/fixtures/metadata/; keep v1's.
"""

from __future__ import annotations

from airflow_finalckpt.core.metadata.codec import body_to_record, record_to_body
from airflow_finalckpt.core.metadata.envelope import FORMAT_TAG, body_checksum, canonical_json
from airflow_finalckpt.core.metadata.registry import (
    BodyVersion,
    MetadataFormat,
    describe_validation_error,
)
from airflow_finalckpt.core.metadata.v1 import CheckpointBodyV1
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import CheckpointRecord

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_FORMAT",
    "FORMAT_TAG",
    "BodyVersion",
    "CheckpointWriter",
    "MetadataFormat",
    "body_checksum",
    "canonical_json",
    "describe_validation_error",
    "dump_metadata",
    "load_metadata",
]

#: What this airflow-finalckpt reads (versions 1..CURRENT_VERSION) and writes (CURRENT_VERSION).
DEFAULT_FORMAT = MetadataFormat(
    versions=(BodyVersion(1, CheckpointBodyV1),),
    encode=record_to_body,
    decode=body_to_record,
)

CURRENT_VERSION: int = DEFAULT_FORMAT.current_version


def dump_metadata(record: CheckpointRecord) -> bytes:
    """The record as ``_metadata`` bytes in the current format version."""
    return DEFAULT_FORMAT.dump(record)


def load_metadata(data: bytes, *, source: str = "<bytes>") -> CheckpointRecord:
    """Read ``_metadata`` bytes of any supported version; raises MetadataError naming ``source``."""
    return DEFAULT_FORMAT.load(data, source=source)
