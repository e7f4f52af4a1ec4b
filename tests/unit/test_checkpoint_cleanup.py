"""What the coordinator leaves in checkpoint storage when completions and discards fail.

Regression tests of the fault campaign's FC-1 and FC-2 (docs/guarantees.md), with the real
``CheckpointStorage`` on a local directory:

- a completion whose ``_metadata`` write failed (after the rename, or before it) aborts the
  checkpoint and removes its ``chk-<id>`` directory once the abort committed;
- a ``chk-<id>`` directory left by a completion that a crash rolled back (its id is allocated
  again) is replaced when that id completes, instead of failing the checkpoint;
- a retention discard that failed is finished by the next retention pass, or by the next close;
- leftover sweeps never touch retained (COMPLETED), PENDING or unknown checkpoint directories.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    StageSnapshot,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

KEY = "cleanup.run1"
MANUAL = TriggerReason.MANUAL


class FlakyStorage(CheckpointStorage):
    """Checkpoint storage whose metadata writes and discards can be made to fail."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.fail_after_write: str | None = None
        self.failing_discards = 0
        self.discard_calls = 0

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        written = super().write_checkpoint(record, replace_orphan=replace_orphan)
        if self.fail_after_write is not None:  # e.g. the directory fsync after the rename
            raise OSError(self.fail_after_write)
        return written

    def discard_checkpoint(self, metadata_path: str) -> None:
        self.discard_calls += 1
        if self.failing_discards > 0:
            self.failing_discards -= 1
            raise OSError("input/output error")
        super().discard_checkpoint(metadata_path)


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


@pytest.fixture
def storage(tmp_path: Path) -> FlakyStorage:
    return FlakyStorage(str(tmp_path / "checkpoints"))


def make(engine: Engine, storage: FlakyStorage, *stages: str, retain: int = 3) -> Coordinator:
    coord = Coordinator(engine, KEY, writer=storage)
    graph = StageGraph.build(Stage(sid, ()) for sid in stages)
    coord.register(graph, CoordinatorOptions(retain, 600.0))
    return coord


def dirs(storage: CheckpointStorage) -> list[int]:
    return storage.checkpoint_dir_ids(KEY)


def retained(coord: Coordinator) -> list[int]:
    return sorted(
        c.checkpoint_id for c in coord.checkpoints() if c.state is CheckpointState.COMPLETED
    )


def test_a_metadata_write_failing_after_the_rename_leaves_no_directory(
    engine: Engine, storage: FlakyStorage
) -> None:
    coord = make(engine, storage, "a")
    epoch = coord.start_attempt("a").epoch
    cid = coord.trigger(MANUAL)
    assert cid is not None
    storage.fail_after_write = "fsync of the checkpoint directory failed"
    outcome = coord.record_batch("a", epoch, finished_splits=["s1"])
    assert outcome.completed == ()
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED
    assert "fsync of the checkpoint directory failed" in (info.failure_reason or "")
    assert dirs(storage) == []  # no complete-looking _metadata of an aborted checkpoint
    storage.fail_after_write = None
    nxt = coord.trigger(MANUAL)
    assert nxt == cid + 1
    coord.record_batch("a", epoch, finished_splits=["s2"])
    assert retained(coord) == [nxt] and dirs(storage) == [nxt]


def test_a_metadata_write_failing_before_the_rename_leaves_no_empty_directory(
    engine: Engine, storage: FlakyStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.storage import atomic

    coord = make(engine, storage, "a")
    epoch = coord.start_attempt("a").epoch
    cid = coord.trigger(MANUAL)
    assert cid is not None

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    coord.record_batch("a", epoch, finished_splits=["s1"])
    monkeypatch.undo()
    assert coord.checkpoint(cid).state is CheckpointState.ABORTED
    assert dirs(storage) == []


def test_the_directory_of_a_rolled_back_completion_is_replaced_when_its_id_completes(
    engine: Engine, storage: FlakyStorage
) -> None:
    coord = make(engine, storage, "a")
    # A completion of checkpoint 1 wrote its _metadata (and left a temporary file), then the
    # process died before the transition committed: the id was rolled back and is allocated
    # again, for a checkpoint with other content.
    orphan = CheckpointRecord(
        pipeline_key=KEY,
        checkpoint_id=1,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.PERIODIC,
        graph=coord.graph().to_dict(),
        graph_fingerprint=coord.graph().fingerprint,
        triggered_at=1.0,
        completed_at=2.0,
        stages={},
    )
    storage.write_checkpoint(orphan)
    chk1 = Path(storage.checkpoint_dir(KEY, 1))
    (chk1 / "._metadata.tmp-0123").write_bytes(b"partial")
    epoch = coord.start_attempt("a").epoch
    assert coord.trigger(MANUAL) == 1
    coord.finish("a", epoch, StageSnapshot(end_of_data=EndOfData()))
    info = coord.checkpoint(1)
    assert info.state is CheckpointState.COMPLETED, info.failure_reason
    assert sorted(p.name for p in chk1.iterdir()) == ["_metadata"]
    assert storage.read_checkpoint(str(chk1)).stages["a"].end_of_data is not None


def test_an_interrupted_discard_is_finished_by_the_next_retention_pass(
    engine: Engine, storage: FlakyStorage
) -> None:
    coord = make(engine, storage, "a", retain=1)
    assert coord.trigger(MANUAL) == 1  # nothing running: completes at once
    storage.failing_discards = 2  # the discard and the sweep right after it
    assert coord.trigger(MANUAL) == 2
    assert coord.checkpoint(1).state is CheckpointState.DISCARDED
    assert dirs(storage) == [1, 2]  # left behind
    assert coord.trigger(MANUAL) == 3
    assert dirs(storage) == [3] and retained(coord) == [3]


def test_close_finishes_a_discard_interrupted_at_the_last_completion(
    engine: Engine, storage: FlakyStorage
) -> None:
    coord = make(engine, storage, "a", retain=1)
    assert coord.trigger(MANUAL) == 1
    epoch = coord.start_attempt("a").epoch
    storage.failing_discards = 1_000
    finish = coord.finish("a", epoch, StageSnapshot(end_of_data=EndOfData()))
    assert finish.eager_checkpoint_id == 2 and retained(coord) == [2]
    assert dirs(storage) == [1, 2]
    storage.failing_discards = 0
    assert coord.closable_checkpoint("a") == 2
    coord.close("a", epoch, 2)  # no completion follows the last one; close sweeps
    assert dirs(storage) == [2]


def test_sweeps_keep_retained_pending_and_unknown_checkpoint_directories(
    engine: Engine, storage: FlakyStorage
) -> None:
    coord = make(engine, storage, "a", "b", retain=2)
    epochs = {sid: coord.start_attempt(sid).epoch for sid in ("a", "b")}
    savepoint = coord.trigger(MANUAL, CheckpointKind.SAVEPOINT)  # never subsumed: stays PENDING
    aborted = coord.trigger(MANUAL)
    assert savepoint is not None and aborted is not None
    coord.abort(aborted, "test")
    # Directories of a pending checkpoint (as a write in flight elsewhere), of an aborted one,
    # and one the coordinator does not know (another store's, a restored pipeline's).
    pipeline = Path(storage.pipeline_dir(KEY))
    for cid in (savepoint, aborted, 99):
        (pipeline / f"chk-{cid}").mkdir(parents=True)
    completed = []
    for _ in range(3):
        cid = coord.trigger(MANUAL)
        assert cid is not None
        coord.acknowledge(cid, "a", epochs["a"])
        coord.acknowledge(cid, "b", epochs["b"])
        completed.append(cid)
    assert coord.checkpoint(savepoint).state is CheckpointState.PENDING
    assert retained(coord) == completed[-2:]
    assert dirs(storage) == sorted([savepoint, *completed[-2:], 99])
