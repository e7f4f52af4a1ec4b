"""Garbage collection racing a checkpoint that completes while it reads (concurrent campaign
finding, see docs/guarantees.md "What the concurrent campaign showed").

A stage's state snapshot F6 is live only for a moment: the stage records batch 6 with it,
which acknowledges and completes checkpoint 1, then records batch 7 with F7. A collection that
read the live state before batch 6 (F5), the checkpoint list before checkpoint 1 completed,
and the live state again after batch 7 (F7) saw F6 nowhere; F6 is older than the stage's last
recorded batch (not in flight) and, with grace 0 (the campaign's setting), was deleted: the
retained checkpoint 1 named a missing state file and could not be restored. The interleaving
is forced here by running the two batches inside the collector's first checkpoint read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from airflow_finalckpt.coordination import CheckpointInfo, Coordinator, CoordinatorOptions
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import CheckpointState, StateHandle, TriggerReason
from airflow_finalckpt.runtime.gc import KeepReason, collect_garbage
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "gc-race"


class RacingCoordinator(Coordinator):
    """Runs ``race`` once, right after the first checkpoint list was read."""

    race: Callable[[], None] | None = None

    def checkpoints(self, *, limit: int | None = None) -> list[CheckpointInfo]:
        infos = super().checkpoints(limit=limit)
        race, self.race = self.race, None
        if race is not None:
            race()
        return infos


def _state(storage: CheckpointStorage, name: str, age_s: float) -> StateHandle:
    handle = storage.write_state(KEY, f"state/y/windows/{name}.json", b"{}", name="state:windows")
    then = time.time() - age_s
    os.utime(storage.resolve_handle(KEY, handle.path), (then, then))
    return handle


def test_state_acknowledged_by_a_checkpoint_completing_mid_collection_is_kept(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = RacingCoordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(("y",), ()), CoordinatorOptions(retain_checkpoints=3))
    epoch = coord.start_attempt("y", total_splits=8).epoch
    ages = (("f4", 40), ("f5", 30), ("f6", 20), ("f7", 10))
    f4, f5, f6, f7 = (_state(storage, name, age) for name, age in ages)
    coord.record_batch("y", epoch, finished_splits=["p4"], state=[f4])  # superseded by F5
    coord.record_batch("y", epoch, finished_splits=["p5"], state=[f5])
    checkpoint = coord.trigger(TriggerReason.PERIODIC)
    assert checkpoint is not None

    def batches_six_and_seven() -> None:
        coord.record_batch("y", epoch, finished_splits=["p6"], state=[f6])  # completes it
        coord.record_batch("y", epoch, finished_splits=["p7"], state=[f7])

    coord.race = batches_six_and_seven
    report = collect_garbage(coord, storage, grace_s=0)

    assert coord.race is None  # the race ran inside the collection
    info = coord.checkpoint(checkpoint)
    assert info.state is CheckpointState.COMPLETED and info.metadata_path is not None
    [state] = storage.read_checkpoint(info.metadata_path).stages["y"].state
    assert state.path == f6.path
    assert storage.read_state(KEY, f6)  # still restorable: raises if the file is gone
    kept = report.kept_because(KeepReason.REFERENCED)
    assert any(path.endswith("f6.json") for path in kept), kept
    deleted = report.deleted_paths
    assert [p for p in deleted if p.endswith("f4.json")], deleted  # it did collect: F4 is gone
