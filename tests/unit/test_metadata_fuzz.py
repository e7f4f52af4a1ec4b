"""Fuzzing load_metadata: whatever the bytes, it returns the right record or raises MetadataError.

A reader that crashes with KeyError/TypeError/RecursionError on a damaged file would stop
restore from falling back to the previous checkpoint, so no other exception may ever escape.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata import FORMAT_TAG, load_metadata
from airflow_finalckpt.core.model import CheckpointRecord

GOLDEN = Path(__file__).parent.parent / "fixtures" / "metadata" / "v1"
VALID = (GOLDEN / "savepoint_all_statuses.json").read_bytes()
ORIGINAL = load_metadata(VALID)
SOURCE = "fuzz://chk-42/_metadata"

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_or_metadata_error(data: bytes) -> CheckpointRecord | None:
    """The loaded record, or None if load_metadata raised a MetadataError naming the source.

    Any other exception propagates and fails the test.
    """
    try:
        return load_metadata(data, source=SOURCE)
    except MetadataError as exc:
        assert SOURCE in str(exc), str(exc)
        return None


def assert_original_or_refused(data: bytes) -> None:
    loaded = load_or_metadata_error(data)
    assert loaded is None or loaded == ORIGINAL


def test_the_fuzzed_file_is_valid_to_begin_with() -> None:
    assert load_or_metadata_error(VALID) == ORIGINAL
    # the oracle of the structured fuzzing agrees with the reader on the untouched file
    assert _canonical(_said_by_record(ORIGINAL)) == _canonical(
        _said_by_body(json.loads(VALID)["body"])
    )


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_are_refused(data: bytes) -> None:
    assert load_or_metadata_error(data) is None


@FUZZ
@given(st.integers(min_value=0, max_value=len(VALID) - 1), st.integers(0, 255))
def test_single_byte_replacement(position: int, value: int) -> None:
    data = bytearray(VALID)
    data[position] = value
    assert_original_or_refused(bytes(data))


@FUZZ
@given(st.integers(min_value=0, max_value=len(VALID) - 1))
def test_single_byte_deletion(position: int) -> None:
    assert_original_or_refused(VALID[:position] + VALID[position + 1 :])


@FUZZ
@given(st.integers(min_value=0, max_value=len(VALID)), st.integers(0, 255))
def test_single_byte_insertion(position: int, value: int) -> None:
    assert_original_or_refused(VALID[:position] + bytes([value]) + VALID[position:])


@FUZZ
@given(st.integers(min_value=0, max_value=len(VALID) - 1))
def test_truncation(length: int) -> None:
    assert_original_or_refused(VALID[:length])


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


#: Values a lax reader would take for another type: "5" or 5.0 for 5, true for 1, a split id
#: that breaks the sorted order.
look_alikes = (
    st.integers(-3, 50).map(float)
    | st.integers(-3, 50).map(str)
    | st.booleans()
    | st.sampled_from(["", "a", "part-0000", "part-0001"])
)


@st.composite
def mangled_bodies(draw: st.DrawFn) -> Any:
    """The golden body with one value somewhere replaced by random JSON or a look-alike of
    another type: reaches the schema."""
    body = json.loads(VALID)["body"]
    values = json_values | look_alikes
    node = body
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        if not isinstance(node[key], dict | list) or not node[key]:
            node[key] = draw(values)
            return body
        node = node[key]
    if isinstance(node, dict):
        node[draw(st.text(max_size=6))] = draw(values)
    elif isinstance(node, list):
        node.append(draw(values))
    return body


@FUZZ
@given(
    body=mangled_bodies() | json_values,
    version=st.just(1) | json_values,
    tag=st.just(FORMAT_TAG) | json_values,
)
def test_structured_documents_with_valid_checksums(body: Any, version: Any, tag: Any) -> None:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    document = {
        "format": tag,
        "version": version,
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        "body": body,
    }
    loaded = load_or_metadata_error(json.dumps(document).encode())
    if loaded is None:
        return
    # accepted: the document is a version 1 file and the record says exactly what it says
    assert tag == FORMAT_TAG and type(version) is int and version == 1, (tag, version)
    assert _canonical(_said_by_record(loaded)) == _canonical(_said_by_body(body)), body


#: What a version 1 stage states, field by field (docs/protocol.md's metadata format).
_STAGE_FIELDS = ("status", "finished_splits", "state", "pending_transactions", "watermark")
_TIMESTAMPS = ("triggered_at", "completed_at")


def _said_by_body(body: Any) -> Any:
    """What a version 1 body states, as plain JSON, after what version 2 keeps of it: a fully
    finished stage is a flag with a count of its splits (no ids, no state). Unknown keys stay
    in, so a reader that dropped them would not say the same; the timestamps are JSON numbers
    of a float field (5 and 5.0 mean the same there, and only there)."""
    said = dict(body)
    for key in _TIMESTAMPS:
        if type(said.get(key)) in (int, float):
            said[key] = float(said[key])
    stages = said.get("stages")
    if isinstance(stages, dict):
        said["stages"] = {sid: _finished_as_flag(stage) for sid, stage in stages.items()}
    return said


def _finished_as_flag(stage: Any) -> Any:
    if not isinstance(stage, dict) or stage.get("status") != "FULLY_FINISHED":
        return stage
    splits = stage.get("finished_splits")
    return {
        **stage,
        "finished_splits": len(splits) if isinstance(splits, list) else splits,
        "state": [],
    }


def _said_by_record(record: CheckpointRecord) -> dict[str, Any]:
    """The same statement read back from the loaded record (only the fields version 1 has)."""
    dumped = record.model_dump(mode="json")
    stages = {}
    for sid, stage in dumped["stages"].items():
        said = {key: stage[key] for key in _STAGE_FIELDS}
        said["end_of_data"] = stage["end_of_data"]
        if stage["status"] == "FULLY_FINISHED":
            said["finished_splits"] = stage["finished_count"]
        stages[sid] = said
    return {**{k: v for k, v in dumped.items() if k != "stages"}, "stages": stages}


def _canonical(value: Any) -> str:
    """JSON text, types kept: true is not 1, 1.0 is not 1 (Python's == would say they are)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=True)
