"""Metadata format version 2: the compact split set and packed values (round trips over random
sets, corrupt input, wrong fingerprint), the v1 -> v2 upgrade, and the sizes issue 16 asks for
(100,000 splits of which 50,000 finished <= 1 MB; 10,000 stages x 100 splits <= 2 MB)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import zlib
from typing import Any

import pytest

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata import as_kept, dump_metadata, load_metadata
from airflow_finalckpt.core.metadata.compact import (
    decode_split_set,
    encode_split_set,
    pack_json,
    split_set_fingerprint,
    unpack_json,
)
from airflow_finalckpt.core.model import (
    MAX_WATERMARK,
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    SinkTransaction,
    StageCheckpointRecord,
    StageStatus,
    StateHandle,
    TriggerReason,
)

MB = 1_000_000


def random_ids(rng: random.Random, count: int) -> set[str]:
    alphabet = 'abc/-_01\u00e9\u4e2d\n"'
    shapes = [
        lambda: f"data/2013/{rng.randrange(13):02d}/part-{rng.randrange(10**5):05d}.parquet",
        lambda: "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9))),
        lambda: hashlib.sha256(str(rng.random()).encode()).hexdigest(),
    ]
    return {rng.choice(shapes)() for _ in range(count)}


@pytest.mark.parametrize("seed", range(40))
def test_split_sets_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    ids = random_ids(rng, rng.choice([0, 1, 2, 7, 100, 1000]))
    encoded = encode_split_set(ids)
    assert encoded["count"] == len(ids)
    assert encoded["sha256"] == split_set_fingerprint(ids)
    assert decode_split_set(json.loads(json.dumps(encoded))) == frozenset(ids)


def test_prefix_sharing_ids_compress_to_a_few_bytes_each() -> None:
    ids = {f"s3a://bucket/flights/2013/part-{k:06d}.parquet" for k in range(0, 100_000, 2)}
    encoded = encode_split_set(ids)
    assert len(encoded["data"]) < 2 * len(ids)  # ~45 characters each in the clear
    assert decode_split_set(encoded) == ids


def test_the_empty_string_is_a_split_id_too() -> None:
    assert decode_split_set(encode_split_set({"", "a", "ab"})) == {"", "a", "ab"}


def test_front_coding_shares_the_longest_prefix_with_the_previous_id() -> None:
    # Shared lengths that grow, shrink, stay and hit the shorter id's end (the guess of the
    # previous pair is wrong in both directions).
    ids = ["", "a", "ab", "abc", "abd", "abdz", "b", "ba", "bb", "bb0", "bc0"]
    encoded = encode_split_set(ids)
    coded = json.loads(zlib.decompress(base64.b64decode(encoded["data"])))
    pairs = list(zip(coded[::2], coded[1::2], strict=True))
    assert pairs == [
        (0, ""), (0, "a"), (1, "b"), (2, "c"), (2, "d"), (3, "z"),
        (0, "b"), (1, "a"), (1, "b"), (2, "0"), (1, "c0"),
    ]  # fmt: skip


def recoded(encoded: dict[str, Any], coded: Any) -> dict[str, Any]:
    data = zlib.compress(json.dumps(coded).encode())
    return dict(encoded, data=base64.b64encode(data).decode())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"encoding": "bitmap"}, "unknown encoding 'bitmap'"),
        ({"data": "@@not base64@@"}, "'data' is not base64 text"),
        ({"data": base64.b64encode(b"not zlib").decode()}, "'data' is not zlib data"),
        ({"count": 4}, "it states 4 splits but holds 3"),
        ({"sha256": "0" * 64}, "not to the recorded fingerprint"),
    ],
)
def test_corrupt_split_sets_are_refused(change: dict[str, Any], problem: str) -> None:
    encoded = dict(encode_split_set({"a", "b", "c"}), **change)
    with pytest.raises(MetadataError, match="finished splits of stage 'x'") as caught:
        decode_split_set(encoded, what="the finished splits of stage 'x'")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("coded", "problem"),
    [
        ({"a": 1}, "not a list of (prefix, rest) pairs"),
        ([0, "a", 1], "not a list of (prefix, rest) pairs"),
        ([0, "b", 0, "a", 0, "c"], "not sorted and unique"),
        ([0, "a", 0, "a", 0, "c"], "not sorted and unique"),
        ([0, "a", 5, "b", 0, "c"], "shares 5 characters with a previous id of 1"),
        ([0, "a", "1", "b", 0, "c"], "is not a (prefix length, text) pair"),
    ],
)
def test_malformed_front_coding_is_refused(coded: Any, problem: str) -> None:
    encoded = recoded(encode_split_set({"a", "b", "c"}), coded)
    with pytest.raises(MetadataError) as caught:
        decode_split_set(encoded)
    assert problem in str(caught.value)


def test_truncated_zlib_data_is_refused() -> None:
    encoded = encode_split_set({f"p{i}" for i in range(500)})
    raw = base64.b64decode(encoded["data"])
    cut = dict(encoded, data=base64.b64encode(raw[: len(raw) // 2]).decode())
    with pytest.raises(MetadataError, match="truncated"):
        decode_split_set(cut)


def test_packed_values_round_trip_and_refuse_corruption() -> None:
    value = {"stages": [{"stage_id": f"s{i}", "upstream": []} for i in range(50)]}
    packed = pack_json(value)
    assert unpack_json(packed) == value
    with pytest.raises(MetadataError, match="does not match its recorded size"):
        unpack_json(dict(packed, sha256="1" * 64), what="the graph")
    other = pack_json({"stages": []})
    with pytest.raises(MetadataError, match="the graph"):
        unpack_json(dict(packed, data=other["data"]), what="the graph")
    with pytest.raises(MetadataError, match="unknown encoding"):
        unpack_json(dict(packed, encoding="gzip"))


def test_a_corrupt_split_set_inside_a_file_names_the_file_and_stage() -> None:
    record = record_with(
        {
            "b": StageCheckpointRecord(
                stage_id="b",
                status=StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"x", "y"}),
            )
        }
    )
    document = json.loads(dump_metadata(record))
    document["body"]["stages"]["b"]["finished_splits"]["sha256"] = "2" * 64
    body = document["body"]
    document["sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    with pytest.raises(MetadataError) as caught:
        load_metadata(json.dumps(document).encode(), source="/ck/p/chk-3/_metadata")
    message = str(caught.value)
    assert "/ck/p/chk-3/_metadata" in message and "stage 'b'" in message
    assert "fingerprint" in message


# -- records at scale -----------------------------------------------------------------------


def record_with(stages: dict[str, StageCheckpointRecord], graph: Any = None) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline_key="scale",
        checkpoint_id=9,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.PERIODIC,
        graph=graph or {"stages": [{"stage_id": s, "upstream": []} for s in stages]},
        graph_fingerprint="f" * 64,
        triggered_at=1.0,
        completed_at=2.0,
        stages=stages,
    )


def test_one_partial_stage_of_100k_splits_half_finished_writes_under_1_mb() -> None:
    splits = [f"s3a://lake/events/date=2013-01-01/part-{k:06d}.parquet" for k in range(100_000)]
    finished = frozenset(splits[::2])  # every other one
    stage = StageCheckpointRecord(
        stage_id="big", status=StageStatus.PARTIALLY_FINISHED, finished_splits=finished
    )
    data = dump_metadata(record_with({"big": stage}))
    assert len(data) <= 1 * MB, len(data)
    assert load_metadata(data).stages["big"].finished_splits == finished


def handle(stage_id: str, k: int) -> StateHandle:
    path = f"data/{stage_id}/_parts/b{k:05d}.json"
    return StateHandle(
        name=f"output:data/{stage_id}/b{k:05d}",
        path=path,
        size=120,
        sha256=hashlib.sha256(path.encode()).hexdigest(),
    )


def benchmark_like_record(lanes: int, splits: int) -> CheckpointRecord:
    """The coordinator benchmark's mix (benchmarks/coordinator_scale.py): per 4 lanes of 4
    stages, 9 fully finished, 1 running with half its splits, 6 not started; one output handle
    per 10 finished splits, one pending transaction per finished-unclosed or running stage.
    """
    kinds = [
        ("F", "F", "F", "F"),
        ("F", "F", "F", "R"),
        ("F", "F", "N", "N"),
        ("N", "N", "N", "N"),
    ]
    ids, edges, stages = [], [], {}
    for lane in range(lanes):
        for pos, name in enumerate(("ingest", "enrich", "windows", "publish")):
            sid = f"lane{lane:05d}_{name}"
            ids.append(sid)
            if pos:
                edges.append((ids[-2], sid))
            kind = kinds[lane % 4][pos]
            if kind == "F":
                parts = [
                    h.name[len("output:") :]
                    for h in map(lambda k: handle(sid, k), range(splits // 10))
                ]
                stages[sid] = StageCheckpointRecord(
                    stage_id=sid,
                    status=StageStatus.FULLY_FINISHED,
                    watermark=MAX_WATERMARK,
                    end_of_data=EndOfData(manifest=parts, finished_at_checkpoint=0),
                    finished_count=splits,
                )
            elif kind == "R":
                done = frozenset(f"data/{sid}/part-{k:05d}" for k in range(splits // 2))
                stages[sid] = StageCheckpointRecord(
                    stage_id=sid,
                    status=StageStatus.PARTIALLY_FINISHED,
                    finished_splits=done,
                    state=tuple(handle(sid, k) for k in range(splits // 20)),
                    pending_transactions=(
                        SinkTransaction(
                            sink_id="out",
                            txn_id=f"{sid}.seed.e1",
                            checkpoint_id=9,
                            payload={"staging": f"_staging/{sid}/seed"},
                        ),
                    ),
                    watermark=1_370_000_000_000,
                )
            else:
                stages[sid] = StageCheckpointRecord(stage_id=sid, status=StageStatus.NOT_STARTED)
    graph = StageGraph.from_edges(ids, edges)
    return record_with(stages, graph=graph.to_dict())


def test_10000_stages_x_100_splits_write_under_2_mb() -> None:
    # its speed is measured by benchmarks/coordinator_scale.py, not asserted here
    record = benchmark_like_record(2_500, 100)
    data = dump_metadata(record)
    assert len(data) <= 2 * MB, len(data)
    assert load_metadata(data) == as_kept(record)


def test_fully_finished_stages_keep_their_count_not_their_ids() -> None:
    stage = StageCheckpointRecord(
        stage_id="a",
        status=StageStatus.FULLY_FINISHED,
        finished_splits=frozenset({"p1", "p2", "p3"}),
        end_of_data=EndOfData(unread_splits=1),
    )
    loaded = load_metadata(dump_metadata(record_with({"a": stage}))).stages["a"]
    assert loaded.finished_splits == frozenset()
    assert loaded.finished_count == 3 == loaded.done_splits
    assert loaded.end_of_data == stage.end_of_data


def test_a_fully_finished_stage_without_a_json_form_is_refused_naming_the_field() -> None:
    stage = StageCheckpointRecord(
        stage_id="a",
        status=StageStatus.FULLY_FINISHED,
        pending_transactions=(SinkTransaction(sink_id="s", txn_id="t", payload={"at": object()}),),
    )
    with pytest.raises(MetadataError) as caught:
        dump_metadata(record_with({"a": stage}))
    message = str(caught.value)
    assert "cannot write checkpoint 9 of pipeline 'scale'" in message
    assert "body.fully_finished.a.pending_transactions.0.payload.at" in message


@pytest.mark.parametrize(
    "text",
    ["lone \udc80 surrogate", "caf\u00e9 \U0001f600", 'quote " and \\ backslash'],
)
def test_fully_finished_stages_round_trip_any_python_text(text: str) -> None:
    # The encoder checks them through the JSON parser first; text that parser refuses (a lone
    # surrogate) must still be written, by the exact path.
    stage = StageCheckpointRecord(
        stage_id="a",
        status=StageStatus.FULLY_FINISHED,
        pending_transactions=(SinkTransaction(sink_id=text, txn_id="t", payload={text: text}),),
        end_of_data=EndOfData(manifest=[text]),
    )
    record = record_with({"a": stage})
    assert load_metadata(dump_metadata(record)) == as_kept(record)


def test_a_fully_finished_watermark_beyond_int64_is_refused_naming_the_field() -> None:
    stage = StageCheckpointRecord(stage_id="a", status=StageStatus.FULLY_FINISHED, watermark=2**63)
    with pytest.raises(MetadataError) as caught:
        dump_metadata(record_with({"a": stage}))
    assert "body.fully_finished.a.watermark" in str(caught.value)
