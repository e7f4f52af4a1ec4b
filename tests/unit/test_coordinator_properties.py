"""Property-based tests of the coordinator: random interleavings, invariants after every step.

Hypothesis drives trigger / batch / ack / finish / complete / close / abort / expire / stop /
stale-epoch events for a small diamond pipeline against a real SQLite store, and checks the
invariants of docs/protocol.md after every step:

- no completed checkpoint misses a stage that was running when it was triggered;
- a stage never closes before a qualifying checkpoint (id >= its first checkpoint after finish);
- stale epochs never win (their calls raise and change nothing);
- a transaction is committed only when a completed checkpoint covers it, at most once;
- a pending checkpoint never waits for a stage that can no longer answer it (no hang).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import select

from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core.errors import (
    IllegalTransitionError,
    StaleEpochError,
    StopRequestError,
)
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.store import schema
from airflow_finalckpt.store.engine import make_engine

STAGES = ["a", "b", "c", "d"]
EDGES = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
TIMEOUT_S = 100.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def _dump_store(coord: Coordinator) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to prove that a refused call changed nothing."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with coord.engine.connect() as conn:
        for table in schema.metadata.sorted_tables:
            rows = conn.execute(select(table)).all()
            out[table.name] = sorted((tuple(map(repr, r)) for r in rows), key=repr)
    return out


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.tmp = tempfile.mkdtemp(prefix="finalckpt-prop-", dir=base)
        self.engine = make_engine(f"sqlite:///{self.tmp}/store.db")
        schema.metadata.create_all(self.engine)
        self.clock = FakeClock()
        self.coord = Coordinator(self.engine, "prop", clock=self.clock)
        self.graph = StageGraph.from_edges(STAGES, EDGES)
        self.coord.register(
            self.graph, CoordinatorOptions(retain_checkpoints=2, checkpoint_timeout_s=TIMEOUT_S)
        )
        self.epochs: dict[str, list[int]] = {s: [] for s in STAGES}
        self.split_counter = itertools.count()
        self.txn_counter = itertools.count()
        # stage -> ids of the checkpoints triggered while it was RUNNING (model of the plan)
        self.running_at_trigger: dict[int, set[str]] = {}

    def teardown(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------------

    def lifecycle(self, stage: str) -> StageLifecycle:
        return self.coord.stage(stage).lifecycle

    def current_epoch(self, stage: str) -> int:
        return self.coord.stage(stage).epoch

    def upstream_finished(self, stage: str) -> bool:
        return all(self.lifecycle(up).is_finished for up in self.graph.upstream(stage))

    def new_txn(self, stage: str) -> SinkTransaction:
        return SinkTransaction(sink_id="out", txn_id=f"{stage}-{next(self.txn_counter)}")

    def record_trigger(self, cid: int | None, before: dict[str, StageLifecycle]) -> None:
        if cid is not None:
            self.running_at_trigger[cid] = {
                s
                for s, lc in before.items()
                if lc in (StageLifecycle.RUNNING, StageLifecycle.SUSPENDED)
            }

    def lifecycles(self) -> dict[str, StageLifecycle]:
        return {s: v.lifecycle for s, v in self.coord.stages().items()}

    # -- rules --------------------------------------------------------------------------

    def pick(self, data: st.DataObject, candidates: list[str]) -> str | None:
        """Draw among the stages a rule can act on, so few steps are wasted on no-ops."""
        return data.draw(st.sampled_from(candidates)) if candidates else None

    def in_lifecycle(self, *lifecycles: StageLifecycle) -> list[str]:
        return [s for s, lc in self.lifecycles().items() if lc in lifecycles]

    @rule(data=st.data())
    def start_attempt(self, data: st.DataObject) -> None:
        stage = self.pick(
            data,
            [
                s
                for s in self.in_lifecycle(
                    StageLifecycle.NOT_STARTED,
                    StageLifecycle.RUNNING,
                    StageLifecycle.FINISHED,
                    StageLifecycle.SUSPENDED,
                )
                if self.upstream_finished(s)
            ],
        )
        if stage is None:
            return
        try:
            view = self.coord.start_attempt(stage, total_splits=10)
        except IllegalTransitionError:
            assert self.lifecycle(stage) is StageLifecycle.SUSPENDED
            return
        self.epochs[stage].append(view.epoch)
        assert view.epoch == max(self.epochs[stage])

    @rule(data=st.data(), splits=st.integers(min_value=0, max_value=2))
    def batch(self, data: st.DataObject, splits: int) -> None:
        stage = self.pick(data, self.in_lifecycle(StageLifecycle.RUNNING))
        if stage is None:
            return
        before = set(self.coord.pending_for(stage))
        outcome = self.coord.record_batch(
            stage,
            self.current_epoch(stage),
            finished_splits=[f"{stage}-s{next(self.split_counter)}" for _ in range(splits)],
            transactions=[self.new_txn(stage)],
            watermark=next(self.split_counter),
        )
        assert set(outcome.acked) == before
        assert self.coord.pending_for(stage) == []

    @rule(data=st.data(), drain=st.booleans())
    def finish(self, data: st.DataObject, drain: bool) -> None:
        stage = self.pick(data, self.in_lifecycle(StageLifecycle.RUNNING))
        if stage is None:
            return
        known = {c.checkpoint_id for c in self.coord.checkpoints()}
        out = self.coord.finish(
            stage,
            self.current_epoch(stage),
            StageSnapshot(
                pending_transactions=(self.new_txn(stage),),
                end_of_data=EndOfData(drain=drain, manifest=[f"{stage}.parquet"]),
            ),
        )
        before = self.lifecycles()
        if out.eager_checkpoint_id is not None and out.eager_checkpoint_id not in known:
            # The eager checkpoint was planned after the finish: same as a trigger now. (A
            # finish that joined a pending eager checkpoint triggered none: coalescing.)
            self.record_trigger(out.eager_checkpoint_id, before)
        assert out.end_of_data.finished_at_checkpoint == out.threshold
        assert self.coord.pending_for(stage) == []

    @rule(periodic=st.booleans())
    def trigger(self, periodic: bool) -> None:
        before = self.lifecycles()
        reason = TriggerReason.PERIODIC if periodic else TriggerReason.MANUAL
        self.record_trigger(self.coord.trigger(reason), before)

    @rule(data=st.data())
    def abort_pending(self, data: st.DataObject) -> None:
        pending = [
            c.checkpoint_id for c in self.coord.checkpoints() if c.state is CheckpointState.PENDING
        ]
        if pending:
            cid = data.draw(st.sampled_from(pending))
            assert self.coord.abort(cid, "test abort")
            assert self.coord.checkpoint(cid).state is CheckpointState.ABORTED

    @rule()
    def expire(self) -> None:
        self.clock.now += TIMEOUT_S + 1
        expired = self.coord.expire_timed_out()
        for cid in expired:
            assert self.coord.checkpoint(cid).state is CheckpointState.ABORTED

    @rule(data=st.data(), progressive=st.booleans())
    def commit_and_close(self, data: st.DataObject, progressive: bool) -> None:
        stage = self.pick(data, self.in_lifecycle(StageLifecycle.RUNNING, StageLifecycle.FINISHED))
        if stage is None:
            return
        view = self.coord.stage(stage)
        if view.lifecycle not in (StageLifecycle.RUNNING, StageLifecycle.FINISHED):
            return
        if progressive or view.lifecycle is StageLifecycle.FINISHED:
            for txn in self.coord.committable_transactions(stage):
                assert self.coord.mark_committed(stage, view.epoch, txn.sink_id, txn.txn_id)
        if view.lifecycle is not StageLifecycle.FINISHED:
            return
        self.coord.ensure_final_checkpoint(stage)
        cid = self.coord.closable_checkpoint(stage)
        if cid is None:
            return
        for txn in self.coord.committable_transactions(stage):
            self.coord.mark_committed(stage, view.epoch, txn.sink_id, txn.txn_id)
        aborted = self.coord.close(stage, view.epoch, cid)
        assert all(t.checkpoint_id is None or t.checkpoint_id > cid for t in aborted)
        assert self.lifecycle(stage) is StageLifecycle.CLOSED

    @rule(data=st.data(), action=st.sampled_from(["ack", "batch", "finish", "close", "commit"]))
    def stale_epoch_never_wins(self, data: st.DataObject, action: str) -> None:
        stage = self.pick(data, [s for s in STAGES if self.current_epoch(s) >= 2])
        if stage is None:
            return
        current = self.current_epoch(stage)
        stale = current - 1
        before = _dump_store(self.coord)
        with pytest.raises(StaleEpochError):
            if action == "ack":
                self.coord.acknowledge(1, stage, stale)
            elif action == "batch":
                self.coord.record_batch(stage, stale, finished_splits=["zombie"])
            elif action == "finish":
                self.coord.finish(stage, stale, StageSnapshot())
            elif action == "commit":
                self.coord.mark_committed(stage, stale, "out", "any")
            else:
                self.coord.close(stage, stale, 1)
        assert _dump_store(self.coord) == before

    @rule(mode=st.sampled_from([StopMode.SAVEPOINT, StopMode.DRAIN]))
    def request_stop(self, mode: StopMode) -> None:
        before = self.lifecycles()
        try:
            stop = self.coord.request_stop(mode)
        except StopRequestError:
            return
        if stop.savepoint_id is not None:
            self.record_trigger(stop.savepoint_id, before)

    @rule(data=st.data())
    def suspend(self, data: st.DataObject) -> None:
        stop = self.coord.stop_request()
        stage = self.pick(data, self.in_lifecycle(StageLifecycle.RUNNING))
        if (
            stage is None
            or stop is None
            or stop.mode is not StopMode.SAVEPOINT
            or stop.state is not StopState.COMPLETED
        ):
            return
        view = self.coord.stage(stage)
        self.coord.suspend(stage, view.epoch)
        assert self.lifecycle(stage) is StageLifecycle.SUSPENDED

    @rule()
    def resume(self) -> None:
        stop = self.coord.stop_request()
        if (
            stop is None
            or stop.mode is not StopMode.SAVEPOINT
            or stop.state is not StopState.COMPLETED
        ):
            return
        before = self.lifecycles()
        self.coord.resume()
        assert self.coord.stop_request().state is StopState.RESUMED  # type: ignore[union-attr]
        latest = self.coord.checkpoints(limit=1)
        if latest and latest[0].checkpoint_id not in self.running_at_trigger:
            self.record_trigger(latest[0].checkpoint_id, before)

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def completed_checkpoints_cover_every_running_stage(self) -> None:
        with self.engine.connect() as conn:
            acks: dict[int, set[str]] = {}
            joins: dict[int, set[str]] = {}
            for cid, sid, by_finish in conn.execute(
                select(schema.acks.c.checkpoint_id, schema.acks.c.stage_id, schema.acks.c.by_finish)
            ):
                acks.setdefault(int(cid), set()).add(sid)
                if by_finish:
                    joins.setdefault(int(cid), set()).add(sid)
        for info in self.coord.checkpoints():
            expected = self.running_at_trigger.get(info.checkpoint_id)
            if expected is not None:
                assert set(info.plan.to_ack) == expected, info
            got = acks.get(info.checkpoint_id, set())
            waited = got & set(info.plan.to_ack)
            # a stage it did not wait for only ever joins it by finishing (coalescing)
            assert got - waited <= joins.get(info.checkpoint_id, set()), info
            if info.is_completed:
                assert waited == set(info.plan.to_ack)
                assert info.acks_pending == 0
            if info.state is CheckpointState.PENDING:
                assert info.acks_pending == len(info.plan.to_ack) - len(waited)

    @invariant()
    def no_stage_closes_before_a_qualifying_checkpoint(self) -> None:
        completed = {c.checkpoint_id for c in self.coord.checkpoints() if c.is_completed}
        for view in self.coord.stages().values():
            if view.lifecycle is StageLifecycle.CLOSED:
                assert view.finish_threshold is not None
                assert view.closed_checkpoint_id is not None
                assert view.closed_checkpoint_id >= view.finish_threshold
                assert view.closed_checkpoint_id in completed

    @invariant()
    def transactions_commit_only_when_covered(self) -> None:
        completed = [c.checkpoint_id for c in self.coord.checkpoints() if c.is_completed]
        latest = max(completed, default=None)
        for txn, state in self.coord.transactions():
            if state == TransactionState.COMMITTED.value:
                assert txn.checkpoint_id is not None and latest is not None
                assert txn.checkpoint_id <= latest

    @invariant()
    def pending_checkpoints_never_hang_on_finished_stages(self) -> None:
        views = self.coord.stages()
        for info in self.coord.checkpoints():
            if info.state is not CheckpointState.PENDING:
                continue
            for sid in info.plan.to_ack:
                if sid in self.coord.pending_for(
                    sid
                ) or info.checkpoint_id in self.coord.pending_for(sid):
                    assert views[sid].lifecycle in (
                        StageLifecycle.RUNNING,
                        StageLifecycle.SUSPENDED,
                    ), (info.checkpoint_id, sid, views[sid].lifecycle)

    @invariant()
    def checkpoint_ids_are_dense_and_unique(self) -> None:
        ids = sorted(c.checkpoint_id for c in self.coord.checkpoints())
        assert ids == list(range(1, len(ids) + 1))


CoordinatorMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("FINALCKPT_PROPERTY_EXAMPLES", "60")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCoordinatorInterleavings = CoordinatorMachine.TestCase
