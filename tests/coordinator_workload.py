"""Worker functions for the multi-process coordinator tests (importable by spawned children).

One pipeline of six stages is driven by several OS processes at once, each with its own engine:

* stage drivers: for each owned stage (after its upstream stages closed, as Airflow would start
  it): start an attempt, process the remaining splits in batches (``record_batch`` with one sink
  transaction per batch), finish, wait for a closable checkpoint, commit, close. A driver that
  gets StaleEpochError leaves the stage to the newer attempt, as a fenced Airflow task must;
* chaos processes: trigger periodic and manual checkpoints, expire timed-out ones, abort random
  pending ones, and now and then take a running or finished stage over with a second attempt
  that drives it to the end while the first one is still at work (Airflow's zombie case).

Every process appends what it did to its own JSON-lines file; the test reads them at the end.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core.errors import IllegalTransitionError, StaleEpochError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    TriggerReason,
)
from airflow_finalckpt.store.engine import make_engine

#: stage id -> upstream stage ids: two chains joined by "e", and an independent "f".
STAGES: dict[str, tuple[str, ...]] = {
    "a": (),
    "b": ("a",),
    "c": (),
    "d": ("c",),
    "e": ("b", "d"),
    "f": (),
}
#: Which stage driver process owns which stages (listed in topological order).
OWNERS: dict[str, tuple[str, ...]] = {
    "w0": ("a", "e"),
    "w1": ("b", "f"),
    "w2": ("c",),
    "w3": ("d",),
}


@dataclass(frozen=True)
class Workload:
    url: str
    pipeline_key: str
    log_dir: str
    splits_per_stage: int = 12
    batch_size: int = 2
    batch_delay_s: float = 0.015
    checkpoint_timeout_s: float = 1.0
    deadline_s: float = 90.0

    def splits(self, stage_id: str) -> list[str]:
        return [f"{stage_id}-{i:03d}" for i in range(self.splits_per_stage)]


def graph() -> StageGraph:
    return StageGraph.build(Stage(sid, ups) for sid, ups in STAGES.items())


def register(work: Workload) -> None:
    engine = make_engine(work.url)
    try:
        Coordinator(engine, work.pipeline_key).register(
            graph(),
            CoordinatorOptions(
                retain_checkpoints=2, checkpoint_timeout_s=work.checkpoint_timeout_s
            ),
        )
    finally:
        engine.dispose()


class _Log:
    def __init__(self, work: Workload, name: str) -> None:
        path = Path(work.log_dir) / f"{name}-{os.getpid()}.jsonl"
        self._file: TextIO = path.open("a", buffering=1, encoding="utf-8")

    def __call__(self, event: str, **fields: Any) -> None:
        self._file.write(
            json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
        )

    def close(self) -> None:
        self._file.close()


@contextmanager
def _session(work: Workload, name: str) -> Iterator[tuple[Coordinator, _Log]]:
    engine = make_engine(work.url)
    log = _Log(work, name)
    try:
        yield Coordinator(engine, work.pipeline_key), log
    finally:
        log.close()
        engine.dispose()


def read_logs(log_dir: str) -> list[dict[str, Any]]:
    """Every event of every process; a line cut short by SIGKILL is skipped."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(log_dir).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


# ---------------------------------------------------------------------------------- drivers


def run_stages(
    work: Workload, name: str, stage_ids: tuple[str, ...], milestone: Any = None
) -> None:
    """Entry point of a stage driver process.

    ``milestone`` (an Event): set once the first stage recorded two batches; from then on the
    batches slow down, so whoever waits for it catches the driver in the middle of that stage.
    """
    deadline = time.monotonic() + work.deadline_s
    with _session(work, name) as (coord, log):
        for sid in stage_ids:
            upstream = STAGES[sid]

            def upstream_closed(upstream: tuple[str, ...] = upstream) -> bool:
                return all(coord.stage(up).lifecycle is StageLifecycle.CLOSED for up in upstream)

            _wait(upstream_closed, deadline, f"upstream of {sid} closed")
            _drive_or_leave(work, coord, log, sid, deadline, milestone)
            milestone = None


def _drive_or_leave(
    work: Workload,
    coord: Coordinator,
    log: _Log,
    sid: str,
    deadline: float,
    milestone: Any = None,
) -> None:
    try:
        _drive(work, coord, log, sid, deadline, milestone)
    except StaleEpochError as exc:  # a newer attempt owns the stage now: leave it to that one
        log("fenced", stage=sid, epoch=exc.epoch, current=exc.current)


def _wait(cond: Callable[[], bool], deadline: float, what: str) -> None:
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def _drive(
    work: Workload,
    coord: Coordinator,
    log: _Log,
    sid: str,
    deadline: float,
    milestone: Any = None,
) -> None:
    view = coord.start_attempt(sid, total_splits=work.splits_per_stage)
    epoch = view.epoch
    log("attempt", stage=sid, epoch=epoch, lifecycle=str(view.lifecycle))
    if view.lifecycle is StageLifecycle.CLOSED:
        return
    if view.lifecycle is StageLifecycle.RUNNING:
        remaining = sorted(set(work.splits(sid)) - view.progress.finished_splits)
        delay = work.batch_delay_s
        for number, start in enumerate(range(0, len(remaining), work.batch_size)):
            if milestone is not None and number == 2:
                milestone.set()
                delay = 0.25
            batch = remaining[start : start + work.batch_size]
            log("processed", stage=sid, epoch=epoch, splits=batch)
            time.sleep(delay)  # the Spark job of this batch
            sink_txn = SinkTransaction(
                sink_id=f"{sid}-sink",
                txn_id=f"{sid}-e{epoch}-{batch[0]}",
                payload={"splits": batch},
            )
            out = coord.record_batch(sid, epoch, finished_splits=batch, transactions=[sink_txn])
            log("batch", stage=sid, epoch=epoch, acked=list(out.acked))
        fin = coord.finish(
            sid, epoch, StageSnapshot(end_of_data=EndOfData(manifest=[f"{sid}/part-0"]))
        )
        log("finished", stage=sid, epoch=epoch, threshold=fin.threshold)
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"stage {sid} never became closable")
        cid = coord.closable_checkpoint(sid)
        if cid is None:
            coord.ensure_final_checkpoint(sid)
            time.sleep(0.01)
            continue
        for txn in coord.committable_transactions(sid):
            newly = coord.mark_committed(sid, epoch, txn.sink_id, txn.txn_id)
            log("commit", stage=sid, epoch=epoch, txn=txn.txn_id, newly=newly)
        try:
            aborted = coord.close(sid, epoch, cid)
        except IllegalTransitionError as exc:  # more transactions became covered meanwhile
            log("close_refused", stage=sid, epoch=epoch, reason=str(exc))
            continue
        log("closed", stage=sid, epoch=epoch, checkpoint=cid, aborted=[x.txn_id for x in aborted])
        return


# ---------------------------------------------------------------------------------- chaos


def run_chaos(
    work: Workload,
    name: str,
    seed: int,
    stop_event: Any,
    spare: tuple[str, ...] = (),
    max_takeovers: int = 2,
) -> None:
    """Entry point of a chaos process: triggers, expiries, aborts and takeovers of any stage
    but the ``spare`` ones."""
    rng = random.Random(seed)
    takeovers = 0
    deadline = time.monotonic() + work.deadline_s
    with _session(work, name) as (coord, log):
        while not stop_event.is_set() and time.monotonic() < deadline:
            roll = rng.random()
            if roll < 0.45:
                log("trigger", checkpoint=coord.trigger(TriggerReason.PERIODIC))
            elif roll < 0.65:
                log("trigger", checkpoint=coord.trigger(TriggerReason.MANUAL))
            elif roll < 0.8:
                log("expired", checkpoints=coord.expire_timed_out())
            elif roll < 0.93:
                pending = [
                    c.checkpoint_id
                    for c in coord.checkpoints(limit=6)
                    if c.state is CheckpointState.PENDING
                ]
                if pending:
                    cid = rng.choice(pending)
                    log("abort", checkpoint=cid, aborted=coord.abort(cid, f"chaos {name}"))
            elif takeovers < max_takeovers:
                live = [
                    sid
                    for sid, view in coord.stages().items()
                    if view.lifecycle in (StageLifecycle.RUNNING, StageLifecycle.FINISHED)
                    and sid not in spare
                ]
                if live:
                    takeovers += 1
                    sid = rng.choice(live)
                    log("takeover", stage=sid)
                    _drive_or_leave(work, coord, log, sid, deadline)
            time.sleep(rng.uniform(0.005, 0.03))
