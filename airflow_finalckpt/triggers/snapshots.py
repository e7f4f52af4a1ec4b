"""One read per pipeline and poll interval, shared by every trigger of the triggerer process.

A thousand finished stages of one pipeline waiting in the triggerer used to read the store a
thousand times per poll interval (~10-14 statements each), far more than one process can do in
half a second. They now share a ``PipelineSnapshot`` (``Coordinator.waiting_snapshot``: four
statements, however many stages wait): a snapshot younger than a waiter's poll interval, and read
after the waiter was created, answers it without touching the store. Only a waiter the snapshot
gives something to do (an event to fire, a checkpoint to abort or trigger) asks the coordinator,
which checks everything again, so the cache can delay a waiter by one interval but never decide
for it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import UnknownPipelineError
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.views import PipelineSnapshot
from airflow_finalckpt.hooks.finalckpt import shared_engine

#: Snapshots nobody asked for in this long are dropped (pipelines come and go with DAG runs).
EVICT_AFTER_S = 300.0


@dataclass
class _Entry:
    #: Held while the snapshot is read, so concurrent waiters wait for that read, not repeat it.
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: None: the pipeline is not registered (yet).
    snapshot: PipelineSnapshot | None = None
    #: time.monotonic() when the read of ``snapshot`` started; -inf: never read.
    read_at: float = float("-inf")
    #: Reads completed so far: a caller that sees it grow while it waits takes that read.
    reads: int = 0
    used_at: float = float("-inf")


_ENTRIES: dict[tuple[int, str, str], _Entry] = {}
_ENTRIES_LOCK = threading.Lock()


def _entry(store_url: str, pipeline_key: str, now: float) -> _Entry:
    with _ENTRIES_LOCK:
        key = (os.getpid(), store_url, pipeline_key)  # never shared across a fork
        entry = _ENTRIES.get(key)
        if entry is None:
            for old in [k for k, e in _ENTRIES.items() if now - e.used_at > EVICT_AFTER_S]:
                del _ENTRIES[old]
            entry = _ENTRIES[key] = _Entry()
        entry.used_at = now
        return entry


def shared_snapshot(
    store_url: str, pipeline_key: str, *, max_age: float, not_before: float
) -> PipelineSnapshot | None:
    """The pipeline's snapshot, read again only if it is ``max_age`` seconds old or was read
    before ``not_before`` (both ``time.monotonic()``): a waiter never decides on a read older
    than itself. None if the pipeline is not registered. Blocking: call it off the event loop.
    Store errors propagate (the trigger rides out transient ones).
    """
    entry = _entry(store_url, pipeline_key, time.monotonic())
    reads_seen = entry.reads
    with entry.lock:
        # A read that ended while this caller waited on the lock is as fresh as one it would
        # start itself, however long it took: under load a read slower than ``max_age`` must
        # not make every waiter queued behind it read again.
        fresh = entry.reads > reads_seen or time.monotonic() - entry.read_at < max_age
        if entry.read_at >= not_before and fresh:
            return entry.snapshot
        started = time.monotonic()
        coordinator: CoordinatorPort = Coordinator(shared_engine(store_url), pipeline_key)
        try:
            snapshot: PipelineSnapshot | None = coordinator.waiting_snapshot()
        except UnknownPipelineError:
            snapshot = None
        entry.snapshot, entry.read_at = snapshot, started
        entry.reads += 1
        return snapshot


def clear_snapshots() -> None:
    """Forget every shared snapshot of this process (tests)."""
    with _ENTRIES_LOCK:
        _ENTRIES.clear()
