"""Pre-encoded entries of FULLY_FINISHED stages (``codec.finished_entry_text``, written once per
finished stage, and ``codec.encoded_finished``, which a completion writes them with): the bytes
are those of encoding every stage, and an entry is used only for the very stage object it was
made for.
"""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata import codec, dump_metadata, load_metadata
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    FinishedStageEnd,
    SinkTransaction,
    StageCheckpointRecord,
    StageStatus,
    TriggerReason,
)

ENDS = {
    "a": FinishedStageEnd(end_of_data=EndOfData(manifest=["x/0"]), watermark=5, finished_count=3),
    "b": FinishedStageEnd(
        end_of_data=EndOfData(manifest=['q"pending_transactions":[]\\', "é"], drain=True),
        watermark=None,
        finished_count=0,
    ),
    "c": FinishedStageEnd(end_of_data=None, watermark=-(2**63), finished_count=None),
}
#: A lone surrogate: JSON parsers refuse it, so no entry is kept; encoded at each completion.
SURROGATE = FinishedStageEnd(end_of_data=EndOfData(manifest=["\ud800"]), finished_count=1)
TXNS = (
    SinkTransaction(
        sink_id="s", txn_id="t1", checkpoint_id=4, payload={"b": [1, {"ü": 2}], "a": None}
    ),
    SinkTransaction(sink_id="s", txn_id="t0"),
)


def finished(
    sid: str, end: FinishedStageEnd, txns: tuple[SinkTransaction, ...]
) -> StageCheckpointRecord:
    return StageCheckpointRecord(
        stage_id=sid,
        status=StageStatus.FULLY_FINISHED,
        pending_transactions=txns,
        watermark=end.watermark,
        end_of_data=end.end_of_data,
        finished_count=end.finished_count,
    )


def record(stages: dict[str, StageCheckpointRecord]) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline_key="p",
        checkpoint_id=7,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.MANUAL,
        graph={"stages": {}},
        graph_fingerprint="f",
        triggered_at=1.5,
        completed_at=2.25,
        stages={
            **stages,
            "r": StageCheckpointRecord(
                stage_id="r",
                status=StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"s"}),
            ),
            "n": StageCheckpointRecord(stage_id="n", status=StageStatus.NOT_STARTED),
        },
    )


@pytest.mark.parametrize("txns", [(), TXNS])
def test_pre_encoded_entries_write_the_bytes_of_encoding_every_stage(
    txns: tuple[SinkTransaction, ...],
) -> None:
    stages = {sid: finished(sid, end, txns) for sid, end in ENDS.items()}
    rec = record({**stages, "ab": finished("ab", SURROGATE, txns)})
    texts = {sid: codec.finished_entry_text(end) for sid, end in ENDS.items()}
    assert all(texts.values()) and codec.finished_entry_text(SURROGATE) is None
    with codec.encoded_finished({sid: (stages[sid], text or "") for sid, text in texts.items()}):
        assembled = dump_metadata(rec)
    assert assembled == dump_metadata(rec)
    assert load_metadata(assembled) == load_metadata(dump_metadata(rec))


def test_an_entry_is_used_only_for_the_stage_object_it_was_made_for() -> None:
    stages = {sid: finished(sid, end, ()) for sid, end in ENDS.items()}
    wrong = codec.finished_entry_text(ENDS["c"]) or ""
    copied = stages["a"].model_copy(update={"watermark": 6})
    # "a" is another object than the one the (wrong) entry was made for: encoded afresh
    with codec.encoded_finished({"a": (stages["a"], wrong)}):
        data = dump_metadata(record({**stages, "a": copied}))
    assert data == dump_metadata(record({**stages, "a": copied}))
    # for the very object, the entry is trusted: that is why the store keeps it with the end
    with codec.encoded_finished({"a": (stages["a"], wrong)}):
        trusted = dump_metadata(record(stages))
    assert trusted != dump_metadata(record(stages))


def test_an_entry_that_does_not_match_the_schema_is_not_kept() -> None:
    bad = FinishedStageEnd.model_construct(end_of_data=None, watermark=2**64, finished_count=1)
    assert codec.finished_entry_text(bad) is None


def test_bad_transactions_are_reported_as_without_entries() -> None:
    bad = SinkTransaction.model_construct(
        sink_id="s", txn_id="t", checkpoint_id=None, payload={"x": float("nan")}
    )
    stage = finished("a", ENDS["a"], (bad,))
    text = codec.finished_entry_text(ENDS["a"]) or ""
    with pytest.raises(MetadataError) as without, codec.encoded_finished({}):
        dump_metadata(record({"a": stage}))
    with pytest.raises(MetadataError) as with_entry, codec.encoded_finished({"a": (stage, text)}):
        dump_metadata(record({"a": stage}))
    assert str(with_entry.value) == str(without.value)
