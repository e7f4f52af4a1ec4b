"""Checkpoint metadata format: round trips, golden v1 files read through the v1->v2 upgrade,
version upgrades, clear errors. (The v2 body and its compact values: test_metadata_v2.py.)"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.errors import MetadataError, UnsupportedMetadataVersionError
from airflow_finalckpt.core.metadata import (
    CURRENT_VERSION,
    DEFAULT_FORMAT,
    FORMAT_TAG,
    BodyVersion,
    MetadataFormat,
    as_kept,
    dump_metadata,
    load_metadata,
)
from airflow_finalckpt.core.metadata.codec import body_to_record, record_to_body
from airflow_finalckpt.core.metadata.compact import unpack_json
from airflow_finalckpt.core.metadata.v1 import CheckpointBodyV1
from airflow_finalckpt.core.metadata.v2 import CheckpointBodyV2
from airflow_finalckpt.core.model import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    SinkTransaction,
    StageCheckpointRecord,
    StageStatus,
    StateHandle,
    TriggerReason,
)

GOLDEN_V1 = Path(__file__).parent.parent / "fixtures" / "metadata" / "v1"
GOLDEN_V2 = GOLDEN_V1.parent / "v2"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_record(**overrides: Any) -> CheckpointRecord:
    fields: dict[str, Any] = {
        "pipeline_key": "orders",
        "checkpoint_id": 7,
        "kind": CheckpointKind.CHECKPOINT,
        "reason": TriggerReason.PERIODIC,
        "graph": {"stages": [{"stage_id": "a", "upstream": [], "task_id": None}]},
        "graph_fingerprint": sha("graph"),
        "triggered_at": 1_767_225_600.25,
        "completed_at": 1_767_225_601.75,
        "stages": {},
    }
    fields.update(overrides)
    return CheckpointRecord(**fields)


def make_stage(stage_id: str, status: StageStatus, **overrides: Any) -> StageCheckpointRecord:
    return StageCheckpointRecord(stage_id=stage_id, status=status, **overrides)


# -- the records the golden v1 files hold (written once, never regenerated) -----------------


def golden_savepoint_all_statuses() -> CheckpointRecord:
    graph = {
        "stages": [
            {"stage_id": "aggregate", "upstream": ["enrich"], "task_id": None},
            {"stage_id": "enrich", "upstream": ["extract"], "task_id": "enrich_task"},
            {"stage_id": "extract", "upstream": [], "task_id": None},
            {"stage_id": "publish", "upstream": ["aggregate"], "task_id": None},
        ]
    }
    return make_record(
        pipeline_key="orders_daily.v2",
        checkpoint_id=42,
        kind=CheckpointKind.SAVEPOINT,
        reason=TriggerReason.SAVEPOINT,
        graph=graph,
        graph_fingerprint=sha("orders_daily.v2 graph"),
        triggered_at=1_767_225_600.125,
        completed_at=1_767_225_601.5,
        stages={
            "extract": make_stage(
                "extract",
                StageStatus.FULLY_FINISHED,
                finished_splits=frozenset({"part-0001", "part-0000"}),
                pending_transactions=(
                    SinkTransaction(
                        sink_id="staging",
                        txn_id="extract-41",
                        checkpoint_id=41,
                        payload={"files": ["chk-41/extract/out-0.parquet"], "rows": 1200},
                    ),
                ),
                watermark=MAX_WATERMARK,
                end_of_data=EndOfData(
                    drain=False,
                    manifest=["chk-41/extract/out-0.parquet"],
                    watermark=MAX_WATERMARK,
                    finished_at_checkpoint=41,
                    unread_splits=0,
                ),
            ),
            "enrich": make_stage(
                "enrich",
                StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"part-0000"}),
                state=(
                    StateHandle(
                        name="window-state",
                        path="chk-42/enrich/state-0.json",
                        size=2048,
                        sha256=sha("enrich state"),
                    ),
                ),
                pending_transactions=(
                    SinkTransaction(
                        sink_id="lake",
                        txn_id="enrich-42",
                        checkpoint_id=42,
                        payload={"note": "café ✓", "ratio": 0.5, "nested": {"ok": True}},
                    ),
                ),
                watermark=1_767_225_000_000,
            ),
            "aggregate": make_stage(
                "aggregate",
                StageStatus.RUNNING,
                state=(
                    StateHandle(
                        name="windows",
                        path="chk-42/aggregate/windows.bin",
                        size=0,
                        sha256=sha(""),
                    ),
                ),
                pending_transactions=(
                    SinkTransaction(sink_id="lake", txn_id="aggregate-open", checkpoint_id=None),
                ),
                watermark=MIN_WATERMARK,
            ),
            "publish": make_stage("publish", StageStatus.NOT_STARTED),
        },
    )


def golden_drained_savepoint() -> CheckpointRecord:
    return make_record(
        pipeline_key="clicks",
        checkpoint_id=9,
        kind=CheckpointKind.DRAINED_SAVEPOINT,
        reason=TriggerReason.DRAIN,
        graph={"stages": [{"stage_id": "sessionize", "upstream": [], "task_id": None}]},
        graph_fingerprint=sha("clicks graph"),
        stages={
            "sessionize": make_stage(
                "sessionize",
                StageStatus.FULLY_FINISHED,
                finished_splits=frozenset({"2026-01-01", "2026-01-02"}),
                watermark=MAX_WATERMARK,
                end_of_data=EndOfData(drain=True, manifest=[], finished_at_checkpoint=9),
            )
        },
    )


def golden_checkpoint_no_stages() -> CheckpointRecord:
    return make_record(
        pipeline_key="empty",
        checkpoint_id=1,
        reason=TriggerReason.MANUAL,
        graph={"stages": []},
        graph_fingerprint=sha("[]"),
        triggered_at=0.0,
        completed_at=0.0,
    )


GOLDEN_FILES = {
    "savepoint_all_statuses.json": golden_savepoint_all_statuses,
    "drained_savepoint.json": golden_drained_savepoint,
    "checkpoint_no_stages.json": golden_checkpoint_no_stages,
}


def v1_document(name: str = "savepoint_all_statuses.json") -> dict[str, Any]:
    """A golden v1 file as JSON (the v1 files were written once by version 1's writer)."""
    document: dict[str, Any] = json.loads((GOLDEN_V1 / name).read_bytes())
    return document


# -- helpers to craft documents -------------------------------------------------------------


def document_of(record: CheckpointRecord) -> dict[str, Any]:
    return json.loads(dump_metadata(record))


def independent_checksum(body: Any) -> str:
    """The documented checksum, computed without the library's helpers."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def resealed(document: dict[str, Any]) -> bytes:
    """The document with a correct checksum, so only the change under test is wrong."""
    document = dict(document, sha256=independent_checksum(document["body"]))
    return json.dumps(document).encode()


def load_error(data: bytes, fmt: MetadataFormat = DEFAULT_FORMAT) -> str:
    with pytest.raises(MetadataError) as caught:
        fmt.load(data, source="/ckpt/p/chk-7/_metadata")
    message = str(caught.value)
    assert "/ckpt/p/chk-7/_metadata" in message, message
    return message


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "status"), list(itertools.product(CheckpointKind, StageStatus)))
def test_round_trip_every_kind_and_status(kind: CheckpointKind, status: StageStatus) -> None:
    stage = make_stage(
        "s1",
        status,
        finished_splits=frozenset({"b", "a"}) if status != StageStatus.NOT_STARTED else frozenset(),
        state=(StateHandle(name="st", path="chk-7/s1/state", size=12, sha256=sha("x")),),
        watermark=123,
        end_of_data=EndOfData(drain=True) if status == StageStatus.FULLY_FINISHED else None,
    )
    record = make_record(kind=kind, stages={"s1": stage})
    loaded = load_metadata(dump_metadata(record))
    assert loaded == as_kept(record)
    assert loaded.kind is kind
    assert loaded.stages["s1"].status is status


@pytest.mark.parametrize("reason", list(TriggerReason))
def test_every_trigger_reason_round_trips(reason: TriggerReason) -> None:
    record = make_record(reason=reason)
    assert load_metadata(dump_metadata(record)).reason is reason


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
watermarks = st.integers(min_value=MIN_WATERMARK, max_value=MAX_WATERMARK)
handles = st.builds(
    StateHandle,
    name=st.text(max_size=8),
    path=st.text(max_size=20),
    size=st.integers(min_value=0, max_value=2**40),
    sha256=st.binary(min_size=4, max_size=4).map(lambda b: hashlib.sha256(b).hexdigest()),
)
transactions = st.builds(
    SinkTransaction,
    sink_id=st.text(max_size=8),
    txn_id=st.text(max_size=8),
    checkpoint_id=st.none() | st.integers(min_value=1, max_value=10**6),
    payload=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
)
end_of_data = st.builds(
    EndOfData,
    drain=st.booleans(),
    manifest=st.lists(st.text(max_size=10), max_size=3),
    watermark=watermarks,
    finished_at_checkpoint=st.none() | st.integers(min_value=1, max_value=10**6),
    unread_splits=st.integers(min_value=0, max_value=100),
)


@st.composite
def records(draw: st.DrawFn) -> CheckpointRecord:
    stage_ids = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4, unique=True))
    stages = {
        sid: StageCheckpointRecord(
            stage_id=sid,
            status=draw(st.sampled_from(StageStatus)),
            finished_splits=draw(st.frozensets(st.text(max_size=6), max_size=4)),
            state=tuple(draw(st.lists(handles, max_size=2))),
            pending_transactions=tuple(draw(st.lists(transactions, max_size=2))),
            watermark=draw(st.none() | watermarks),
            end_of_data=draw(st.none() | end_of_data),
        )
        for sid in stage_ids
    }
    finite = st.floats(allow_nan=False, allow_infinity=False)
    return CheckpointRecord(
        pipeline_key=draw(st.text(max_size=12)),
        checkpoint_id=draw(st.integers(min_value=1, max_value=2**62)),
        kind=draw(st.sampled_from(CheckpointKind)),
        reason=draw(st.sampled_from(TriggerReason)),
        graph=draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        graph_fingerprint=draw(st.text(max_size=64)),
        triggered_at=draw(finite),
        completed_at=draw(finite),
        stages=stages,
    )


@settings(max_examples=150, deadline=None)
@given(records())
def test_generated_records_round_trip(record: CheckpointRecord) -> None:
    data = dump_metadata(record)
    assert load_metadata(data) == as_kept(record)
    assert dump_metadata(load_metadata(data)) == data


def test_dump_is_deterministic_whatever_the_in_memory_order() -> None:
    stages = {
        "b": make_stage("b", StageStatus.RUNNING, finished_splits=frozenset({"z", "a", "m"})),
        "a": make_stage("a", StageStatus.NOT_STARTED),
    }
    forward = make_record(stages=stages)
    backward = make_record(stages=dict(reversed(list(stages.items()))))
    assert dump_metadata(forward) == dump_metadata(backward)


def test_lone_surrogate_in_a_string_survives() -> None:
    record = make_record(graph_fingerprint="bad\ud800text")
    data = dump_metadata(record)
    assert data.isascii()
    assert load_metadata(data) == record


# -- the file is self-describing ------------------------------------------------------------


def test_file_is_a_self_describing_json_document() -> None:
    record = golden_savepoint_all_statuses()
    document = json.loads(dump_metadata(record))
    assert list(document) == ["format", "version", "sha256", "body"]
    assert document["format"] == "airflow-finalckpt/checkpoint-metadata" == FORMAT_TAG
    assert document["version"] == CURRENT_VERSION == 2
    assert document["sha256"] == independent_checksum(document["body"])
    body = document["body"]
    assert body["pipeline_key"] == "orders_daily.v2"
    assert body["checkpoint_id"] == 42
    assert body["kind"] == "savepoint"
    assert body["reason"] == "savepoint"
    assert unpack_json(body["graph"]) == record.graph
    assert body["graph_fingerprint"] == record.graph_fingerprint
    # fully finished stages: a flag, end_of_data and a count, no split ids
    finished = unpack_json(body["fully_finished"])
    assert list(finished) == ["extract"]
    assert finished["extract"]["finished_count"] == 2
    assert "finished_splits" not in finished["extract"]
    assert finished["extract"]["end_of_data"]["watermark"] == MAX_WATERMARK
    assert sorted(body["stages"]) == ["aggregate", "enrich"]
    assert body["stages"]["enrich"]["state"][0] == {
        "name": "window-state",
        "path": "chk-42/enrich/state-0.json",
        "size": 2048,
        "sha256": sha("enrich state"),
    }
    assert body["not_started"] == ["publish"]


# -- golden v1 files ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_v1_file_still_loads(name: str) -> None:
    data = (GOLDEN_V1 / name).read_bytes()
    assert json.loads(data)["version"] == 1
    assert load_metadata(data, source=name) == as_kept(GOLDEN_FILES[name]())


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_v1_schema_is_frozen(name: str) -> None:
    """Re-encoding a golden body with the v1 schema gives the same bytes: no field was added,
    renamed or re-typed in version 1 (that needs a version 2)."""
    body = json.loads((GOLDEN_V1 / name).read_bytes())["body"]
    reencoded = CheckpointBodyV1.model_validate(body).model_dump(mode="json")
    assert independent_checksum(reencoded) == independent_checksum(body)


# -- golden v2 files (written once by version 2's writer, never regenerated) ----------------


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_v2_file_still_loads(name: str) -> None:
    data = (GOLDEN_V2 / name).read_bytes()
    assert json.loads(data)["version"] == 2
    assert load_metadata(data, source=name) == as_kept(GOLDEN_FILES[name]())


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_v2_schema_is_frozen(name: str) -> None:
    """Re-encoding a golden body with the v2 schema gives the same bytes."""
    body = json.loads((GOLDEN_V2 / name).read_bytes())["body"]
    reencoded = CheckpointBodyV2.model_validate(body).model_dump(mode="json")
    assert independent_checksum(reencoded) == independent_checksum(body)


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_a_v1_file_upgraded_reads_as_the_v2_file(name: str) -> None:
    v1 = load_metadata((GOLDEN_V1 / name).read_bytes(), source=name)
    assert v1 == load_metadata((GOLDEN_V2 / name).read_bytes(), source=name)


# -- the extension path: a test-only version 3 ----------------------------------------------


class CheckpointBodyV3(CheckpointBodyV2):
    """Version 2 plus one field; a real v3 would live in core/metadata/v3.py."""

    written_by: str


UPGRADED_MARK = "unknown (upgraded from v2)"


def upgrade_v2_to_v3(body: CheckpointBodyV2) -> CheckpointBodyV3:
    return CheckpointBodyV3.model_validate({**body.model_dump(), "written_by": UPGRADED_MARK})


def encode_v3(record: CheckpointRecord) -> CheckpointBodyV3:
    return CheckpointBodyV3.model_validate(
        {**record_to_body(record).model_dump(), "written_by": "test-writer"}
    )


def decode_v3(body: CheckpointBodyV3) -> CheckpointRecord:
    return body_to_record(CheckpointBodyV2.model_validate(body.model_dump(exclude={"written_by"})))


V3_FORMAT = DEFAULT_FORMAT.extended(
    BodyVersion(3, CheckpointBodyV3, upgrade_v2_to_v3), encode=encode_v3, decode=decode_v3
)


def test_a_v3_reader_reads_the_golden_v1_files_through_both_upgrades() -> None:
    for name, build in GOLDEN_FILES.items():
        data = (GOLDEN_V1 / name).read_bytes()
        body, written_in = V3_FORMAT.read_body(data, source=name)
        assert written_in == 1
        assert isinstance(body, CheckpointBodyV3)
        assert body.written_by == UPGRADED_MARK
        assert V3_FORMAT.load(data, source=name) == as_kept(build())


def test_a_v3_writer_writes_v3_and_reads_it_back() -> None:
    record = golden_savepoint_all_statuses()
    data = V3_FORMAT.dump(record)
    document = json.loads(data)
    assert document["version"] == 3
    assert document["body"]["written_by"] == "test-writer"
    assert V3_FORMAT.load(data) == as_kept(record)
    body, written_in = V3_FORMAT.read_body(data, source="<v3>")
    assert written_in == 3
    assert isinstance(body, CheckpointBodyV3)
    assert body.written_by == "test-writer"


def test_a_v2_reader_refuses_a_v3_file_asking_for_an_upgrade() -> None:
    data = V3_FORMAT.dump(golden_drained_savepoint())
    with pytest.raises(UnsupportedMetadataVersionError) as caught:
        load_metadata(data, source="s3://b/clicks/chk-9/_metadata")
    assert str(caught.value) == (
        "checkpoint metadata s3://b/clicks/chk-9/_metadata was written in metadata format "
        "version 3, this airflow-finalckpt reads versions 1..2; upgrade airflow-finalckpt"
    )


def test_extending_a_format_leaves_the_original_unchanged() -> None:
    assert DEFAULT_FORMAT.current_version == 2
    assert V3_FORMAT.current_version == 3
    assert V3_FORMAT.oldest_version == 1


def test_a_failing_upgrade_is_a_metadata_error_naming_the_step() -> None:
    def refuse(body: CheckpointBodyV2) -> CheckpointBodyV3:
        raise ValueError("graph cannot be converted")

    fmt = DEFAULT_FORMAT.extended(
        BodyVersion(3, CheckpointBodyV3, refuse), encode=encode_v3, decode=decode_v3
    )
    message = load_error(dump_metadata(golden_drained_savepoint()), fmt)
    assert "cannot be upgraded from version 2 to 3" in message
    assert "graph cannot be converted" in message


@pytest.mark.parametrize(
    ("versions", "problem"),
    [
        ((), "at least one version"),
        ((BodyVersion(2, CheckpointBodyV3, upgrade_v2_to_v3),), "position 1 holds version 2"),
        ((BodyVersion(1, CheckpointBodyV1, upgrade_v2_to_v3),), "no previous version"),
        (
            (BodyVersion(1, CheckpointBodyV1), BodyVersion(2, CheckpointBodyV3)),
            "needs an upgrade function from version 1",
        ),
        (
            (BodyVersion(1, CheckpointBodyV1), BodyVersion(3, CheckpointBodyV3, upgrade_v2_to_v3)),
            "position 2 holds version 3",
        ),
    ],
)
def test_a_broken_version_chain_is_refused(versions: tuple[BodyVersion, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        MetadataFormat(versions=versions, encode=encode_v3, decode=decode_v3)


# -- bad input: every failure is a MetadataError naming the source and the problem ----------


def test_future_version_is_refused_with_an_upgrade_hint() -> None:
    document = document_of(golden_drained_savepoint())
    document["version"] = 7
    with pytest.raises(UnsupportedMetadataVersionError) as caught:
        load_metadata(json.dumps(document).encode(), source="/ckpt/clicks/chk-9/_metadata")
    assert str(caught.value) == (
        "checkpoint metadata /ckpt/clicks/chk-9/_metadata was written in metadata format "
        "version 7, this airflow-finalckpt reads versions 1..2; upgrade airflow-finalckpt"
    )


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        (0, "version 0, which never existed"),
        (-3, "version -3, which never existed"),
        ("1", "no integer 'version'"),
        (True, "no integer 'version'"),
        (1.0, "no integer 'version'"),
        (None, "no integer 'version'"),
    ],
)
def test_invalid_version_is_refused(version: Any, problem: str) -> None:
    document = document_of(golden_drained_savepoint())
    document["version"] = version
    message = load_error(json.dumps(document).encode())
    assert problem in message


def test_missing_version_is_refused() -> None:
    document = document_of(golden_drained_savepoint())
    del document["version"]
    assert "no integer 'version'" in load_error(json.dumps(document).encode())


@pytest.mark.parametrize(
    ("tag", "problem"),
    [
        (
            "airflow-finalckpt/checkpoint-metadat",
            "format tag 'airflow-finalckpt/checkpoint-metadat'",
        ),
        ("flink/_metadata", "format tag 'flink/_metadata'"),
        (None, "it has no 'format' tag"),
    ],
)
def test_wrong_format_tag_is_refused(tag: Any, problem: str) -> None:
    document = document_of(golden_drained_savepoint())
    document["format"] = tag
    message = load_error(json.dumps(document).encode())
    assert "is not airflow-finalckpt checkpoint metadata" in message
    assert problem in message


def test_missing_format_tag_is_refused() -> None:
    document = document_of(golden_drained_savepoint())
    del document["format"]
    assert "it has no 'format' tag" in load_error(json.dumps(document).encode())


def test_checksum_mismatch_is_refused() -> None:
    document = document_of(golden_savepoint_all_statuses())
    document["body"]["checkpoint_id"] = 43  # an edit that is otherwise perfectly valid
    message = load_error(json.dumps(document).encode())
    assert "fails its checksum" in message
    assert document["sha256"] in message
    assert independent_checksum(document["body"]) in message


@pytest.mark.parametrize("length", [0, 1, 10, 100, 500, -2])
def test_truncated_file_is_refused(length: int) -> None:
    data = dump_metadata(golden_savepoint_all_statuses())
    message = load_error(data[:length])
    assert "is empty" in message or "not valid JSON" in message


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"PK\x03\x04 a zip file", "not valid JSON"),
        (b"\x80\x04\x95 pickle protocol 4", "not UTF-8 text"),
        (b'{"format": "\xff\xfe"}', "not UTF-8 text (invalid byte at offset 12)"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),
        (b"   \n", "is empty"),
        (b"[1, 2]", "is a JSON list, expected a JSON object"),
        (b'"text"', "is a JSON str, expected a JSON object"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"a": ' + b"9" * 5000 + b"}", "not acceptable JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not acceptable JSON"),
    ],
)
def test_not_json_or_not_utf8_is_refused(data: bytes, problem: str) -> None:
    assert problem in load_error(data)


def test_non_bytes_input_is_refused() -> None:
    with pytest.raises(MetadataError, match="expected bytes, got str"):
        load_metadata("{}")  # type: ignore[arg-type]


def test_envelope_with_unknown_key_is_refused() -> None:
    document = document_of(golden_drained_savepoint())
    document["signature"] = "x"
    assert "unexpected keys ['signature']" in load_error(json.dumps(document).encode())


def test_envelope_with_non_object_body_is_refused() -> None:
    document = document_of(golden_drained_savepoint())
    document["body"] = ["not", "an", "object"]
    assert "'body' that is a JSON list" in load_error(json.dumps(document).encode())


def test_envelope_with_non_string_checksum_is_refused() -> None:
    document = document_of(golden_drained_savepoint())
    document["sha256"] = 12
    assert "'sha256' that is not a string" in load_error(json.dumps(document).encode())


def mutate_body(path: list[str], value: Any) -> dict[str, Any]:
    document = v1_document()
    target = document["body"]
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (["stages", "publish", "status"], "DONE", "body.stages.publish.status"),
        (["stages", "enrich", "finished_splits"], ["b", "a"], "sorted and free of duplicates"),
        (["stages", "enrich", "finished_splits"], ["a", "a"], "sorted and free of duplicates"),
        (["checkpoint_id"], 0, "body.checkpoint_id"),
        (["checkpoint_id"], "42", "body.checkpoint_id"),
        (["checkpoint_id"], 42.0, "body.checkpoint_id"),
        (["kind"], "snapshot", "body.kind"),
        (["reason"], "cron", "body.reason"),
        (["triggered_at"], "yesterday", "body.triggered_at"),
        (["graph_fingerprint"], DELETE, "body.graph_fingerprint: Field required"),
        (["unexpected"], 1, "body.unexpected: Extra inputs are not permitted"),
        (["stages", "extract", "watermark"], 2**63, "body.stages.extract.watermark"),
        (["stages", "enrich", "state", 0, "sha256"], "XYZ", "body.stages.enrich.state.0.sha256"),
        (["stages", "enrich", "state", 0, "size"], -1, "body.stages.enrich.state.0.size"),
        (["stages", "extract", "end_of_data", "drain"], "yes", "end_of_data.drain"),
        (["stages", "aggregate"], [], "body.stages.aggregate"),
    ],
)
def test_schema_violation_names_the_field(path: list[Any], value: Any, problem: str) -> None:
    message = load_error(resealed(mutate_body(path, value)))
    assert "does not match the version 1 schema" in message
    assert problem in message


def test_many_schema_violations_are_summarised() -> None:
    document = v1_document()
    for stage in document["body"]["stages"].values():
        stage["status"] = "?"
    document["body"]["kind"] = "?"
    document["body"]["reason"] = "?"
    message = load_error(resealed(document))
    assert message.count("body.") == 5
    assert message.endswith("; and 1 more")


# -- writing refuses records that have no JSON form -----------------------------------------


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (make_record(triggered_at=float("inf")), "body.triggered_at"),
        (make_record(completed_at=float("nan")), "body.completed_at"),
        (make_record(graph={"stages": {1, 2}}), "body.graph"),
        (
            make_record(
                stages={
                    "a": make_stage(
                        "a",
                        StageStatus.RUNNING,
                        pending_transactions=(
                            SinkTransaction(sink_id="s", txn_id="t", payload={"at": object()}),
                        ),
                    )
                }
            ),
            "body.stages.a.pending_transactions.0.payload.at",
        ),
        (
            make_record(stages={"a": make_stage("a", StageStatus.RUNNING, watermark=2**64)}),
            "body.stages.a.watermark",
        ),
        (
            make_record(stages={"a": make_stage("b", StageStatus.RUNNING)}),
            "stages['a'] holds stage 'b'",
        ),
    ],
)
def test_dump_refuses_records_without_a_json_form(record: CheckpointRecord, problem: str) -> None:
    with pytest.raises(MetadataError) as caught:
        dump_metadata(record)
    message = str(caught.value)
    assert f"cannot write checkpoint {record.checkpoint_id} of pipeline 'orders'" in message
    assert problem in message
