"""Fault-injecting stand-ins for the coordinator, checkpoint storage, sinks and GC.

They behave exactly like the real objects (they are subclasses or thin wrappers that call the
real code) and report the fault points they pass to a :class:`FaultInjector`. Points inside code
that offers no seam are reached by swapping one module global for the duration of a call:

- ``airflow_finalckpt.storage.atomic.os``: its ``replace`` (the rename that publishes an atomic
  write) first reports ``metadata-mid-write`` / ``state-mid-write``;
- ``airflow_finalckpt.runtime.gc.collect_garbage`` (called by ``collect_after_close``): runs with
  a given grace period and reports ``gc-mid-collect`` after each deleted unit.

Both swaps are process-local, undone on exit and meant for the single-threaded worker process of
a campaign (never for a process that runs other work concurrently).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine

from airflow_finalckpt.coordination import (
    BatchOutcome,
    CheckpointWriter,
    Coordinator,
    CoordinatorOptions,
    FinishOutcome,
    StageView,
)
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    SinkTransaction,
    StageSnapshot,
    StateHandle,
    TriggerReason,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage import atomic as atomic_module
from faults.injector import FaultInjector, append_event

if TYPE_CHECKING:
    import pandas
    import pyspark.sql


# ------------------------------------------------------------------------------ coordinator


class FaultyCoordinator:
    """The real coordinator, wrapped: reports the coordinator-layer fault points around the
    calls it intercepts and hands every other attribute to the wrapped coordinator.

    A wrapper, not a subclass, so it follows the coordinator's public methods whatever class
    implements them; the coordinator never calls these methods on itself, so every call the
    runtime makes passes through here. It also pins the pipeline's options: ``register``
    without options (as the example runner calls it) keeps the ones given here instead of
    resetting them to the defaults.
    """

    def __init__(
        self,
        inner: Coordinator,
        *,
        injector: FaultInjector,
        options: CoordinatorOptions | None = None,
    ) -> None:
        self.inner = inner
        self.injector = injector
        self.options = options

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def register(self, graph: StageGraph, options: CoordinatorOptions | None = None) -> None:
        self.inner.register(graph, options or self.options)

    def _completed(self, checkpoint_id: int | None, stage_id: str | None) -> None:
        if checkpoint_id is not None and self.inner.checkpoint(checkpoint_id).is_completed:
            self.injector.hit("after-checkpoint-complete", stage_id)

    def start_attempt(
        self,
        stage_id: str,
        *,
        total_splits: int | None = None,
        split_list_sha256: str | None = None,
    ) -> StageView:
        self.injector.stage = stage_id
        view = self.inner.start_attempt(
            stage_id, total_splits=total_splits, split_list_sha256=split_list_sha256
        )
        self.injector.hit("after-start-attempt", stage_id)
        return view

    def record_batch(
        self,
        stage_id: str,
        epoch: int,
        *,
        finished_splits: Iterable[str] = (),
        state: Sequence[StateHandle] | None = None,
        transactions: Sequence[SinkTransaction] = (),
        watermark: int | None = None,
    ) -> BatchOutcome:
        self.injector.hit("before-ack", stage_id)
        outcome = self.inner.record_batch(
            stage_id,
            epoch,
            finished_splits=finished_splits,
            state=state,
            transactions=transactions,
            watermark=watermark,
        )
        if outcome.completed:
            self.injector.hit("after-checkpoint-complete", stage_id)
        return outcome

    def finish(self, stage_id: str, epoch: int, snapshot: StageSnapshot) -> FinishOutcome:
        outcome = self.inner.finish(stage_id, epoch, snapshot)
        self._completed(outcome.eager_checkpoint_id, stage_id)
        return outcome

    def trigger(
        self,
        reason: TriggerReason = TriggerReason.PERIODIC,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> int | None:
        checkpoint_id = self.inner.trigger(reason, kind)
        self._completed(checkpoint_id, None)
        return checkpoint_id

    def ensure_final_checkpoint(self, stage_id: str) -> int | None:
        checkpoint_id = self.inner.ensure_final_checkpoint(stage_id)
        self._completed(checkpoint_id, stage_id)
        return checkpoint_id

    def close(self, stage_id: str, epoch: int, checkpoint_id: int) -> list[SinkTransaction]:
        self.injector.hit("before-close", stage_id)
        aborted = self.inner.close(stage_id, epoch, checkpoint_id)
        self.injector.hit("after-close", stage_id)
        return aborted


def faulty_coordinator(
    engine: Engine,
    pipeline_key: str,
    *,
    injector: FaultInjector,
    writer: CheckpointWriter | None = None,
    options: CoordinatorOptions | None = None,
    clock: Callable[[], float] = time.time,
) -> Coordinator:
    """A real coordinator behind a :class:`FaultyCoordinator`, typed as the coordinator the
    runtime takes (the wrapper offers every attribute of it)."""
    inner = Coordinator(engine, pipeline_key, writer=writer, clock=clock)
    return cast(Coordinator, FaultyCoordinator(inner, injector=injector, options=options))


# ------------------------------------------------------------------------------ storage


class _OsWithRenameHook:
    """Stands in for the ``os`` module inside ``storage.atomic``: ``replace`` calls a hook."""

    def __init__(self, real: ModuleType, on_replace: Callable[[str], None]) -> None:
        self._real = real
        self._on_replace = on_replace

    def replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        self._on_replace(str(dst))
        self._real.replace(src, dst, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def rename_hook(on_replace: Callable[[str], None]) -> Iterator[None]:
    """Call ``on_replace(target)`` just before an atomic write renames its temporary file
    into place (local file systems): a fault there leaves only the temporary file."""
    real = atomic_module.__dict__["os"]
    atomic_module.__dict__["os"] = _OsWithRenameHook(real, on_replace)
    try:
        yield
    finally:
        atomic_module.__dict__["os"] = real


class FaultyStorage(CheckpointStorage):
    """Checkpoint storage reporting the storage-layer fault points (local roots)."""

    def __init__(
        self,
        root_uri: str,
        injector: FaultInjector,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(root_uri, storage_options)
        self.injector = injector

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        self.injector.hit("metadata-before-write")
        with rename_hook(lambda _dst: self.injector.hit("metadata-mid-write")):
            written = super().write_checkpoint(record, replace_orphan=replace_orphan)
        self.injector.hit("metadata-after-write")
        return written

    def discard_checkpoint(self, metadata_path: str) -> None:
        self.injector.hit("metadata-before-discard")
        location = self.locate(metadata_path)
        fs_path = str(self.fs._strip_protocol(location.metadata_path))
        if self.fs.exists(fs_path):  # what the real discard does first
            self.fs.rm_file(fs_path)
        self.injector.hit("metadata-mid-discard")
        super().discard_checkpoint(metadata_path)

    def write_state(
        self, pipeline_key: str, relpath: str, data: bytes, *, name: str | None = None
    ) -> StateHandle:
        with rename_hook(lambda _dst: self.injector.hit("state-mid-write")):
            return super().write_state(pipeline_key, relpath, data, name=name)


# ------------------------------------------------------------------------------ sinks


def sink_kind(sink: TwoPhaseCommitSink) -> str:
    """``parquet``, ``sql``, ``iceberg``, ``delta`` (or the class name) of a sink."""
    from airflow_finalckpt.sinks import (
        DeltaTableSink,
        IcebergTableSink,
        ParquetTableSink,
        SqlTableSink,
    )

    kinds = {
        ParquetTableSink: "parquet",
        SqlTableSink: "sql",
        IcebergTableSink: "iceberg",
        DeltaTableSink: "delta",
    }
    return kinds.get(type(sink), type(sink).__name__)


#: Steps inside a table-format sink's commit / abort (StagedTableSink.on_step) -> fault point.
_STEP_POINTS = {"table-committed": "sink-mid-commit", "abort-started": "sink-mid-abort"}


class FaultySink(TwoPhaseCommitSink):
    """Wraps a real sink: reports the sink-layer fault points (with the sink's kind, so a
    fault can target one sink) and records every commit call (``sink-commit`` events with the
    attempt's label) in the injector's event file.

    ``sink-mid-commit`` / ``sink-mid-abort`` are reached inside an Iceberg / Delta sink's commit
    and abort (its ``on_step`` hook); other sinks offer no such seam and report them right after
    the call returned."""

    def __init__(self, inner: TwoPhaseCommitSink, injector: FaultInjector) -> None:
        super().__init__(inner.sink_id)
        self.inner = inner
        self.injector = injector
        self.kind = sink_kind(inner)
        self._steps = hasattr(inner, "on_step")
        if self._steps:
            inner.on_step = self._step  # type: ignore[attr-defined]

    def _step(self, step: str) -> None:
        if step in _STEP_POINTS:
            self._hit(_STEP_POINTS[step])

    def _hit(self, name: str) -> None:
        self.injector.hit(name, sink=self.kind)

    def staging_location(self, txn_id: str) -> str:
        return self.inner.staging_location(txn_id)

    def write_pandas(self, txn_id: str, frame: pandas.DataFrame) -> None:
        self.inner.write_pandas(txn_id, frame)
        self._hit("sink-mid-write")

    def write_spark(self, txn_id: str, df: pyspark.sql.DataFrame) -> None:
        self.inner.write_spark(txn_id, df)
        self._hit("sink-mid-write")

    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        txn = self.inner.precommit(txn_id, checkpoint_id)
        self._hit("sink-after-precommit")
        return txn

    def commit(self, txn: SinkTransaction) -> bool:
        committed = self.inner.commit(txn)
        if not self._steps:
            self._hit("sink-mid-commit")
        if self.injector.events_path is not None:
            append_event(
                self.injector.events_path,
                {
                    "event": "sink-commit",
                    "label": self.injector.label,
                    "pid": os.getpid(),
                    "t": time.time(),
                    "sink": self.sink_id,
                    "txn": txn.txn_id,
                    "new": committed,
                },
            )
        return committed

    def abort(self, txn: SinkTransaction) -> None:
        self._hit("sink-before-abort")
        self.inner.abort(txn)
        if not self._steps:
            self._hit("sink-mid-abort")

    def is_committed(self, txn_id: str) -> bool:
        return self.inner.is_committed(txn_id)

    def committed_txn_ids(self) -> set[str]:
        return self.inner.committed_txn_ids()

    def staged_txn_ids(self) -> set[str]:
        return self.inner.staged_txn_ids()

    def __repr__(self) -> str:
        return f"FaultySink({self.inner!r})"


# ------------------------------------------------------------------------------ gc


@contextmanager
def gc_hook(injector: FaultInjector, grace_s: float | None) -> Iterator[bool]:
    """While active, garbage collection after a close uses ``grace_s`` (None: its default) and
    reports ``gc-mid-collect`` after every deleted unit. Yields False if the runtime has no
    garbage collector (then nothing is patched)."""
    try:
        from airflow_finalckpt.runtime import gc as gc_module
    except ImportError:
        yield False
        return
    real_collect = gc_module.__dict__.get("collect_garbage")
    files = gc_module.__dict__.get("_Files")
    real_remove = getattr(files, "remove", None)
    if real_collect is None or files is None or real_remove is None:
        yield False
        return

    def collect(*args: Any, **kwargs: Any) -> Any:
        if grace_s is not None:
            kwargs["grace_s"] = grace_s
        return real_collect(*args, **kwargs)

    def remove(self: Any, unit: Any) -> bool:
        removed = bool(real_remove(self, unit))
        if removed:
            injector.hit("gc-mid-collect")
        return removed

    gc_module.__dict__["collect_garbage"] = collect
    files.remove = remove
    try:
        yield True
    finally:
        gc_module.__dict__["collect_garbage"] = real_collect
        files.remove = real_remove
