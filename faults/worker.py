"""The process that runs pipeline attempts of a campaign, and the parent's handle on it.

Each attempt runs in a worker process (multiprocessing, spawn): a CRASH fault SIGKILLs it, as
an Airflow worker or a Spark driver dies, and the next attempt runs in a fresh process. A worker
that survives an attempt (no fault, or a fault that raised) takes the next one, so a Spark
worker keeps its JVM and a fake worker its imports; nothing else is kept between attempts:
every attempt builds its own engine, coordinator, storage and sinks from the ``RunSetup``.

Workers put themselves in their own process group, so the parent can remove whatever a dead
worker started (the Spark JVM) by that group id.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.core.errors import StaleEpochError

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from pyspark.sql import SparkSession

    from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
    from faults.fake import FakePipeline
    from faults.injector import FaultInjector

FAKE = "fake"
SPARK = "spark"
#: Runs of a branching graph whose stages run at the same time (see concurrent.py).
CONCURRENT = "concurrent"
#: Sink kinds a campaign run can publish to, and the default (what campaigns always used).
SINK_KINDS = ("parquet", "sql", "iceberg", "delta")
TABLE_SINKS = ("iceberg", "delta")
DEFAULT_SINKS = ("parquet", "sql")
#: Small, single-core Spark settings: the example's data is tiny and start-up dominates.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


@dataclass(frozen=True)
class RunSetup:
    """Where one run lives and how its pipeline is configured (plain data: crosses processes)."""

    kind: str
    run_id: str
    store_url: str
    pipeline_key: str
    storage_root: str
    parquet_dir: str
    sql_url: str
    sql_table: str
    #: One id per sink kind in ``sinks``, in the same order.
    sink_ids: tuple[str, ...]
    batch_sizes: dict[str, int | str]
    commit_mode: str
    checkpoint_interval_s: float
    retain_checkpoints: int
    checkpoint_timeout_s: float
    events_path: str
    log_path: str
    gc_grace_s: float | None = 0.0
    fake: dict[str, int] | None = None
    input_dir: str | None = None
    close_timeout_s: float = 60.0
    #: The sinks of the pipeline's last stage, by kind (see SINK_KINDS).
    sinks: tuple[str, ...] = DEFAULT_SINKS
    #: Iceberg: the warehouse of the SQLite catalog (``catalog.db`` in it); Delta: the table.
    iceberg_warehouse: str | None = None
    delta_dir: str | None = None
    #: Concurrent runs: a running attempt's lease (``[finalckpt] attempt_lease_s``).
    attempt_lease_s: float = 60.0

    def table_roots(self) -> list[str]:
        """Directories the table-format sinks write in (checked for temporary files)."""
        return [d for d in (self.iceberg_warehouse, self.delta_dir) if d is not None]


@dataclass(frozen=True)
class AttemptJob:
    setup: RunSetup
    attempt: int
    faults: tuple[dict[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.setup.run_id}.a{self.attempt}"


@dataclass
class AttemptOutcome:
    """How an attempt ended: completed, suspended, failed (raised), stale (fenced), crashed
    (died by itself), killed (by the parent: external fault), hung (timed out)."""

    label: str
    status: str
    error_type: str | None = None
    error: str | None = None
    hits: dict[str, int] | None = None
    #: Hits of sink-layer points per sink kind (``"<point>@<kind>"``).
    sink_hits: dict[str, int] | None = None
    seconds: float = 0.0
    exitcode: int | None = None
    fired: list[dict[str, Any]] = field(default_factory=list)


# ------------------------------------------------------------------------------ in the worker


def make_sinks(setup: RunSetup) -> list[TwoPhaseCommitSink]:
    from airflow_finalckpt.sinks import (
        DeltaTableSink,
        IcebergTableSink,
        ParquetTableSink,
        SqlTableSink,
    )

    sinks: list[TwoPhaseCommitSink] = []
    for kind, sink_id in zip(setup.sinks, setup.sink_ids, strict=True):
        if kind == "parquet":
            sinks.append(ParquetTableSink(sink_id, setup.parquet_dir))
        elif kind == "sql":
            sinks.append(SqlTableSink(sink_id, setup.sql_url, setup.sql_table))
        elif kind == "iceberg":
            assert setup.iceberg_warehouse is not None
            table = f"faults.{setup.sql_table}"
            sinks.append(IcebergTableSink(sink_id, table, warehouse=setup.iceberg_warehouse))
        elif kind == "delta":
            assert setup.delta_dir is not None
            app_id = f"{setup.pipeline_key}-{sink_id}"
            sinks.append(DeltaTableSink(sink_id, setup.delta_dir, app_id=app_id))
        else:
            raise ValueError(f"unknown sink kind {kind!r}; known: {', '.join(SINK_KINDS)}")
    return sinks


def dispose_sinks(sinks: list[TwoPhaseCommitSink]) -> None:
    for sink in sinks:
        dispose = getattr(sink, "dispose", None)
        if callable(dispose):
            dispose()


def build_spark() -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("finalckpt-faults")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _successor(
    setup: RunSetup, pipeline: FakePipeline, label: str, stage_log: logging.Logger
) -> Callable[[str], None]:
    """A ZOMBIE fault's newer attempt: runs the stage to CLOSED with fresh objects, in this
    process, while the stalled attempt waits in its fault point."""

    def run_newer_attempt(stage_id: str) -> None:
        from airflow_finalckpt.coordination import Coordinator
        from airflow_finalckpt.storage import CheckpointStorage
        from airflow_finalckpt.store.engine import make_engine
        from faults.fake import FakePipeline
        from faults.injector import FaultInjector, append_event
        from faults.proxies import FaultySink

        recorder = FaultInjector(events_path=setup.events_path, label=f"{label}.successor")
        engine = make_engine(setup.store_url)
        real_sinks = make_sinks(setup)
        try:
            storage = CheckpointStorage(setup.storage_root)
            successor = FakePipeline(
                Coordinator(engine, setup.pipeline_key, writer=storage),
                storage,
                [FaultySink(s, recorder) for s in real_sinks],
                data=pipeline.data,
                batch_sizes=pipeline.batch_sizes,
                commit_mode=pipeline.commit_mode,
                checkpoint_interval_s=pipeline.checkpoint_interval_s,
                log=stage_log,
                close_timeout_s=pipeline.close_timeout_s,
            )
            event = {"label": label, "stage": stage_id, "pid": os.getpid()}
            append_event(setup.events_path, {"event": "successor-start", "t": time.time(), **event})
            stage_log.info(
                "zombie: attempt %s stalls in stage %s while a newer attempt runs it",
                label,
                stage_id,
            )
            successor.run_stage(stage_id, pipeline.splits_of[stage_id])
            append_event(setup.events_path, {"event": "successor-end", "t": time.time(), **event})
        finally:
            dispose_sinks(real_sinks)
            engine.dispose()

    return run_newer_attempt


def _run_pipeline(
    setup: RunSetup,
    injector: FaultInjector,
    label: str,
    stage_log: logging.Logger,
    spark: Callable[[], SparkSession] | None,
    zombie: Callable[[str], None] | None,
) -> bool:
    """Run the pipeline with fault-injecting objects; True if it completed, False if suspended."""
    from airflow_finalckpt.coordination import CoordinatorOptions
    from airflow_finalckpt.runtime.runner import CommitMode
    from airflow_finalckpt.store.engine import make_engine
    from faults.fake import FakeData, FakePipeline
    from faults.proxies import FaultySink, FaultyStorage, faulty_coordinator, gc_hook

    engine = make_engine(setup.store_url)
    real_sinks = make_sinks(setup)
    try:
        storage = FaultyStorage(setup.storage_root, injector)
        coordinator = faulty_coordinator(
            engine,
            setup.pipeline_key,
            injector=injector,
            writer=storage,
            options=CoordinatorOptions(
                retain_checkpoints=setup.retain_checkpoints,
                checkpoint_timeout_s=setup.checkpoint_timeout_s,
            ),
        )
        sinks: list[TwoPhaseCommitSink] = [FaultySink(s, injector) for s in real_sinks]
        with gc_hook(injector, setup.gc_grace_s):
            if setup.kind == FAKE:
                pipeline = FakePipeline(
                    coordinator,
                    storage,
                    sinks,
                    data=FakeData(**(setup.fake or {})),
                    batch_sizes=setup.batch_sizes,
                    commit_mode=CommitMode(setup.commit_mode),
                    checkpoint_interval_s=setup.checkpoint_interval_s,
                    fault=injector.example_fault,
                    log=stage_log,
                    close_timeout_s=setup.close_timeout_s,
                )
                injector.zombie = zombie or _successor(setup, pipeline, label, stage_log)
                return not pipeline.run().suspended
            from airflow_finalckpt.examples.nycflights13.local import run_example_locally
            from airflow_finalckpt.runtime.runner import RunStatus

            assert spark is not None and setup.input_dir is not None
            run = run_example_locally(
                spark(),
                setup.input_dir,
                coordinator,
                storage,
                sinks,
                batch_sizes=setup.batch_sizes,
                commit_mode=CommitMode(setup.commit_mode),
                checkpoint_interval_s=setup.checkpoint_interval_s,
                fault=injector.example_fault,
                close_timeout_s=setup.close_timeout_s,
            )
            return all(r.status is not RunStatus.SUSPENDED for r in run.results.values())
    finally:
        dispose_sinks(real_sinks)
        engine.dispose()


def execute_attempt(
    job: AttemptJob,
    spark: Callable[[], SparkSession] | None = None,
    *,
    zombie: Callable[[str], None] | None = None,
) -> AttemptOutcome:
    """Run one attempt of a run's pipeline in this process (a CRASH fault kills it).

    ``zombie`` replaces what a ZOMBIE fault does (default: run a newer attempt of the stage
    in this process), e.g. to stall while another process runs the newer attempt.
    """
    from faults.injector import FaultInjector, append_event, specs_from

    setup = job.setup
    label = job.label
    injector = FaultInjector(specs_from(job.faults), events_path=setup.events_path, label=label)
    handler = logging.FileHandler(setup.log_path, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {label} %(name)s %(levelname)s %(message)s")
    )
    package_log = logging.getLogger("airflow_finalckpt")
    level = package_log.level
    package_log.addHandler(handler)
    package_log.setLevel(logging.INFO)
    stage_log = logging.getLogger("airflow_finalckpt.faults.stage")
    start = time.monotonic()
    outcome = AttemptOutcome(label=label, status="completed")
    append_event(setup.events_path, {"event": "attempt", "label": label, "pid": os.getpid()})
    try:
        if not _run_pipeline(setup, injector, label, stage_log, spark, zombie):
            outcome.status = "suspended"
    except StaleEpochError as exc:
        # What a fenced Airflow task does: stop, leave the stage to the newer attempt.
        stage_log.warning(
            "stage %s: attempt epoch %d stops itself, epoch %d owns the stage now: %s",
            exc.stage_id,
            exc.epoch,
            exc.current,
            exc,
        )
        outcome.status, outcome.error_type, outcome.error = "stale", type(exc).__name__, str(exc)
    except Exception as exc:
        stage_log.warning("attempt %s failed: %s: %s", label, type(exc).__name__, exc)
        outcome.status, outcome.error_type, outcome.error = "failed", type(exc).__name__, str(exc)
    finally:
        package_log.removeHandler(handler)
        package_log.setLevel(level)
        handler.close()
    outcome.seconds = time.monotonic() - start
    outcome.hits = dict(injector.hits)
    outcome.sink_hits = dict(injector.sink_hits)
    outcome.fired = list(injector.fired)
    return outcome


def stalled_attempt_main(job: AttemptJob, stalled: Any, resume: Any, conn: Connection) -> None:
    """Entry point of a process running an attempt whose ZOMBIE fault stalls it: at the fault
    point it sets ``stalled`` and waits for ``resume`` (Events), so that another process can run
    a newer attempt of the stage meanwhile; then it goes on and sends its outcome."""

    def stall(_stage_id: str) -> None:
        stalled.set()
        if not resume.wait(600):
            raise TimeoutError("the stalled attempt was never resumed")

    conn.send(execute_attempt(job, zombie=stall))


def worker_main(conn: Connection, kind: str, output_path: str) -> None:
    """Entry point of a worker process: run attempts until told to stop (``None``)."""
    with contextlib.suppress(OSError):
        os.setpgrp()  # own group: the parent can remove what a dead worker started
    with open(output_path, "ab") as out:
        os.dup2(out.fileno(), 1)  # keep Spark's and py4j's chatter out of the campaign's output
        os.dup2(out.fileno(), 2)
    session: list[SparkSession] = []

    def spark() -> SparkSession:
        if not session:
            session.append(build_spark())
        return session[0]

    if kind == SPARK:
        spark()
    else:
        import pandas  # noqa: F401  (warm up what every attempt needs)

        from faults import fake, proxies  # noqa: F401
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            break
        if job is None:
            break
        conn.send(execute_attempt(job, spark if kind == SPARK else None))
    if session:
        session[0].stop()


# ------------------------------------------------------------------------------ in the parent


class InProcessWorker:
    """Runs attempts in this process (tests; faults that do not crash)."""

    def run(
        self, job: AttemptJob, timeout_s: float, kill_after_s: float | None = None
    ) -> AttemptOutcome:
        if kill_after_s is not None:
            raise ValueError("an in-process worker cannot be killed from outside")
        return execute_attempt(job)


@dataclass
class _Process:
    process: SpawnProcess
    conn: Connection


def _kill(worker: _Process) -> None:
    pid = worker.process.pid
    if pid is not None and pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class WorkerHandle:
    """The parent's side of one worker lane: runs jobs, notices deaths, replaces the worker.

    With ``spare`` a second worker is kept started and warm, so a crash costs no start-up time.
    """

    def __init__(self, kind: str, output_path: str, *, spare: bool = False) -> None:
        self.kind = kind
        self.output_path = output_path
        self.spare = spare
        self.context = multiprocessing.get_context("spawn")
        self._current: _Process | None = None
        self._spare: _Process | None = None
        self.spawned = 0

    def _spawn(self) -> _Process:
        parent_conn, child_conn = self.context.Pipe()
        process = self.context.Process(
            target=worker_main,
            args=(child_conn, self.kind, self.output_path),
            name=f"finalckpt-faults-{self.kind}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self.spawned += 1
        return _Process(process, parent_conn)

    def _worker(self) -> _Process:
        if self._current is None:
            self._current, self._spare = self._spare or self._spawn(), None
        if self.spare and self._spare is None:
            self._spare = self._spawn()
        return self._current

    def _bury(self, worker: _Process) -> int | None:
        worker.process.join(10)
        pid = worker.process.pid
        if pid is not None and pid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # the JVM a Spark worker started, if any
        worker.conn.close()
        if self._current is worker:
            self._current = None
        return worker.process.exitcode

    def run(
        self, job: AttemptJob, timeout_s: float, kill_after_s: float | None = None
    ) -> AttemptOutcome:
        """Run ``job``; ``kill_after_s``: SIGKILL the worker after that long (external fault)."""
        worker = self._worker()
        try:
            worker.conn.send(job)
        except OSError:  # it died since its last job (e.g. a late external kill): replace it
            self._bury(worker)
            worker = self._worker()
            worker.conn.send(job)
        start = time.monotonic()
        killed = False
        while True:
            elapsed = time.monotonic() - start
            dead = False
            try:
                if worker.conn.poll(0.05):
                    message = worker.conn.recv()
                    if isinstance(message, AttemptOutcome):
                        if killed:  # the kill came too late for the attempt, not for the worker
                            self._bury(worker)
                        return message
                    continue  # the "ready" greeting
            except (EOFError, OSError):
                dead = True  # the pipe closed: the worker is gone
            if dead or not worker.process.is_alive():
                status = "killed" if killed else "crashed"
                exitcode = self._bury(worker)
                return AttemptOutcome(job.label, status, seconds=elapsed, exitcode=exitcode)
            if kill_after_s is not None and not killed and elapsed >= kill_after_s:
                killed = True
                _kill(worker)
            if elapsed > timeout_s:
                _kill(worker)
                exitcode = self._bury(worker)
                return AttemptOutcome(
                    job.label,
                    "hung",
                    error=f"no result after {timeout_s:.0f} s",
                    seconds=elapsed,
                    exitcode=exitcode,
                )

    def close(self) -> None:
        for worker in (self._current, self._spare):
            if worker is None:
                continue
            with contextlib.suppress(OSError, BrokenPipeError):
                worker.conn.send(None)
            worker.process.join(30)
            if worker.process.is_alive():
                worker.process.kill()
            self._bury(worker)
        self._current = self._spare = None
