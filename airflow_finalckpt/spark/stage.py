"""The Spark side of a stage: runs a user transform per split batch, with explicit state.

Everything a batch produces goes to files before the runtime records the batch: the output part
(Parquet under ``<pipeline dir>/data/<stage>/<batch key>``, read by downstream stages), every sink
transaction's staging area, and state (Parquet under ``state/``), so a batch may run in a new
process after a crash and nothing lives only in memory.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    StageDefinitionError,
    StorageError,
)
from airflow_finalckpt.core.model import OUTPUT_PREFIX, StateHandle
from airflow_finalckpt.core.partitions import check_partition_keys
from airflow_finalckpt.core.plan_check import Input, PlanCheck, Verdict, check_plan, reads_batch
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.core.split_bytes import SplitBytes, declared_bytes
from airflow_finalckpt.pyspark_compat import local_copy
from airflow_finalckpt.runtime.runner import Batch, BatchOutput
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark import driver_actions
from airflow_finalckpt.spark.plans import InputTags, plan_tree
from airflow_finalckpt.spark.py4j_nodelay import disable_nagle
from airflow_finalckpt.spark.split_keys import (
    SPLIT_KEYS_HANDLE,
    batch_values,
    record_batch_values,
)
from airflow_finalckpt.storage import CheckpointStorage

T = TypeVar("T")
STATE_PREFIX = "state:"
GLOBAL_PREFIX = "global:"
#: ``attempt_memo`` keys of ``BatchContext.broadcast_table`` (apart from ``attempt_value``'s).
BROADCAST_PREFIX = "broadcast:"


class TransformError(FinalCheckpointError):
    """The stage's transform raised; nothing of the batch was recorded or committed."""


def spark_path(path: str) -> str:
    """A path Spark's Hadoop file systems understand, from a checkpoint storage path."""
    if "://" not in path:
        return "file://" + os.path.abspath(path)
    if path.startswith("s3://"):
        return "s3a://" + path[len("s3://") :]
    return path


@dataclass
class BatchContext:
    """What a transform sees for one batch (or for finish(), with ``finishing`` set)."""

    spark: SparkSession
    stage_id: str
    splits: tuple[str, ...]
    watermark: int | None
    finishing: bool = False
    drain: bool = False
    #: This batch takes the stage's last unfinished splits: the input ends with it (a
    #: windowed transform may fire everything now instead of in ``finish``).
    last_batch: bool = False
    logic: SparkStageLogic | None = field(default=None, repr=False)
    #: The Airflow run this stage works for (see the properties below).
    run: RunContext = field(default_factory=RunContext)

    @property
    def logical_date(self) -> datetime | None:
        """The DAG run's logical date (None for a manual run without one)."""
        return self.run.logical_date

    @property
    def data_interval_start(self) -> datetime | None:
        """Start of the DAG run's data interval (inclusive): the day a daily run is for."""
        return self.run.data_interval_start

    @property
    def data_interval_end(self) -> datetime | None:
        """End of the DAG run's data interval (exclusive)."""
        return self.run.data_interval_end

    @property
    def ds(self) -> str | None:
        """The logical date as ``YYYY-MM-DD`` (Airflow's ``{{ ds }}``)."""
        return self.run.ds

    @property
    def partition_key(self) -> str | None:
        """A partitioned DAG run's partition key (None for a run without one)."""
        return self.run.partition_key

    @property
    def partition_date(self) -> datetime | None:
        """The partition's date, where Airflow gives one (a ``CronPartitionTimetable`` run)."""
        return self.run.partition_date

    def add_partitions(self, keys: str | Sequence[str]) -> None:
        """Name the partitions this batch's rows belong to (``PartitionedAtRuntime``: e.g.
        the days the batch's files cover). The keys ride on the batch's sink transactions; the
        stage's commit announces each committed one with one partitioned Asset event.
        """
        assert self.logic is not None
        self.logic.add_partitions(keys)

    @property
    def params(self) -> Mapping[str, Any]:
        """The DAG run's params (JSON values)."""
        return self.run.params

    @property
    def conf(self) -> Mapping[str, Any]:
        """The DAG run's conf (JSON values)."""
        return self.run.conf

    @property
    def run_id(self) -> str | None:
        """The DAG run's id."""
        return self.run.run_id

    def read_parts(self, parts: Sequence[str] | None = None) -> DataFrame:
        """Read upstream output parts (default: this batch's splits, when they are parts)."""
        assert self.logic is not None
        return self.logic.tagged(
            self.logic.read_parts(list(parts if parts is not None else self.splits)), Input.BATCH
        )

    def upstream(self, stage_id: str) -> DataFrame:
        """The whole output of an upstream stage, from its end_of_data manifest."""
        assert self.logic is not None
        manifest = self.logic.upstream_manifests.get(stage_id)
        if manifest is None:
            raise FinalCheckpointError(
                f"stage {self.stage_id!r} has no upstream stage {stage_id!r} with a manifest"
            )
        return self.logic.tagged(self.logic.read_parts(manifest), Input.CONSTANT)

    def get_state(self, name: str) -> DataFrame | None:
        """The stage's state frame ``name`` as the last recorded batch left it; None if unset."""
        assert self.logic is not None
        self.logic.keyed_state_used = True
        return self.logic.tagged(self.logic.read_state(STATE_PREFIX + name), Input.STATE)

    def set_state(self, name: str, frame: DataFrame) -> None:
        """Keep ``frame`` as state ``name``; written with this batch's record."""
        assert self.logic is not None
        self.logic.keyed_state_used = True
        self.logic.pending_state[STATE_PREFIX + name] = frame

    def drop_state(self, name: str) -> None:
        """Forget a state: this batch's record carries no handle for it (nothing is written)."""
        assert self.logic is not None
        self.logic.pending_state.pop(STATE_PREFIX + name, None)
        self.logic.handles.pop(STATE_PREFIX + name, None)

    def global_state(self, name: str, factory: Callable[[], DataFrame]) -> DataFrame:
        """Stage-global state (e.g. a broadcast dimension table): computed once, kept in every
        checkpoint, restored on resume, so it survives partial finishing.
        """
        assert self.logic is not None
        key = GLOBAL_PREFIX + name
        existing = self.logic.read_state(key)
        if existing is not None:
            return self.logic.tagged(existing, Input.CONSTANT)
        with driver_actions.unwatched():
            self.logic.pending_state[key] = factory()
            self.logic.persist_state()
        restored = self.logic.read_state(key)
        assert restored is not None
        return self.logic.tagged(restored, Input.CONSTANT)

    def attempt_value(self, name: str, factory: Callable[[], T]) -> T:
        """A value built once per stage attempt and reused by its batches, never checkpointed:
        for what can be rebuilt from immutable inputs (e.g. broadcast dimension tables read
        from files). Unlike ``global_state`` it costs no state files.
        """
        assert self.logic is not None
        memo = self.logic.attempt_memo
        if name not in memo:
            with driver_actions.unwatched():
                memo[name] = factory()
        return self.logic.tagged(cast(T, memo[name]), Input.CONSTANT)

    def broadcast_table(self, name: str, factory: Callable[[], DataFrame]) -> DataFrame:
        """A small table (e.g. a dimension for broadcast joins) reused by the batches of a stage
        attempt: the first call returns ``factory()``; from the second on, a copy held on the
        driver, made once (a broadcast collects the table to the driver anyway; a driver-local
        table is broadcast without reading its files again). A stage that runs one batch pays
        nothing for it. Only for tables that fit the driver's memory.
        """
        assert self.logic is not None
        memo = self.logic.attempt_memo
        key = BROADCAST_PREFIX + name
        held = memo.get(key)
        if held is None:
            with driver_actions.unwatched():
                built = factory()
            memo[key] = (False, built)
            return self.logic.tagged(built, Input.CONSTANT)
        local, frame = cast(tuple[bool, DataFrame], held)
        if not local:
            with driver_actions.unwatched():
                frame = local_copy(self.spark, frame)
            memo[key] = (True, frame)
        return self.logic.tagged(frame, Input.CONSTANT)

    def set_watermark(self, watermark: int) -> None:
        """Advance the stage's watermark (event time in ms); it never goes back."""
        self.watermark = watermark if self.watermark is None else max(self.watermark, watermark)


Transform = Callable[[BatchContext], DataFrame | None]


def is_spark_session(obj: object) -> bool:
    """A classic SparkSession or a Spark Connect one (which is not a subclass of it)."""
    if isinstance(obj, SparkSession):
        return True
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except Exception:  # the Connect client's dependencies (grpc) are optional
        return False
    return isinstance(obj, ConnectSession)


class SparkStageLogic:
    """Implements the runtime's StageLogic with a user transform on a SparkSession."""

    def __init__(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        storage: CheckpointStorage,
        pipeline_key: str,
        stage_id: str,
        transform: Transform,
        *,
        on_finish: Transform | None = None,
        sinks: Sequence[TwoPhaseCommitSink] = (),
        upstream_manifests: Mapping[str, list[str]] | None = None,
        split_keys: Sequence[str] = (),
        run: RunContext | None = None,
        split_bytes: SplitBytes | None = None,
    ) -> None:
        self._spark = spark
        self.run = run or RunContext()
        self.storage = storage
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id
        self.transform = transform
        self.on_finish = on_finish
        self.sinks = list(sinks)
        self.upstream_manifests = dict(upstream_manifests or {})
        #: A source's declared input bytes per split (``core.split_bytes``).
        self.split_bytes = split_bytes
        self.handles: dict[str, StateHandle] = {}
        self.pending_state: dict[str, DataFrame] = {}
        self.watermark: int | None = None
        #: Per stage attempt, never persisted: stage-global state frames already read back
        #: (by handle path: global state is written once and never changes), and whatever a
        #: transform wants to remember between the batches of this attempt (``attempt_memo``).
        self._global_frames: dict[str, DataFrame] = {}
        self.attempt_memo: dict[str, Any] = {}
        #: Per upstream stage, the schema of its output parts (one transform writes them all):
        #: inferred from the first read of the attempt, then given to Spark, which otherwise
        #: runs a Spark job to read Parquet footers on every read (one per batch).
        self._part_schemas: dict[str, StructType] = {}
        #: Whether a downstream stage reads this stage's output parts (the runner says so with
        #: each batch); a stage with sinks that nobody reads writes to its sinks only.
        self.output_read = True
        #: The plan check (``core.plan_check``): the columns the splits partition the data by,
        #: the frames the context handed out, whether the transform used keyed state, the
        #: verdict on the current batch and what the check cost (ms per batch).
        self.split_keys = tuple(split_keys)
        self.tags = InputTags()
        self.keyed_state_used = False
        #: The DataFrame actions the transform ran over this batch's input while called
        #: (``driver_actions``): a per-batch result the returned frame's plan cannot show.
        self.driver_actions: list[str] = []
        self.plan_check: PlanCheck | None = None
        self.check_ms: list[float] = []
        self._prepared: tuple[Batch, BatchContext, DataFrame | None] | None = None
        self._nodelay_tried = False
        #: The partition keys the current batch's transform reported (``add_partitions``).
        self.batch_partitions: set[str] = set()

    @property
    def spark(self) -> SparkSession:
        """Created on first use: a stage that is skipped on restore never starts Spark. The
        first use also turns Nagle's algorithm off on this thread's py4j connection
        (``py4j_nodelay``: 40 ms per large py4j reply otherwise).
        """
        if not is_spark_session(self._spark):
            factory: Callable[[], SparkSession] = self._spark  # type: ignore[assignment]
            self._spark = factory()
        if not self._nodelay_tried:
            self._nodelay_tried = True
            disable_nagle(self._spark)
        return self._spark  # type: ignore[return-value]

    @property
    def spark_started(self) -> bool:
        """Whether a Spark session exists yet (created on first use)."""
        return is_spark_session(self._spark)

    # -- StageLogic ------------------------------------------------------------------------

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        """Take the state handles and watermark the last recorded batch left."""
        self.handles = {h.name: h for h in state}
        self.watermark = watermark

    def tagged(self, frame: T, kind: Input) -> T:
        """``frame`` (or the frames in it), remembered as reading ``kind`` for the plan check."""
        self.tags.tag(frame, kind)
        return frame

    def check_plan(self, batch: Batch) -> PlanCheck | None:
        """Call the transform for ``batch`` (it builds a DataFrame; the Spark actions it runs
        on the batch are noted) and classify the plan of the frame it returns; ``process`` of
        the same batch reuses the frame. None: the transform returned no frame.
        """
        ctx = self._context(batch)
        frame = self._call(ctx, self.transform, batch.key)
        self._prepared = (batch, ctx, frame)
        self.plan_check = None
        if frame is None:
            return None
        started = time.perf_counter()
        self.plan_check = check_plan(
            plan_tree(frame, self.tags),
            self.split_keys,
            uses_keyed_state=self.keyed_state_used,
            driver_actions=self.driver_actions,
        )
        self.check_ms.append((time.perf_counter() - started) * 1000.0)
        return self.plan_check

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        """Run the transform on one batch; its frame goes to the output parts and the sinks."""
        self.output_read = batch.output_read
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] == batch:
            _, ctx, frame = prepared
        else:
            ctx = self._context(batch)
            frame = self._call(ctx, self.transform, batch.key)
        return self._write(ctx, frame, batch.key, txn_ids)

    def _context(self, batch: Batch) -> BatchContext:
        return BatchContext(
            self.spark,
            self.stage_id,
            batch.splits,
            self.watermark,
            last_batch=batch.last,
            logic=self,
            run=self.run,
        )

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        """End of input (or a drain): run the finish hook, if any; else keep the state as it is."""
        ctx = BatchContext(
            self.spark,
            self.stage_id,
            (),
            self.watermark,
            finishing=True,
            drain=drain,
            logic=self,
            run=self.run,
        )
        if self.on_finish is None:
            return BatchOutput(state=tuple(self.handles.values()), watermark=self.watermark)
        return self._run(ctx, self.on_finish, "finish", txn_ids)

    def _run(
        self, ctx: BatchContext, fn: Transform, key: str, txn_ids: Mapping[str, str]
    ) -> BatchOutput:
        self.plan_check = None  # finish() runs once: nothing to check
        return self._write(ctx, self._call(ctx, fn, key), key, txn_ids)

    def _call(self, ctx: BatchContext, fn: Transform, key: str) -> DataFrame | None:
        """Call a transform with fresh pending state and input tags of this batch."""
        self.pending_state = {}
        self.batch_partitions = set()
        self.tags.end_batch()
        self.keyed_state_used = False
        self.driver_actions = []
        driver_actions.install(self.spark)
        try:
            with driver_actions.watching(self._saw_action):
                return fn(ctx)
        except FinalCheckpointError:
            raise
        except Exception as exc:
            raise TransformError(
                f"stage {self.stage_id!r}: transform failed on batch {key} "
                f"({len(ctx.splits)} splits): {type(exc).__name__}: {exc}"
            ) from exc

    def _saw_action(self, frame: Any, name: str) -> None:
        """A DataFrame action the transform runs: kept when its frame reads this batch's input
        (a frame whose plan cannot be read counts as one: the conservative side). Not looked
        at once the transform used keyed state (trusted: docs/aggregation.md).
        """
        if self.keyed_state_used or name in self.driver_actions:
            return
        try:
            on_batch = reads_batch(plan_tree(frame, self.tags))
        except Exception:
            on_batch = True
        if on_batch:
            self.driver_actions.append(name)

    def _write(
        self, ctx: BatchContext, frame: DataFrame | None, key: str, txn_ids: Mapping[str, str]
    ) -> BatchOutput:
        """The batch's frame to its output part and sinks, its state to files."""
        keyed = self.plan_check is not None and self.plan_check.verdict is Verdict.SPLIT_KEYED
        parts: tuple[str, ...] = ()
        if frame is not None and self.sinks and not self.output_read and not keyed:
            # No stage reads this output: the sinks' staged data is all there is to keep.
            self._write_sinks(frame, txn_ids)
        elif frame is not None:
            part = f"data/{self.stage_id}/{key}"
            location = spark_path(self._resolve(part))
            frame.write.mode("overwrite").parquet(location)
            if keyed or self.sinks:
                # The split keys and the sinks read the part just written instead of computing
                # the frame again (or caching it for every batch of a stage without sinks);
                # without them nothing reads it back here (a file listing saved).
                written = self.spark.read.schema(frame.schema).parquet(location)
                if keyed:
                    values = batch_values(written, self.split_keys, self.stage_id)
                    self.handles[SPLIT_KEYS_HANDLE] = record_batch_values(
                        self.storage, self.pipeline_key, self.stage_id, self.handles, key, values
                    )
                if self.sinks:
                    self._write_sinks(written, txn_ids)
            parts = (part,)
        self.persist_state()
        self.watermark = ctx.watermark
        return BatchOutput(
            parts=parts,
            state=tuple(self.handles.values()),
            watermark=ctx.watermark,
            partition_keys=tuple(sorted(self.batch_partitions)),
        )

    def add_partitions(self, keys: str | Sequence[str]) -> None:
        """Record partition keys for the current batch; they need a sink to ride on."""
        checked = check_partition_keys(self.stage_id, keys)
        if not self.sinks:
            raise StageDefinitionError(
                f"stage {self.stage_id!r}: add_partitions needs a sink (the keys are "
                "committed with the sink's transactions); this stage has none"
            )
        self.batch_partitions.update(checked)

    def _write_sinks(self, frame: DataFrame, txn_ids: Mapping[str, str]) -> None:
        """Stage ``frame`` in every sink; with several sinks it is computed once and cached."""
        cached = len(self.sinks) > 1
        if cached:
            frame = frame.persist()
        try:
            for sink in self.sinks:
                sink.write_spark(txn_ids[sink.sink_id], frame)
        finally:
            if cached:
                frame.unpersist()

    # -- output handles (the runtime records them with the batch) --------------------------

    def output_handle(self, batch: Batch, parts: Sequence[str]) -> StateHandle:
        """Record a batch's output parts in a small JSON file; its handle names the parts."""
        doc = {"stage_id": self.stage_id, "batch": batch.key, "parts": list(parts)}
        return self.storage.write_state(
            self.pipeline_key,
            f"data/{self.stage_id}/_parts/{batch.key}.json",
            json.dumps(doc, sort_keys=True).encode(),
            name=OUTPUT_PREFIX + ",".join(parts),
        )

    # -- state -----------------------------------------------------------------------------

    def _resolve(self, relpath: str) -> str:
        return self.storage.resolve_handle(self.pipeline_key, relpath)

    def persist_state(self) -> None:
        """Write every state frame set during this batch; replace its handle."""
        for name, frame in self.pending_state.items():
            rel_dir = f"state/{self.stage_id}/{name.replace(':', '_')}/{uuid.uuid4().hex}"
            frame.write.mode("overwrite").parquet(spark_path(self._resolve(rel_dir)))
            doc = {"path": rel_dir, "columns": frame.columns}
            self.handles[name] = self.storage.write_state(
                self.pipeline_key,
                f"{rel_dir}.json",
                json.dumps(doc, sort_keys=True).encode(),
                name=name,
            )
        self.pending_state = {}

    def read_state(self, name: str) -> DataFrame | None:
        """The frame of state ``name`` read back from its Parquet files; None if unset."""
        handle = self.handles.get(name)
        if handle is None:
            return None
        if name.startswith(GLOBAL_PREFIX) and handle.path in self._global_frames:
            # Stage-global state is immutable once written: read it back once per attempt.
            return self._global_frames[handle.path]
        doc: dict[str, Any] = json.loads(self.storage.read_state(self.pipeline_key, handle))
        path = self._resolve(str(doc["path"]))
        try:
            frame = self.spark.read.parquet(spark_path(path))
        except Exception as exc:
            raise StorageError(
                f"stage {self.stage_id!r}: state {name!r} at {path} cannot be read: {exc}"
            ) from exc
        if name.startswith(GLOBAL_PREFIX):
            self._global_frames[handle.path] = frame
        return frame

    def split_weights(self, splits: Sequence[str]) -> list[int | None]:
        """Bytes of each split (None: unknown): an upstream output part's from its files (one
        recursive listing per upstream stage), another split's from the stage's declared
        ``split_bytes``. Auto batches are sized by input bytes when all are known.
        """
        sizes: list[int | None] = [None] * len(splits)
        by_dir: dict[str, list[int]] = {}
        declared: list[int] = []
        for index, split in enumerate(splits):
            stage_dir, _, key = split.rpartition("/")
            if split.startswith("data/") and stage_dir.count("/") == 1 and key:
                by_dir.setdefault(stage_dir, []).append(index)
            else:
                declared.append(index)
        if declared and self.split_bytes is not None:
            found = declared_bytes(self.stage_id, self.split_bytes, [splits[i] for i in declared])
            for index, size in zip(declared, found, strict=True):
                sizes[index] = size
        for stage_dir, indexes in by_dir.items():
            self._part_sizes(splits, stage_dir, indexes, sizes)
        return sizes

    def _part_sizes(
        self, splits: Sequence[str], stage_dir: str, indexes: list[int], sizes: list[int | None]
    ) -> None:
        """Fill ``sizes`` at ``indexes`` with the bytes of those upstream parts of one stage."""
        try:
            files = self.storage.fs.find(self._resolve(stage_dir), detail=True)
        except (OSError, ValueError):
            return
        totals: dict[str, int] = {}
        for path, info in files.items():
            part = str(path).rstrip("/").split(f"/{stage_dir}/", 1)[-1].split("/", 1)[0]
            totals[part] = totals.get(part, 0) + int(info.get("size") or 0)
        for index in indexes:
            key = splits[index].rpartition("/")[2]
            if key in totals:
                sizes[index] = totals[key]

    def read_parts(self, parts: Sequence[str]) -> DataFrame:
        """Upstream output parts as one frame; a stage's part schema is read once per attempt."""
        if not parts:
            raise FinalCheckpointError(f"stage {self.stage_id!r}: no input parts to read")
        paths = [spark_path(self._resolve(p)) for p in parts]
        stage_dirs = {p.rpartition("/")[0] for p in parts}
        stage_dir = stage_dirs.pop() if len(stage_dirs) == 1 else None
        known = self._part_schemas.get(stage_dir) if stage_dir else None
        try:
            if known is not None:
                return self.spark.read.schema(known).parquet(*paths)
            frame = self.spark.read.parquet(*paths)
            if stage_dir and stage_dir.startswith("data/"):
                self._part_schemas[stage_dir] = frame.schema
            return frame
        except Exception as exc:
            raise StorageError(
                f"stage {self.stage_id!r}: input parts cannot be read ({parts[0]} ...): {exc}"
            ) from exc
