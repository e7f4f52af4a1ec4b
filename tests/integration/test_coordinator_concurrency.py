"""Several OS processes drive one pipeline at once, on SQLite (file) and on PostgreSQL.

Four stage-driver processes and two chaos processes (triggers, expiries, aborts, zombie attempts)
share one pipeline of six stages; see ``tests/coordinator_workload.py``. Afterwards the store
must show no lost and no doubled transition: checkpoint ids without gaps, exactly the planned
acknowledgements, every stage closed once on a checkpoint at or after its threshold, every
transaction committed exactly once (or aborted), every split's output committed exactly once.
Part-way through, one driver is SIGKILLed in the middle of a stage; a new attempt (another
process) must take the stage over and finish the job with the same result. (Spawning the
processes dominates the run time, so one run per store covers both the plain and the crash case:
the victim dies before it commits or closes anything, so every check stays exact.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import (
    CheckpointState,
    StageLifecycle,
    StageSnapshot,
    TransactionState,
)
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

TESTS_DIR = str(Path(__file__).resolve().parents[1])
if TESTS_DIR not in sys.path:  # spawned children inherit sys.path and import the workload
    sys.path.insert(0, TESTS_DIR)

import coordinator_workload as wl  # noqa: E402

pytestmark = pytest.mark.slow

CTX = multiprocessing.get_context("spawn")
RUN_TIMEOUT_S = 75.0
VICTIM = "w0"
VICTIM_STAGE = wl.OWNERS[VICTIM][0]


def _join(processes: Iterable[Any], deadline: float) -> None:
    for proc in processes:
        proc.join(max(0.1, deadline - time.monotonic()))


def _kill_mid_stage(coord: Coordinator, victim: Any, milestone: Any) -> frozenset[str]:
    """SIGKILL the victim in the middle of its first stage; return the splits it recorded."""
    assert milestone.wait(30), f"driver {VICTIM} never got into stage {VICTIM_STAGE}"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    assert victim.exitcode == -signal.SIGKILL
    view = coord.stage(VICTIM_STAGE)
    assert view.lifecycle is StageLifecycle.RUNNING, view
    return view.progress.finished_splits


def test_processes_drive_one_pipeline_without_lost_or_double_transitions(
    store_url: str, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    work = wl.Workload(url=store_url, pipeline_key="hammered", log_dir=str(log_dir))
    wl.register(work)
    stop, milestone = CTX.Event(), CTX.Event()
    drivers = {
        name: CTX.Process(
            target=wl.run_stages,
            args=(work, name, stages, milestone if name == VICTIM else None),
            name=name,
        )
        for name, stages in wl.OWNERS.items()
    }
    chaos = [
        CTX.Process(
            target=wl.run_chaos,
            args=(work, f"chaos{i}", 1000 + i, stop, (VICTIM_STAGE,)),
            name=f"chaos{i}",
        )
        for i in range(2)
    ]
    started = [*drivers.values(), *chaos]
    engine = make_engine(store_url)
    coord = Coordinator(engine, work.pipeline_key)
    recorded_before_kill: frozenset[str] = frozenset()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for proc in started:
            proc.start()
        recorded_before_kill = _kill_mid_stage(coord, drivers[VICTIM], milestone)
        recovery = CTX.Process(
            target=wl.run_stages, args=(work, "recovery", wl.OWNERS[VICTIM]), name="recovery"
        )
        started.append(recovery)
        recovery.start()
        _join([p for p in started if p not in chaos], deadline)
        stop.set()
        _join(chaos, deadline + 10)
        hung = [p.name for p in started if p.is_alive()]
        assert not hung, f"processes still running after {RUN_TIMEOUT_S:.0f} s: {hung}"
        failed = {
            p.name: p.exitcode for p in started if p.exitcode != 0 and p is not drivers[VICTIM]
        }
        assert not failed, f"processes failed (see captured stderr): {failed}"
        events = wl.read_logs(str(log_dir))
        check_invariants(engine, work, events)
        victim_pid = drivers[VICTIM].pid
        assert victim_pid is not None
        check_recovery(coord, work, events, victim_pid, recorded_before_kill)
    finally:
        for proc in started:
            if proc.pid is not None and proc.is_alive():
                proc.kill()
                proc.join(5)
        engine.dispose()


def check_invariants(engine: Engine, work: wl.Workload, events: list[dict[str, Any]]) -> None:
    key = work.pipeline_key
    with engine.connect() as conn:
        next_id = conn.execute(
            select(t.pipelines.c.next_checkpoint_id).where(t.pipelines.c.pipeline_key == key)
        ).scalar_one()
        checkpoints = (
            conn.execute(
                select(t.checkpoints)
                .where(t.checkpoints.c.pipeline_key == key)
                .order_by(t.checkpoints.c.checkpoint_id)
            )
            .mappings()
            .all()
        )
        acks = conn.execute(select(t.acks).where(t.acks.c.pipeline_key == key)).mappings().all()
        stages = {
            r["stage_id"]: r
            for r in conn.execute(select(t.stages).where(t.stages.c.pipeline_key == key))
            .mappings()
            .all()
        }
        txns = (
            conn.execute(select(t.transactions).where(t.transactions.c.pipeline_key == key))
            .mappings()
            .all()
        )

    ids = check_checkpoint_ids(checkpoints, next_id)
    check_acks(checkpoints, acks)
    completed_ids = {int(c["checkpoint_id"]) for c in checkpoints if c["completed_at"]}
    check_stages_closed(work, stages, completed_ids, events)
    check_transactions(work, events, txns, stages, ids)
    check_processed(work, events)


def check_checkpoint_ids(checkpoints: Sequence[Any], next_id: int) -> list[int]:
    # Checkpoint ids are exactly 1..N: no id lost, none handed out twice.
    ids = [int(c["checkpoint_id"]) for c in checkpoints]
    assert ids == list(range(1, len(ids) + 1))
    assert next_id == len(ids) + 1
    # At least one checkpoint; finishes may share one eager checkpoint (coalescing), so not
    # necessarily one per stage. That every stage closed on a completed checkpoint >= its
    # threshold is checked by check_stages_closed.
    assert ids
    return ids


def check_acks(checkpoints: Sequence[Any], acks: Sequence[Any]) -> None:
    # Every checkpoint counted exactly the acknowledgements it waited for; none hangs. A stage
    # it did not wait for (started after the trigger) may only have joined it by finishing.
    acked: dict[int, list[str]] = defaultdict(list)
    joined: dict[int, list[str]] = defaultdict(list)
    for ack in acks:
        acked[int(ack["checkpoint_id"])].append(ack["stage_id"])
        if ack["by_finish"]:
            joined[int(ack["checkpoint_id"])].append(ack["stage_id"])
    completed = 0
    for ck in checkpoints:
        cid, to_ack = int(ck["checkpoint_id"]), ck["plan"]["to_ack"]
        got = [sid for sid in acked[cid] if sid in to_ack]
        extra = set(acked[cid]) - set(to_ack)
        assert extra <= set(joined[cid]), (cid, extra, to_ack)
        assert ck["acks_pending"] == len(to_ack) - len(got), (cid, ck["acks_pending"], got)
        assert ck["state"] != CheckpointState.PENDING.value, f"checkpoint {cid} hangs"
        if ck["completed_at"] is not None:
            completed += 1
            assert ck["acks_pending"] == 0 and sorted(got) == sorted(to_ack), cid
            assert ck["state"] in (CheckpointState.COMPLETED.value, "DISCARDED"), cid
        else:
            assert ck["state"] == CheckpointState.ABORTED.value and ck["failure_reason"], cid
    assert completed >= 1


def check_stages_closed(
    work: wl.Workload,
    stages: dict[str, Any],
    completed_ids: set[int],
    events: list[dict[str, Any]],
) -> None:
    # Every stage finished all its splits and closed once, at or after its threshold.
    assert set(stages) == set(wl.STAGES)
    for sid, row in stages.items():
        all_splits = frozenset(work.splits(sid))
        assert row["lifecycle"] == StageLifecycle.CLOSED.value, sid
        assert row["closed_checkpoint_id"] >= row["finish_threshold"], sid
        assert row["closed_checkpoint_id"] in completed_ids, sid
        assert StageSnapshot.model_validate(row["progress"]).finished_splits == all_splits, sid
        final = StageSnapshot.model_validate(row["final_snapshot"])
        assert final.finished_splits == all_splits, sid
    closes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        if ev["event"] == "closed":
            closes[ev["stage"]].append(ev)
    for sid, row in stages.items():
        logged = closes[sid]
        assert len(logged) == 1, (sid, logged)
        for ev in logged:
            assert ev["checkpoint"] == row["closed_checkpoint_id"], (sid, ev)
            assert ev["aborted"] == [], (sid, ev)


def check_transactions(
    work: wl.Workload,
    events: list[dict[str, Any]],
    txns: Sequence[Any],
    stages: dict[str, Any],
    ids: list[int],
) -> None:
    # Transactions: none left pre-committed, each committed at most once by a live call, and
    # every split's output committed exactly once.
    commits = Counter(ev["txn"] for ev in events if ev["event"] == "commit" and ev["newly"])
    committed_splits: dict[str, Counter[str]] = defaultdict(Counter)
    for txn in txns:
        name, state = txn["txn_id"], txn["state"]
        assert state in (TransactionState.COMMITTED.value, TransactionState.ABORTED.value), name
        assert commits[name] <= 1, f"{name} committed {commits[name]} times"
        if state == TransactionState.COMMITTED.value:
            covered_by = txn["checkpoint_id"]
            assert covered_by is not None and covered_by in ids, name
            assert covered_by <= stages[txn["stage_id"]]["closed_checkpoint_id"], name
            assert commits[name] == 1, f"{name} committed without a logged commit"
            committed_splits[txn["stage_id"]].update(txn["payload"]["splits"])
        else:
            assert commits[name] == 0, name
    for sid in wl.STAGES:
        assert committed_splits[sid] == Counter(work.splits(sid)), sid


def check_processed(work: wl.Workload, events: list[dict[str, Any]]) -> None:
    # The splits the processes worked on are exactly the splits recorded as finished.
    processed: dict[str, set[str]] = defaultdict(set)
    for ev in events:
        if ev["event"] == "processed":
            processed[ev["stage"]].update(ev["splits"])
    for sid in wl.STAGES:
        assert processed[sid] == set(work.splits(sid)), sid


def check_recovery(
    coord: Coordinator,
    work: wl.Workload,
    events: list[dict[str, Any]],
    victim_pid: int,
    recorded_before_kill: frozenset[str],
) -> None:
    """A new attempt took the killed stage over with a newer epoch and processed exactly the
    splits the killed attempt had not recorded, each once."""
    all_splits = set(work.splits(VICTIM_STAGE))
    assert 2 * work.batch_size <= len(recorded_before_kill) < len(all_splits)
    victim_epochs = [
        ev["epoch"]
        for ev in events
        if ev["pid"] == victim_pid and ev["event"] == "attempt" and ev["stage"] == VICTIM_STAGE
    ]
    assert victim_epochs
    after = [ev for ev in events if ev["pid"] != victim_pid and ev.get("stage") == VICTIM_STAGE]
    attempts = [ev for ev in after if ev["event"] == "attempt"]
    assert attempts and attempts[0]["epoch"] > max(victim_epochs)
    assert attempts[0]["lifecycle"] == StageLifecycle.RUNNING.value
    redone = [s for ev in after if ev["event"] == "processed" for s in ev["splits"]]
    assert sorted(redone) == sorted(all_splits - recorded_before_kill)
    assert coord.stage(VICTIM_STAGE).epoch > max(victim_epochs)
