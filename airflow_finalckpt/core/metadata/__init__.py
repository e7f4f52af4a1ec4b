"""Versioned checkpoint metadata: the ``_metadata`` file of every checkpoint and savepoint.

A file is a self-describing JSON document::

    {"format": "airflow-finalckpt/checkpoint-metadata", "version": 2,
     "sha256": "<sha256 of the canonical body>", "body": {...}}

Metadata is data, never code: plain JSON validated by a per-version pydantic schema. Version 2
(``v2.py``) is written; version 1 (``v1.py``) is read through the pure ``upgrade_v1_to_v2``.

Adding version 3 (see MetadataFormat):
  1. add ``v3.py`` with ``CheckpointBodyV3`` and a pure ``upgrade_v2_to_v3(CheckpointBodyV2)``;
  2. point ``codec.py`` at the version 3 body;
  3. append ``BodyVersion(3, CheckpointBodyV3, upgrade_v2_to_v3)`` to DEFAULT_FORMAT below;
  4. commit golden v3 files next to the older ones in tests/fixtures/metadata/; keep theirs.
"""

from __future__ import annotations

from airflow_finalckpt.core.metadata.codec import as_kept, body_to_record, record_to_body
from airflow_finalckpt.core.metadata.envelope import FORMAT_TAG, body_checksum, canonical_json
from airflow_finalckpt.core.metadata.registry import (
    BodyVersion,
    MetadataFormat,
    describe_validation_error,
)
from airflow_finalckpt.core.metadata.v1 import CheckpointBodyV1
from airflow_finalckpt.core.metadata.v2 import CheckpointBodyV2, upgrade_v1_to_v2
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import CheckpointRecord

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_FORMAT",
    "FORMAT_TAG",
    "BodyVersion",
    "CheckpointWriter",
    "MetadataFormat",
    "as_kept",
    "body_checksum",
    "canonical_json",
    "describe_validation_error",
    "dump_metadata",
    "load_metadata",
    "load_metadata_versioned",
    "metadata_version",
]

#: What this airflow-finalckpt reads (versions 1..CURRENT_VERSION) and writes (CURRENT_VERSION).
DEFAULT_FORMAT = MetadataFormat(
    versions=(
        BodyVersion(1, CheckpointBodyV1),
        BodyVersion(2, CheckpointBodyV2, upgrade_v1_to_v2, indent=None),
    ),
    encode=record_to_body,
    decode=body_to_record,
)

CURRENT_VERSION: int = DEFAULT_FORMAT.current_version


def dump_metadata(record: CheckpointRecord) -> bytes:
    """The record as ``_metadata`` bytes in the current format version (which keeps
    ``as_kept(record)``).
    """
    return DEFAULT_FORMAT.dump(record)


def metadata_version(data: bytes, *, source: str = "<bytes>") -> int:
    """The format version a ``_metadata`` file was written in (after checking it whole)."""
    return DEFAULT_FORMAT.read_body(data, source=source)[1]


def load_metadata_versioned(
    data: bytes, *, source: str = "<bytes>"
) -> tuple[CheckpointRecord, int]:
    """As :func:`load_metadata`, with the version the file was written in."""
    return DEFAULT_FORMAT.load_versioned(data, source=source)


def load_metadata(data: bytes, *, source: str = "<bytes>") -> CheckpointRecord:
    """Read ``_metadata`` bytes of any supported version; raises MetadataError naming ``source``."""
    return DEFAULT_FORMAT.load(data, source=source)
