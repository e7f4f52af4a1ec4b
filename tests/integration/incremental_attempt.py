"""One attempt of one scheduled run of an incremental pipeline, in a process of its own, as an
Airflow worker runs a task attempt: the acceptance campaign of issue 30
(``incremental_acceptance``) SIGKILLs it, and a new process retries.

No Spark (each attempt would start a JVM): the real runtime, coordinator, checkpoint storage,
cursor store and Parquet sink, with plain-Python stage logic. ``read`` is the source stage: its
splits are the run's claimed range of the source (``claim_splits``), each a Parquet file read
with pyarrow; ``publish`` stages the rows in the sink, committed at the final checkpoint; the
pipeline's last close advances the cursor. (The same pipeline on Spark:
``tests/spark/incremental_pipeline.py``.)

An attempt may kill itself (SIGKILL: nothing runs after it) at a planned ``stage:point`` hit,
and may ask its parent, the table's writer, to append at a planned point and wait until it has:
a snapshot, version or file committed while the run is under way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import fsspec
import pandas as pd
import pyarrow.parquet as pq

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.coordination import coordinator as coordinator_module
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import OUTPUT_PREFIX, StateHandle
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.runtime.runner import CommitMode, StageRunner, StageSpec
from airflow_finalckpt.runtime.values import Batch, BatchOutput
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sources import DeltaAppends, IcebergAppends, LandingDirectory
from airflow_finalckpt.sources.base import IncrementalSource
from airflow_finalckpt.sources.claims import claim_splits
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

KINDS = ("iceberg", "delta", "landing")
STAGES = ("read", "publish")
COLUMNS = ["id", "value"]
ICEBERG_TABLE = "acceptance.events"
#: The point inside the transaction that closes the pipeline's last stage, after the cursor's
#: advance was written and before the transaction commits (patched ``settle_ranges``).
IN_CLOSE = "publish:in-close"


@dataclass(frozen=True)
class AttemptJob:
    """One attempt: which source series, which run, where it kills itself and asks for an
    append (``stage:point``, the ``nth`` hit of the kill point), all plain data."""

    kind: str
    root: str
    run_key: str
    logical_date: str
    kill_at: str | None = None
    kill_nth: int = 1
    append_at: str | None = None


def store_url(root: str) -> str:
    return f"sqlite:///{root}/store.db"


def source_dir(root: str, kind: str) -> str:
    return f"{root}/input/{kind}"


def make_source(kind: str, root: str) -> IncrementalSource:
    where = source_dir(root, kind)
    if kind == "iceberg":
        return IcebergAppends(ICEBERG_TABLE, warehouse=where)
    if kind == "delta":
        return DeltaAppends(where)
    return LandingDirectory(f"file://{where}", pattern="*.parquet")


def make_sink(kind: str, root: str) -> ParquetTableSink:
    return ParquetTableSink(f"out-{kind}", f"{root}/out/{kind}")


class _Logic:
    """Output parts as JSON rows in checkpoint storage (the Spark stage's layout)."""

    def __init__(self, storage: CheckpointStorage, key: str, stage_id: str) -> None:
        self.storage, self.key, self.stage_id = storage, key, stage_id

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        """Nothing to restore: both stages are stateless."""

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput(state=())

    def rows_of(self, parts: Sequence[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for part in parts:
            path = self.storage.resolve_handle(self.key, f"{part}/rows.json")
            rows.extend(json.loads(bytes(self.storage.fs.cat_file(path))))
        return rows

    def output_handle(self, batch: Batch, parts: Sequence[str]) -> StateHandle:
        doc = {"stage_id": self.stage_id, "batch": batch.key, "parts": list(parts)}
        return self.storage.write_state(
            self.key,
            f"data/{self.stage_id}/_parts/{batch.key}.json",
            json.dumps(doc).encode(),
            name=OUTPUT_PREFIX + ",".join(parts),
        )


class ReadFiles(_Logic):
    """The source stage: each split is a Parquet file's URL; its rows become one part."""

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        rows: list[dict[str, Any]] = []
        for url in batch.splits:
            with fsspec.open(url, "rb") as handle:
                rows.extend(pq.read_table(handle, columns=COLUMNS).to_pylist())
        part = f"data/{self.stage_id}/{batch.key}"
        self.storage.write_state(self.key, f"{part}/rows.json", json.dumps(rows).encode())
        return BatchOutput(parts=(part,), state=())


class PublishRows(_Logic):
    """Stages the upstream parts' rows in the sink (committed at the final checkpoint)."""

    def __init__(
        self, storage: CheckpointStorage, key: str, stage_id: str, sink: TwoPhaseCommitSink
    ) -> None:
        super().__init__(storage, key, stage_id)
        self.sink = sink

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        rows = self.rows_of(batch.splits)
        if rows:
            frame = pd.DataFrame(rows, columns=COLUMNS)
            self.sink.write_pandas(txn_ids[self.sink.sink_id], frame)
        return BatchOutput()


def run_pipeline(job: AttemptJob, fault: Callable[[str, str], None]) -> list[str]:
    """Run (or continue) the run's pipeline to CLOSED; returns the splits it claimed."""
    engine = make_engine(store_url(job.root))
    storage = CheckpointStorage(f"{job.root}/checkpoints/{job.kind}")
    sink = make_sink(job.kind, job.root)
    coordinator = Coordinator(engine, job.run_key, writer=storage)
    close = coordinator.close

    def close_after_fault(stage_id: str, epoch: int, checkpoint_id: int) -> Any:
        fault(stage_id, "before-close")  # every covered transaction committed, not closed
        return close(stage_id, epoch, checkpoint_id)

    coordinator.close = close_after_fault  # type: ignore[method-assign]
    coordinator.register(StageGraph.from_edges(list(STAGES), [("read", "publish")]))
    run = RunContext.of(dag_id=job.kind, run_id=job.run_key, logical_date=job.logical_date)
    fault("read", "claim")
    source = make_source(job.kind, job.root)
    splits = claim_splits(engine, source, pipeline_key=job.run_key, stage_id="read", run=run)
    fault("read", "claimed")
    stage_splits: Sequence[str] = splits
    for stage_id in STAGES:
        logic: _Logic
        if stage_id == "read":
            logic = ReadFiles(storage, job.run_key, stage_id)
        else:
            logic = PublishRows(storage, job.run_key, stage_id, sink)
        runner = StageRunner(
            coordinator,
            StageSpec(
                pipeline_key=job.run_key,
                stage_id=stage_id,
                splits=tuple(stage_splits),
                batch_size=1,
                commit_mode=CommitMode.FINAL,
                checkpoint_interval_s=3600.0,
            ),
            logic,
            [sink] if stage_id == "publish" else [],
            output_handle=logic.output_handle if stage_id == "read" else None,
            fault=lambda point, stage_id=stage_id: fault(stage_id, point),
        )
        runner.run()
        deadline = time.monotonic() + 60
        eod = runner.try_close()
        while eod is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage {stage_id} did not reach its final checkpoint")
            coordinator.ensure_final_checkpoint(stage_id)
            time.sleep(0.02)
            eod = runner.try_close()
        fault(stage_id, "after-close")
        stage_splits = eod.manifest
    engine.dispose()
    return list(splits)


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def attempt_main(job: AttemptJob, conn: Connection, log_path: str) -> None:
    """The child process: run the attempt, tell the parent how it ended (or die on plan)."""
    with open(log_path, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    print(f"--- {job}", flush=True)
    hits: dict[str, int] = {}
    asked: set[str] = set()

    def fault(stage: str, point: str) -> None:
        where = f"{stage}:{point}"
        hits[where] = hits.get(where, 0) + 1
        if where == job.append_at and where not in asked:
            asked.add(where)
            conn.send(("append", where))  # the writer appends while this run is under way
            conn.recv()
        if where == job.kill_at and hits[where] == job.kill_nth:
            print(f"SIGKILL at {where} (hit {hits[where]})", flush=True)
            die()

    if job.kill_at == IN_CLOSE:
        settle = coordinator_module.settle_ranges

        def settle_then_die(*args: Any, **kwargs: Any) -> Any:
            advanced = settle(*args, **kwargs)
            if advanced:  # the advance is written; the close transaction is not committed
                fault("publish", "in-close")
            return advanced

        coordinator_module.settle_ranges = settle_then_die  # type: ignore[assignment]
    splits = run_pipeline(job, fault)
    conn.send(("done", len(splits)))
    conn.close()
