"""Bounded reads of checkpoint storage (issue 27): an oversized ``_metadata`` file and a packed
value that inflates beyond its cap are refused with the metadata errors, in one line, before
anything is parsed or inflated whole."""

from __future__ import annotations

import base64
import hashlib
import zlib
from pathlib import Path

import pytest

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata import load_metadata
from airflow_finalckpt.core.metadata.compact import (
    MAX_UNPACKED_BYTES,
    PACKED_ENCODING,
    unpack_json,
)
from airflow_finalckpt.core.metadata.registry import MAX_METADATA_BYTES
from airflow_finalckpt.storage import CheckpointStorage


def test_an_oversized_metadata_file_is_refused_unread(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    chk = tmp_path / "p" / "chk-1"
    chk.mkdir(parents=True)
    with open(chk / "_metadata", "wb") as out:  # sparse: no 64 MiB written to disk
        out.seek(MAX_METADATA_BYTES)
        out.write(b"}")
    with pytest.raises(MetadataError, match="refused unread") as refused:
        storage.read_checkpoint(str(chk))
    assert "\n" not in str(refused.value)
    with pytest.raises(MetadataError, match="more than the"):
        load_metadata(b" " * (MAX_METADATA_BYTES + 1))


def test_a_packed_value_inflating_beyond_its_cap_is_refused() -> None:
    bomb = b"[" + b"0," * (MAX_UNPACKED_BYTES // 2) + b"0]"  # 89 KB compressed
    packed = {
        "encoding": PACKED_ENCODING,
        "size": len(bomb),
        "sha256": hashlib.sha256(bomb).hexdigest(),
        "data": base64.b64encode(zlib.compress(bomb, 9)).decode(),
    }
    assert len(packed["data"]) < 200_000
    with pytest.raises(MetadataError, match="inflates beyond") as refused:
        unpack_json(packed, what="the graph")
    assert "\n" not in str(refused.value)


def test_a_symlinked_metadata_file_is_not_followed(tmp_path: Path) -> None:
    from airflow_finalckpt.core.errors import UnsafePathError

    outside = tmp_path / "outside"
    outside.write_bytes(b"{}")
    storage = CheckpointStorage(str(tmp_path / "root"))
    chk = tmp_path / "root" / "p" / "chk-1"
    chk.mkdir(parents=True)
    (chk / "_metadata").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symlink"):
        storage.read_checkpoint(str(chk))
