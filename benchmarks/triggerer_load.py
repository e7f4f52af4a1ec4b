"""Triggerer load: W finished stages deferred on their final checkpoint, polling the store.

A finished stage waits in the triggerer (``FinalCheckpointTrigger``), which calls its blocking
``_poll`` in a worker thread every ``poll_interval`` (0.5 s by default). Here W finished stages
wait for a final checkpoint that cannot complete yet (one sibling stage is still running and has
not acknowledged it), so every poll finds nothing: the steady load of W waiting tasks.

The real trigger objects are built and their ``_poll`` is run from a thread pool of the size
``asyncio.to_thread`` uses (``min(32, cores + 4)``), one round = one poll of every waiter, as the
triggerer would do in one poll interval. Rounds are ``poll_interval`` apart, as every waiter
sleeps that long after its poll, so each round finds the waiters' shared pipeline snapshot
expired and pays for reading it once. Reported per W and store: seconds per round (must stay
well under the poll interval, or the triggerer falls behind), polls per second, and database
statements (per poll and per round) and write transactions per poll.

``fan_in`` measures how those waiters got there through the real API: F stages finish one by
one while a sibling stage runs. Each finish triggers its own eager final checkpoint, and none
can complete before the sibling's next split-batch boundary, which then acknowledges (and
completes, writing ``_metadata``) every one of them.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import Result, Target, log, postgres_available, postgres_database

NAME = "triggerer_load"
POLL_INTERVAL_S = 0.5


def _setup(store_url: str, storage_root: str, waiters: int) -> tuple[Any, list[str]]:
    """A pipeline with ``waiters`` FINISHED stages and one RUNNING stage ``busy``; one pending
    checkpoint (triggered after their finish, so it can close all of them) waits for ``busy``.

    The finished stages are written in one bulk UPDATE (finishing them one by one would trigger
    one eager checkpoint each: see ``fan_in``)."""
    from sqlalchemy import bindparam, update

    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.core.graph import StageGraph
    from airflow_finalckpt.core.model import EndOfData, StageSnapshot, TriggerReason
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store import schema as t
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(store_url)
    ensure_schema(engine)
    ids = [f"w{i:05d}" for i in range(waiters)]
    coordinator = Coordinator(engine, "waiters", writer=CheckpointStorage(storage_root))
    coordinator.register(StageGraph.from_edges([*ids, "busy"], ()))
    busy = coordinator.start_attempt("busy", total_splits=10)
    coordinator.record_batch("busy", busy.epoch, finished_splits=("s0",))
    rows = []
    for sid in ids:
        final = StageSnapshot(
            finished_splits=frozenset({"s0"}),
            end_of_data=EndOfData(manifest=[f"{sid}/p"], finished_at_checkpoint=1),
        ).model_dump(mode="json")
        rows.append({"b_stage_id": sid, "progress": final, "final_snapshot": final})
    with engine.begin() as conn:
        conn.execute(
            update(t.stages)
            .where(
                t.stages.c.pipeline_key == "waiters", t.stages.c.stage_id == bindparam("b_stage_id")
            )
            .values(
                lifecycle="FINISHED",
                epoch=1,
                total_splits=1,
                finish_threshold=1,
                progress=bindparam("progress"),
                final_snapshot=bindparam("final_snapshot"),
            ),
            rows,
        )
    assert coordinator.trigger(TriggerReason.MANUAL) == 1
    return engine, ids


def fan_in(store_url: str, storage_root: str, finishing: int) -> dict[str, float]:
    """``finishing`` stages finish one by one while a sibling runs, through the real API; then
    the sibling reaches its next batch boundary. Returns the costs and the pending checkpoints
    the finishes left (each finish triggers its own eager checkpoint)."""
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.core.graph import StageGraph
    from airflow_finalckpt.core.model import CheckpointState, EndOfData, StageSnapshot
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(store_url)
    try:
        ensure_schema(engine)
        ids = [f"f{i:05d}" for i in range(finishing)]
        coordinator = Coordinator(engine, "fan-in", writer=CheckpointStorage(storage_root))
        coordinator.register(StageGraph.from_edges([*ids, "busy"], ()))
        busy = coordinator.start_attempt("busy", total_splits=10)
        coordinator.record_batch("busy", busy.epoch, finished_splits=("s0",))
        epochs = {sid: coordinator.start_attempt(sid, total_splits=1).epoch for sid in ids}
        started = time.perf_counter()
        for sid in ids:
            snapshot = StageSnapshot(
                finished_splits=frozenset({"s0"}), end_of_data=EndOfData(manifest=[f"{sid}/p"])
            )
            coordinator.finish(sid, epochs[sid], snapshot)
        finishes_s = time.perf_counter() - started
        pending = len(coordinator.pending_for("busy"))
        started = time.perf_counter()
        outcome = coordinator.record_batch("busy", busy.epoch, finished_splits=("s1",))
        boundary_s = time.perf_counter() - started
        completed = [c for c in coordinator.checkpoints() if c.state is not CheckpointState.ABORTED]
        return {
            "finishes_s": finishes_s,
            "finish_s_mean": finishes_s / finishing,
            "pending_checkpoints": float(pending),
            "sibling_boundary_s": boundary_s,
            "acked_at_boundary": float(len(outcome.acked)),
            "completed_at_boundary": float(len(outcome.completed)),
            "completed_or_retained": float(len(completed)),
        }
    finally:
        engine.dispose()


def _count_statements(engine: Any) -> dict[str, int]:
    from sqlalchemy import event

    counts = {"statements": 0, "writes": 0}
    lock = threading.Lock()

    def on_execute(*_args: Any) -> None:
        with lock:
            counts["statements"] += 1

    def on_commit(conn: Any) -> None:
        del conn
        with lock:
            counts["writes"] += 1

    event.listen(engine, "before_cursor_execute", on_execute)
    event.listen(engine, "commit", on_commit)
    return counts


def measure(backend: str, store_url: str, waiters: int, rounds: int) -> dict[str, list[float]]:
    from airflow_finalckpt.hooks.finalckpt import shared_engine
    from airflow_finalckpt.triggers.final_checkpoint import FinalCheckpointTrigger

    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-waiters-") as storage_root:
        engine, ids = _setup(store_url, storage_root, waiters)
        engine.dispose()
        triggers = [
            FinalCheckpointTrigger(
                "waiters",
                sid,
                store_url,
                poll_interval=POLL_INTERVAL_S,
                storage_uri=storage_root,
                storage_options={},
            )
            for sid in ids
        ]
        counts = _count_statements(shared_engine(store_url))
        workers = min(32, (os.cpu_count() or 1) + 4)
        samples: dict[str, list[float]] = {}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for index in range(rounds):
                if index:
                    time.sleep(POLL_INTERVAL_S)
                before = dict(counts)
                started = time.perf_counter()
                found = list(pool.map(lambda trig: trig._poll().payload, triggers))
                seconds = time.perf_counter() - started
                if any(payload is not None for payload in found):
                    raise RuntimeError(f"{backend}: a waiter fired although nothing completed")
                samples.setdefault("round_s", []).append(seconds)
                samples.setdefault("polls_per_s", []).append(waiters / seconds)
                statements = counts["statements"] - before["statements"]
                samples.setdefault("statements_per_poll", []).append(statements / waiters)
                samples.setdefault("statements_per_round", []).append(float(statements))
                samples.setdefault("write_txns_per_poll", []).append(
                    (counts["writes"] - before["writes"]) / waiters
                )
        shared_engine(store_url).dispose()
    return samples


def run(quick: bool = False) -> Result:
    sizes = (10, 50) if quick else (10, 100, 1000)
    fan_sizes = (5, 20) if quick else (10, 30, 60)
    result = Result(NAME, repetitions=1 if quick else 3)
    result.parameters = {
        "waiters": list(sizes),
        "poll_interval_s": POLL_INTERVAL_S,
        "threads": min(32, (os.cpu_count() or 1) + 4),
        "rounds": result.repetitions,
        "what": "FinalCheckpointTrigger._poll of every waiter once per round, nothing closable",
        "fan_in_finishing": list(fan_sizes),
    }
    pg_problem = postgres_available()
    if pg_problem:
        result.notes.append(f"PostgreSQL skipped: {pg_problem}")
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-trig-") as tmp:
        for backend in ("sqlite", "postgresql"):
            if backend == "postgresql" and pg_problem:
                continue
            for waiters in sizes:
                log(f"{NAME}: {backend}, {waiters} waiting stages")
                if backend == "sqlite":
                    url = f"sqlite:///{Path(tmp)}/waiters-{waiters}.db"
                    samples = measure(backend, url, waiters, result.repetitions)
                else:
                    with postgres_database() as url:
                        samples = measure(backend, url, waiters, result.repetitions)
                case = result.case(f"{backend}/{waiters}", backend=backend, waiters=waiters)
                case.samples.update(samples)
                case.finalize()
                result.medians[f"round_s/{backend}/{waiters}"] = case.medians["round_s"]
            for finishing in fan_sizes:
                log(f"{NAME}: {backend}, fan-in of {finishing} finishing stages")
                with tempfile.TemporaryDirectory(prefix="finalckpt-bench-fan-") as ckpts:
                    if backend == "sqlite":
                        url = f"sqlite:///{Path(tmp)}/fan-{finishing}.db"
                        got = fan_in(url, ckpts, finishing)
                    else:
                        with postgres_database() as url:
                            got = fan_in(url, ckpts, finishing)
                case = result.case(
                    f"fan-in/{backend}/{finishing}", backend=backend, finishing=finishing
                )
                for metric, value in got.items():
                    case.add(metric, value)
                case.finalize()
            largest = max(sizes)
            round_s = result.medians[f"round_s/{backend}/{largest}"]
            result.ratios[f"round_over_poll_interval/{backend}/{largest}"] = (
                round_s / POLL_INTERVAL_S
            )
            result.targets.append(
                Target(
                    name=f"{largest} waiting stages keep up with the poll interval, {backend}",
                    target=f"one poll round < {POLL_INTERVAL_S:g} s",
                    measured=round_s,
                    unit="s",
                    passed=bool(round_s < POLL_INTERVAL_S),
                    note="the waiters of a pipeline share one snapshot read (four statements) per "
                    "poll interval; only a waiter it gives something to do asks the coordinator "
                    "(ensure_final_checkpoint takes the pipeline lock only for a replacement "
                    "checkpoint: write_txns_per_poll)",
                )
            )
    return result
