"""Auto batches through the real stage runtime: a SQLite coordinator, local checkpoint storage,
a fake stage logic whose batch cost is a model (fixed + per-split seconds) on a fake timer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StageLifecycle, StateHandle
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "auto-batches"
SPLITS = tuple(f"s{i:03d}" for i in range(200))


class Crash(RuntimeError):
    pass


class Clock:
    """A timer the fake logic advances by the modelled cost of each batch."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ModelLogic:
    """Each batch costs ``fixed_s + per_split_s * len(splits)`` seconds of fake time."""

    def __init__(
        self,
        clock: Clock,
        *,
        fixed_s: float = 1.0,
        per_split_s: float = 0.5,
        crash_in_batch: int | None = None,
    ) -> None:
        self.clock = clock
        self.fixed_s = fixed_s
        self.per_split_s = per_split_s
        self.crash_in_batch = crash_in_batch
        self.sizes: list[int] = []
        self.processed: list[str] = []

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        pass

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        self.clock.now += self.fixed_s + self.per_split_s * len(batch.splits)
        if self.crash_in_batch is not None and len(self.sizes) == self.crash_in_batch:
            raise Crash(f"crash in batch {len(self.sizes)}")
        self.sizes.append(len(batch.splits))
        self.processed.extend(batch.splits)
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


@pytest.fixture
def env(tmp_path: Path) -> tuple[Coordinator, CheckpointStorage]:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["a"], []))
    return coord, storage


def _runner(
    coord: Coordinator,
    logic: ModelLogic,
    clock: Clock,
    hints: StorageThroughputHints | None = None,
    **spec: object,
) -> StageRunner:
    return StageRunner(
        coord,
        StageSpec(pipeline_key=KEY, stage_id="a", splits=SPLITS, **spec),  # type: ignore[arg-type]
        logic,
        hints=hints,
        timer=clock,
    )


def test_auto_batches_probe_then_approach_the_target_duration(env: tuple) -> None:
    coord, _ = env
    clock = Clock()
    logic = ModelLogic(clock)  # 1 s fixed + 0.5 s per split
    _runner(coord, logic, clock, target_batch_s=10.0).run()

    assert logic.processed == list(SPLITS)  # every split once, in order
    assert logic.sizes[0] == 1  # the probe
    durations = [1.0 + 0.5 * n for n in logic.sizes]
    # from the third batch on (two samples separate fixed and per-split cost) batches are
    # sized to the 10 s target: 18 splits = 10 s; none overshoots it, except a merged tail
    assert logic.sizes[2:-1] == [18] * len(logic.sizes[2:-1])
    assert max(durations[:-1]) <= 10.0
    assert durations[-1] <= 10.0 * 1.25 + 1.0
    assert len(logic.sizes) <= 13  # 200 splits / 18, plus the probe and the second batch


def test_an_int_batch_size_keeps_fixed_batches(env: tuple) -> None:
    coord, _ = env
    clock = Clock()
    logic = ModelLogic(clock)
    _runner(coord, logic, clock, batch_size=7).run()
    assert logic.sizes == [7] * 28 + [4]


def test_a_crash_redoes_at_most_the_batch_in_flight_and_the_next_attempt_skips_the_probe(
    env: tuple, tmp_path: Path
) -> None:
    coord, storage = env
    hints = StorageThroughputHints(storage, "dag-demo")
    clock = Clock()
    first = ModelLogic(clock, crash_in_batch=4)
    with pytest.raises(Crash):
        _runner(coord, first, clock, hints, target_batch_s=10.0).run()
    done = set(coord.stage("a").progress.finished_splits)
    assert done == set(first.processed) and len(done) == sum(first.sizes)

    # a second attempt (new epoch) resumes from the stored progress and the stored throughput
    second = ModelLogic(clock)
    result = _runner(coord, second, clock, hints, target_batch_s=10.0).run()
    assert set(second.processed) == set(SPLITS) - done  # exactly the unfinished splits
    assert len(second.processed) == len(SPLITS) - len(done)
    assert second.sizes[0] == 18  # no probe: sized from what the first attempt measured
    assert result.processed_splits == tuple(second.processed)
    view = coord.stage("a")
    assert view.epoch == 2 and view.lifecycle is StageLifecycle.FINISHED
    assert sorted(view.progress.finished_splits) == sorted(SPLITS)
    doc = json.loads(storage.read_hint("dag-demo", "a") or b"{}")
    assert doc["per_unit_s"] == pytest.approx(0.5) and doc["fixed_s"] == pytest.approx(1.0)


def test_the_hint_is_advisory_a_corrupt_one_means_a_probe(env: tuple) -> None:
    coord, storage = env
    storage.write_hint("dag-demo", "a", b"{not json")
    clock = Clock()
    logic = ModelLogic(clock)
    _runner(coord, logic, clock, StorageThroughputHints(storage, "dag-demo")).run()
    assert logic.sizes[0] == 1 and logic.processed == list(SPLITS)


def test_bad_batch_arguments_are_refused() -> None:
    for bad in (0, "big", -3):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1 or 'auto'"):
            StageSpec(pipeline_key=KEY, stage_id="a", splits=SPLITS, batch_size=bad)
    with pytest.raises(ValueError, match="target_batch_s"):
        StageSpec(pipeline_key=KEY, stage_id="a", splits=SPLITS, target_batch_s=-1)


def test_transaction_ids_are_unique_per_pipeline_and_keep_the_epoch() -> None:
    from airflow_finalckpt.runtime.runner import transaction_id, transaction_prefix

    a = transaction_id("dag.run1", "publish", "2013-01-01-n3-abc", 1)
    b = transaction_id("dag.run2", "publish", "2013-01-01-n3-abc", 1)
    assert a != b and a.startswith(transaction_prefix("dag.run1", "publish"))
    assert not b.startswith(transaction_prefix("dag.run1", "publish"))
    assert a.startswith("publish.") and a.endswith(".e1")  # the stage first, the epoch last
    assert transaction_id("dag.run1", "publish", "2013-01-01-n3-abc", 1) == a  # stable
    long_ids = {transaction_id("k", "s" * 150, f"batch-{i}" * 10, 7) for i in range(3)}
    assert len(long_ids) == 3 and all(len(t) <= 200 and t.endswith(".e7") for t in long_ids)


def test_each_sink_of_a_stage_gets_its_own_transaction_id() -> None:
    """Issue 37: the sink id is part of the id (and so of every sink's staging path); an id
    written by an earlier version, without it, keeps the stage's prefix: it is still
    committed by id and still swept as an orphan."""
    from types import SimpleNamespace

    from airflow_finalckpt.runtime.closer import abort_orphaned_transactions
    from airflow_finalckpt.runtime.runner import transaction_id, transaction_prefix

    old = transaction_id("dag.run1", "publish", "2013-01-01-n3-abc", 1)
    a = transaction_id("dag.run1", "publish", "2013-01-01-n3-abc", 1, "windows_a")
    b = transaction_id("dag.run1", "publish", "2013-01-01-n3-abc", 1, "windows_b")
    assert len({old, a, b}) == 3
    assert a == "publish.p" + a.split(".p", 1)[1] and a.endswith(".windows_a.e1")
    prefix = transaction_prefix("dag.run1", "publish")
    assert all(t.startswith(prefix) for t in (old, a, b))
    long_ids = {transaction_id("k", "s", "b" * 190, 2, f"sink_{i}") for i in range(3)}
    assert len(long_ids) == 3 and all(len(t) <= 200 and t.endswith(".e2") for t in long_ids)

    aborted: list[str] = []

    class Sink:
        sink_id = "windows_a"

        def staged_txn_ids(self) -> set[str]:
            return {old, a, "other.p0.x.e1"}

        def abort(self, txn: object) -> None:
            aborted.append(txn.txn_id)  # type: ignore[attr-defined]

    recorded = SimpleNamespace(txn_id=a)
    coordinator = SimpleNamespace(
        pipeline_key="dag.run1", transactions=lambda stage_id: [(recorded, "PRECOMMITTED")]
    )
    log = SimpleNamespace(info=lambda *args: None)
    swept = abort_orphaned_transactions(coordinator, "publish", [Sink()], log)  # type: ignore[arg-type]
    assert swept == [old] and aborted == [old]


def test_a_stop_with_savepoint_waits_for_at_most_the_batch_in_flight(env: tuple) -> None:
    from airflow_finalckpt.core.model import StopMode, StopState
    from airflow_finalckpt.runtime.runner import RunStatus

    coord, _ = env
    clock = Clock()

    class StopInBatch(ModelLogic):
        def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
            out = super().process(batch, txn_ids)
            if len(self.sizes) == 3:  # an operator presses stop while batch 3 runs
                coord.request_stop(StopMode.SAVEPOINT, requested_by="test")
            return out

    logic = StopInBatch(clock)
    result = _runner(coord, logic, clock, target_batch_s=10.0).run()

    assert result.status is RunStatus.SUSPENDED
    assert len(logic.sizes) == 3  # the batch in flight ended, no further batch started
    view = coord.stage("a")
    assert view.lifecycle is StageLifecycle.SUSPENDED
    assert len(view.progress.finished_splits) == sum(logic.sizes) < len(SPLITS)
    stop = coord.stop_request()
    assert stop is not None and stop.state is StopState.COMPLETED
