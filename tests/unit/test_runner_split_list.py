"""A changed split list through the real stage runtime (SQLite coordinator, local checkpoint
storage, a fake stage logic): the resumed attempt warns once with the counts, processes the
declared splits not finished and keeps all progress; the checkpoint records the fingerprint
and a restore from it detects the change. Pure rules: test_split_list.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import is_permanent
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StageLifecycle, StateHandle, TriggerReason
from airflow_finalckpt.core.split_list import LostFinishedSplitsError, split_list_fingerprint
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "split-list"
FIRST = tuple(f"s{i}" for i in range(6))
#: s6, s7 added (a list that drops finished splits is refused unless allowed)
SECOND = (*FIRST, "s6", "s7")
SHRUNK = FIRST[2:]


class Crash(RuntimeError):
    pass


class Logic:
    """Processes splits; crashes in batch ``crash_in_batch`` (0-based) if given."""

    def __init__(self, crash_in_batch: int | None = None) -> None:
        self.crash_in_batch = crash_in_batch
        self.batches = 0
        self.processed: list[str] = []

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        if self.batches == self.crash_in_batch:
            raise Crash("crash")
        self.batches += 1
        self.processed.extend(batch.splits)
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


class Recorder:
    """A logger keeping what was logged, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(("info", str(event) % args))

    def warning(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(("warning", str(event) % args))

    def warnings(self) -> list[str]:
        return [text for level, text in self.lines if level == "warning"]


def coordinator(url: str, storage: CheckpointStorage) -> Coordinator:
    engine = make_engine(url)
    ensure_schema(engine)
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["a"], []))
    return coord


def run(
    coord: Coordinator, splits: tuple[str, ...], logic: Logic, log: Recorder, allow: bool = False
) -> None:
    spec = StageSpec(
        pipeline_key=KEY,
        stage_id="a",
        splits=splits,
        batch_size=2,
        allow_split_list_change=allow,
    )
    StageRunner(coord, spec, logic, log=log).run()


def test_a_resumed_attempt_with_a_changed_list_warns_and_keeps_progress(tmp_path: Path) -> None:
    coord = coordinator(f"sqlite:///{tmp_path}/store.db", CheckpointStorage(str(tmp_path)))
    first = Logic(crash_in_batch=2)
    with pytest.raises(Crash):
        run(coord, FIRST, first, Recorder())
    assert set(first.processed) == {"s0", "s1", "s2", "s3"}
    assert coord.stage("a").progress.split_list_sha256 == split_list_fingerprint(FIRST)

    # finished splits no longer declared: a permanent error naming its rule and the operator
    # argument that allows it, with no warning before it; progress kept
    log = Recorder()
    with pytest.raises(LostFinishedSplitsError) as refused:
        run(coord, SHRUNK, Logic(), log)
    message = str(refused.value)
    assert "stage 'a' violates rule 'finished-splits-stay-declared'" in message
    assert "2 finished split(s) ['s0', 's1']" in message
    assert "allow_split_list_change=True" in message
    assert is_permanent(refused.value)
    assert log.warnings() == []
    assert coord.stage("a").progress.finished_splits == {"s0", "s1", "s2", "s3"}

    log, second = Recorder(), Logic()
    run(coord, SECOND, second, log)
    [warning] = log.warnings()
    assert "0 finished split(s) are no longer declared" in warning
    assert "4 declared split(s) are not finished" in warning  # s4, s5, s6, s7
    assert second.processed == ["s4", "s5", "s6", "s7"]
    view = coord.stage("a")
    assert view.lifecycle is StageLifecycle.FINISHED
    assert view.progress.split_list_sha256 == split_list_fingerprint(SECOND)
    assert view.progress.finished_splits == set(SECOND)  # progress is never dropped

    # the same list again: no warning
    log = Recorder()
    run(coord, SECOND, Logic(), log)
    assert log.warnings() == []


def test_a_restore_detects_the_changed_list(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = coordinator(f"sqlite:///{tmp_path}/first.db", storage)
    with pytest.raises(Crash):
        run(coord, FIRST, Logic(crash_in_batch=1), Recorder())
    with pytest.raises(Crash):
        run(coord, FIRST, Logic(crash_in_batch=1), Recorder())
    # the failed attempt is gone: the checkpoint records it from its durable progress at once
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    path = coord.checkpoint(cid).metadata_path
    assert path is not None
    record = storage.read_checkpoint(path)
    stage = record.stages["a"]
    assert stage.finished_splits == {"s0", "s1", "s2", "s3"}
    assert stage.split_list_sha256 == split_list_fingerprint(FIRST)

    fresh = coordinator(f"sqlite:///{tmp_path}/fresh.db", storage)
    fresh.start_pipeline(StageGraph.from_edges(["a"], []), record=record, source=path)
    log, logic = Recorder(), Logic()
    run(fresh, SECOND, logic, log)
    [warning] = log.warnings()
    assert f"split list changed since checkpoint {path}" in warning
    assert "0 finished split(s) are no longer declared" in warning
    assert "4 declared split(s) are not finished" in warning
    assert logic.processed == list(SECOND[4:])


def test_allow_split_list_change_resumes_without_the_removed_splits(tmp_path: Path) -> None:
    coord = coordinator(f"sqlite:///{tmp_path}/store.db", CheckpointStorage(str(tmp_path)))
    with pytest.raises(Crash):
        run(coord, FIRST, Logic(crash_in_batch=2), Recorder())
    log, logic = Recorder(), Logic()
    run(coord, SHRUNK, logic, log, allow=True)
    [warning] = log.warnings()
    assert "2 finished split(s) are no longer declared" in warning  # s0, s1
    assert logic.processed == ["s4", "s5"]
    assert coord.stage("a").lifecycle is StageLifecycle.FINISHED


def test_a_finished_stage_with_another_split_list_is_refused_by_the_rule(tmp_path: Path) -> None:
    """Issue 26: a reused key or a late file must not re-publish a finished stage as is."""
    from airflow_finalckpt.core.errors import SplitListChangedError, is_permanent
    from airflow_finalckpt.core.split_list import FINISHED_SPLIT_LIST_RULE

    coord = coordinator(f"sqlite:///{tmp_path}/store.db", CheckpointStorage(str(tmp_path)))
    run(coord, FIRST, Logic(), Recorder())
    assert coord.stage("a").lifecycle is StageLifecycle.FINISHED
    epoch = coord.stage("a").epoch
    logic = Logic()
    with pytest.raises(SplitListChangedError, match=FINISHED_SPLIT_LIST_RULE) as refused:
        run(coord, SECOND, logic, Recorder())
    assert is_permanent(refused.value)
    message = str(refused.value)
    assert "stage 'a' is finished" in message and "finalckpt reset" in message
    assert "\n" not in message
    assert logic.processed == []
    view = coord.stage("a")  # nothing recorded: no new attempt, the old fingerprint
    assert (view.epoch, view.progress.split_list_sha256) == (epoch, split_list_fingerprint(FIRST))
    # the list it finished with is re-published as before (no Spark work)
    again = Logic()
    run(coord, FIRST, again, Recorder())
    assert again.processed == []
