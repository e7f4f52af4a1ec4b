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


# ------------------------------------------------------------------ split sets (issue 37)


def _record_with(stage_sets: dict[str, dict[str, object]]) -> bytes:
    """A real version 2 ``_metadata`` whose PARTIALLY_FINISHED stages hold ``stage_sets``
    (written honestly, then the sets swapped in and the envelope resealed)."""
    import json

    from airflow_finalckpt.core.graph import StageGraph
    from airflow_finalckpt.core.metadata import dump_metadata
    from airflow_finalckpt.core.metadata.envelope import body_checksum
    from airflow_finalckpt.core.model import (
        CheckpointKind,
        CheckpointRecord,
        StageCheckpointRecord,
        StageStatus,
        TriggerReason,
    )

    graph = StageGraph.from_edges(sorted(stage_sets), [])
    record = CheckpointRecord(
        pipeline_key="p",
        checkpoint_id=1,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.MANUAL,
        graph=graph.to_dict(),
        graph_fingerprint=graph.fingerprint,
        triggered_at=1.0,
        completed_at=2.0,
        stages={
            sid: StageCheckpointRecord(
                stage_id=sid, status=StageStatus.PARTIALLY_FINISHED, finished_splits={"x"}
            )
            for sid in stage_sets
        },
    )
    document = json.loads(dump_metadata(record))
    for sid, split_set in stage_sets.items():
        document["body"]["stages"][sid]["finished_splits"] = split_set
    document["sha256"] = body_checksum(document["body"])
    return json.dumps(document).encode()


def test_a_split_set_bomb_is_refused_while_it_expands() -> None:
    """7 KB that once took 127 MB (2,000 ids sharing 60,000 characters): refused in one line
    once the ids pass MAX_DECODED_SPLIT_BYTES, before its fingerprint is even hashed."""
    import time

    from tests.split_set_bombs import bomb_split_set

    data = _record_with({"enrich": bomb_split_set(2_000, 60_000)})
    assert len(data) < 10_000
    start = time.monotonic()
    with pytest.raises(MetadataError, match="the split ids expand beyond") as refused:
        load_metadata(data, source="chk-1/_metadata")
    assert time.monotonic() - start < 1.0
    message = str(refused.value)
    assert "\n" not in message and "stage 'enrich'" in message and "chk-1/_metadata" in message


def test_the_split_sets_of_one_file_share_one_budget() -> None:
    """Three sets of 25 MiB each decode alone, not together: many small bombs in one file add
    up to one refusal."""
    from airflow_finalckpt.core.metadata.compact import DecodeBudget, decode_split_set
    from tests.split_set_bombs import bomb_split_set

    one = bomb_split_set(400, 64 * 1024, honest_sha256=True)  # 400 ids of 64 KiB: 25 MiB
    assert len(decode_split_set(one)) == 400
    budget = DecodeBudget()
    decode_split_set(one, budget=budget)
    assert budget.left < budget.limit - (25 << 20)
    with pytest.raises(MetadataError, match="expand beyond"):
        load_metadata(_record_with({"a": one, "b": one, "c": one}))


def test_the_envelope_checksum_is_checked_before_any_set_expands() -> None:
    import json

    from tests.split_set_bombs import bomb_split_set

    document = json.loads(_record_with({"enrich": bomb_split_set(40_000, 60_000)}))
    document["sha256"] = "0" * 64  # as corruption leaves it; the bomb is never expanded
    with pytest.raises(MetadataError, match="fails its checksum"):
        load_metadata(json.dumps(document).encode())


def test_a_stated_count_that_cannot_fit_is_refused_before_inflating() -> None:
    from airflow_finalckpt.core.metadata.compact import (
        MAX_DECODED_SPLIT_BYTES,
        SPLIT_ID_OVERHEAD,
        decode_split_set,
        encode_split_set,
    )

    encoded = encode_split_set({"a", "b"})
    encoded["count"] = MAX_DECODED_SPLIT_BYTES // SPLIT_ID_OVERHEAD + 1
    with pytest.raises(MetadataError, match="expand beyond"):
        decode_split_set(encoded)
    encoded["count"] = 3
    with pytest.raises(MetadataError, match="states 3 splits but holds 2"):
        decode_split_set(encoded)


def test_the_fingerprint_hashed_in_chunks_is_the_fingerprint_of_the_set() -> None:
    from airflow_finalckpt.core.metadata.compact import (
        decode_split_set,
        encode_split_set,
        split_set_fingerprint,
    )

    ids = {f's3a://bucket/\u00e9t\u00e9/"{k:06d}"/part-{k:05d}.parquet' for k in range(40_000)}
    encoded = encode_split_set(ids)  # 2.5 MB of canonical JSON: three chunks
    assert encoded["sha256"] == split_set_fingerprint(ids)
    assert decode_split_set(encoded) == ids
