"""Where the plan check's verdict is shown: the note beside the batch throughput, read back by
``finalckpt progress`` and the UI."""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.cli.progress import _batch_text
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints, read_batch_plan


def test_a_noted_plan_is_read_back_and_a_split_local_one_clears_it(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    hints = StorageThroughputHints(storage, "dag-x", "x.run1")
    assert read_batch_plan(storage, "x.run1", "agg") is None
    text = "one batch per attempt: Aggregate combines rows of different splits by (key)"
    hints.note_plan("agg", text)
    assert read_batch_plan(storage, "x.run1", "agg") == text
    hints.note_plan("agg", None)  # a later attempt found the plan split-local
    assert read_batch_plan(storage, "x.run1", "agg") is None
    StorageThroughputHints(storage, "dag-x").note_plan("agg", text)  # no pipeline: no note
    assert read_batch_plan(storage, "x.run1", "agg") is None


def test_progress_shows_the_plan_before_the_throughput() -> None:
    stage = {"plan": "one batch per attempt: Sort ...", "batches": {"summary": "last batch 3"}}
    assert _batch_text(stage) == "one batch per attempt: Sort ...; last batch 3"
    assert _batch_text({"plan": None, "batches": {"summary": "last batch 3"}}) == "last batch 3"
    assert _batch_text({"plan": None, "batches": None}) == ""
