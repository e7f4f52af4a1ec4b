"""The declared split list's fingerprint and how a changed list is described (pure)."""

from __future__ import annotations

import hashlib

import pytest

from airflow_finalckpt.core.errors import SplitListChangedError
from airflow_finalckpt.core.metadata import dump_metadata, load_metadata
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    StageCheckpointRecord,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.core.restore import GRAPH_CHANGE_RULES
from airflow_finalckpt.core.split_list import (
    FINISHED_SPLIT_LIST_RULE,
    LOST_SPLITS_RULE,
    DeclaredSplits,
    LostFinishedSplitsError,
    dry_run_split_list,
    split_list_change,
    split_list_fingerprint,
)


def test_fingerprint_is_the_sha256_of_the_ids_in_declared_order() -> None:
    fp = split_list_fingerprint(["b", "a"])
    assert fp == hashlib.sha256(b'["b","a"]').hexdigest()
    assert fp != split_list_fingerprint(["a", "b"])  # order matters: the declared order
    assert split_list_fingerprint([]) == hashlib.sha256(b"[]").hexdigest()


def test_fingerprint_of_any_python_text_is_its_canonical_ascii_json() -> None:
    """Non-ASCII ids hash as escaped ASCII, the form every metadata fingerprint uses; a lone
    surrogate (a file name the OS could not decode) has one too."""
    assert split_list_fingerprint(["é"]) == hashlib.sha256(b'["\\u00e9"]').hexdigest()
    assert split_list_fingerprint(["\udcff"]) == hashlib.sha256(b'["\\udcff"]').hexdigest()


def test_fingerprint_refuses_one_string() -> None:
    with pytest.raises(TypeError, match="not one string"):
        split_list_fingerprint("abc")


def test_no_change_when_the_same_list_or_unknown() -> None:
    declared = ["a", "b", "c"]
    assert split_list_change(split_list_fingerprint(declared), declared, {"a"}) is None
    assert split_list_change(None, declared, {"a", "z"}) is None


def test_a_changed_list_counts_undeclared_finished_and_pending_splits() -> None:
    recorded = split_list_fingerprint(["a", "b", "c", "d"])
    change = split_list_change(recorded, ["b", "c", "e", "f", "g"], {"a", "b", "d"})
    assert change is not None
    assert (change.undeclared_finished, change.pending) == (2, 4)  # a, d | c, e, f, g
    line = change.describe("orders", "checkpoint file:///chk-7/_metadata")
    assert line.startswith("stage orders: split list changed since checkpoint file:///chk-7/")
    assert "2 finished split(s) are no longer declared" in line
    assert "4 declared split(s) are not finished" in line


def test_metadata_v2_carries_the_fingerprint() -> None:
    fp = split_list_fingerprint(["a", "b"])
    record = CheckpointRecord(
        pipeline_key="k",
        checkpoint_id=3,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.MANUAL,
        graph={"stages": {"s": []}},
        graph_fingerprint="g",
        triggered_at=1.0,
        completed_at=2.0,
        stages={
            "s": StageCheckpointRecord(
                stage_id="s",
                status=StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"a"}),
                split_list_sha256=fp,
            )
        },
    )
    assert load_metadata(dump_metadata(record)).stages["s"].split_list_sha256 == fp


def test_a_bad_fingerprint_is_refused() -> None:
    with pytest.raises(ValueError, match="split_list_sha256"):
        StageCheckpointRecord(stage_id="s", status=StageStatus.RUNNING, split_list_sha256="x")


@pytest.mark.parametrize(
    ("origin", "says", "never"),
    [
        ("conf", ['without "pipeline_key" in its conf'], ["argument", "savepoint"]),
        ("operator", ["pipeline_key argument"], ["conf", "savepoint"]),
        ("restore", ["savepoint"], ["pipeline_key", "conf"]),
        ("default", [], ["pipeline_key", "conf", "savepoint", "argument"]),
    ],
)
def test_a_finished_stage_refusal_suggests_only_the_ways_out_of_its_case(
    origin: str, says: list[str], never: list[str]
) -> None:
    """Issue 38: a run on its own default key was told to "drop pipeline_key from the conf"."""
    from airflow_finalckpt.core.errors import SplitListChangedError
    from airflow_finalckpt.core.split_list import check_finished_split_list

    recorded = split_list_fingerprint(["a", "b"])
    with pytest.raises(SplitListChangedError) as refused:
        check_finished_split_list("agg", recorded, ["a", "b", "late"], origin)
    message = str(refused.value)
    assert "finalckpt reset DAG_ID RUN_ID --stage agg" in message
    assert "declare the splits it finished with" in message
    for text in says:
        assert text in message, (origin, message)
    for text in never:
        assert text not in message, (origin, message)


def test_every_rule_name_is_kebab_case_and_public() -> None:
    for rule in GRAPH_CHANGE_RULES:
        assert rule == rule.lower() and " " not in rule and "_" not in rule, rule
    assert {FINISHED_SPLIT_LIST_RULE, LOST_SPLITS_RULE} <= set(GRAPH_CHANGE_RULES)


def _dry(finished_stage: bool, declared: DeclaredSplits | None, finished: set[str]) -> str:
    return dry_run_split_list(
        "s",
        finished_stage=finished_stage,
        recorded=split_list_fingerprint(["a", "b"]),
        finished=finished,
        declared=declared,
        since="its last attempt",
    )


def test_the_dry_run_applies_the_tasks_split_list_rules() -> None:
    same = DeclaredSplits(("a", "b"))
    assert _dry(True, same, {"a", "b"}) == _dry(False, same, {"a"}) == "split list: unchanged"
    with pytest.raises(SplitListChangedError, match=FINISHED_SPLIT_LIST_RULE):
        _dry(True, DeclaredSplits(("a", "b", "c")), {"a", "b"})
    with pytest.raises(LostFinishedSplitsError, match=LOST_SPLITS_RULE):
        _dry(False, DeclaredSplits(("b", "c")), {"a"})
    allowed = _dry(False, DeclaredSplits(("b", "c"), allow_change=True), {"a"})
    assert "1 finished split(s) are no longer declared" in allowed
    assert "2 declared split(s) are not finished" in allowed
    added = _dry(False, DeclaredSplits(("a", "b", "c")), {"a"})
    assert "0 finished split(s)" in added and "2 declared split(s)" in added
    for unknown in (None, DeclaredSplits(None)):
        assert _dry(True, unknown, {"a"}).startswith("split list: declared when the task runs")
    unrecorded = dry_run_split_list(
        "s", finished_stage=True, recorded=None, finished=(), declared=same, since="x"
    )
    assert unrecorded.startswith("split list: not recorded")
