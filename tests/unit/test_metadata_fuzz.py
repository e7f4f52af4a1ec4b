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


@st.composite
def mangled_bodies(draw: st.DrawFn) -> Any:
    """The golden body with one value somewhere replaced by random JSON: reaches the schema."""
    body = json.loads(VALID)["body"]
    node = body
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        if not isinstance(node[key], dict | list) or not node[key]:
            node[key] = draw(json_values)
            return body
        node = node[key]
    if isinstance(node, dict):
        node[draw(st.text(max_size=6))] = draw(json_values)
    elif isinstance(node, list):
        node.append(draw(json_values))
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
    assert loaded is None or isinstance(loaded, CheckpointRecord)
