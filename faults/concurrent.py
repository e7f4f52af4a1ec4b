"""Fault campaign runs on branching graphs whose stages run at the same time.

A run of a shape (:mod:`faults.shapes`) is driven like Airflow drives a DAG
run: a stage starts when all its upstream stages closed, every ready stage starts at once, and
each stage attempt is its own OS process (forked from a preloaded fork server) with its own
coordinator, checkpoint storage and sinks over the run's store, like separate Airflow workers.
A finished stage waits for its final checkpoint by polling the real ``FinalCheckpointTrigger``
(the triggerer's code path: the shared snapshot first, then ``ensure_final_checkpoint`` and
``closable_checkpoint``), then commits and closes. Faults are armed per stage and attempt, so a
stage crashes, stalls or fails while its siblings run, finish, wait or commit. A failed stage
is retried (new process, new epoch) as Airflow retries a task; a run that does not end within
``RUN_TIMEOUT_S`` is killed and counts as hung.

After the run, :func:`closes_after_later_checkpoints` reads the store for the FLIP-147
out-of-order case: a finished stage closed on checkpoint C while an earlier checkpoint that
could have closed it (id >= its finish threshold) was still pending when C was triggered.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, select

from airflow_finalckpt.coordination import CheckpointInfo, Coordinator, StageView
from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    PipelineDrivenError,
    StaleEpochError,
)
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.rerun import Publication, TaskTry
from faults.injector import FaultInjector, FaultSpec
from faults.points import POINTS, Action
from faults.runs import Environment, RunPlan, RunReport, _classify, stale_commits, verify_against
from faults.shapes import PUBLISH, PUBLISHING, RANDOM_SHAPES, SHAPES, Shape
from faults.worker import CONCURRENT, AttemptOutcome, RunSetup

if TYPE_CHECKING:
    from airflow_finalckpt.runtime.runner import Log, StageRunner
    from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
    from airflow_finalckpt.storage import CheckpointStorage

#: A stage attempt that runs longer is killed (status hung).
STAGE_ATTEMPT_TIMEOUT_S = 120.0
#: A whole run that runs longer is killed and reported hung.
RUN_TIMEOUT_S = 240.0
#: How long a finished stage waits for its final checkpoint before its attempt fails.
CLOSE_TIMEOUT_S = 45.0
POLL_S = 0.05
#: Clean attempts per stage after its planned faults.
CLEAN_RETRIES = 3
#: Every stage attempt belongs to a DAG run of this DAG (``start_pipeline``'s driver);
#: ``DAG_RUN`` is the run of every random run (scenarios add a second one).
DAG_ID = "faults"
DAG_RUN = "run-1"
#: Attempt ends that Airflow does not retry: the pipeline is driven by another DAG run
#: (``PipelineDrivenError``: refused at its start), or a stale attempt of a run another run
#: took over (``operators.failures.taken_over``).
PERMANENT = frozenset({"refused", "taken-over"})
#: Modules the fork server imports once, so a stage attempt starts in milliseconds.
PRELOAD = (
    "pandas",
    "pyarrow.parquet",
    "sqlalchemy",
    "faults.concurrent",
    "faults.proxies",
    "airflow_finalckpt.runtime.gc",
    "airflow_finalckpt.sinks",
    "airflow_finalckpt.triggers.final_checkpoint",
)


# ------------------------------------------------------------------------------ one stage


@dataclass(frozen=True)
class StageJob:
    setup: RunSetup
    shape: str
    stage_id: str
    attempt: int
    faults: tuple[dict[str, Any], ...] = ()
    #: The DAG run the attempt belongs to, and whether that run takes the pipeline over.
    dag_run: str = DAG_RUN
    take_over: bool = False

    @property
    def label(self) -> str:
        run = "" if self.dag_run == DAG_RUN else f".{self.dag_run}"
        return f"{self.setup.run_id}{run}.{self.stage_id}.a{self.attempt}"


def upstream_manifests(coordinator: Coordinator, shape: Shape, stage_id: str) -> dict[str, Any]:
    """The end_of_data manifests of the stage's upstream stages (closed before it starts)."""
    views = coordinator.stages()
    manifests = {}
    for up in shape.stage(stage_id).upstream:
        final = views[up].final_snapshot
        if views[up].lifecycle is not StageLifecycle.CLOSED or final is None:
            raise FinalCheckpointError(f"upstream stage {up!r} of {stage_id!r} is not closed")
        assert final.end_of_data is not None
        manifests[up] = list(final.end_of_data.manifest)
    return manifests


def build_runner(
    coordinator: Coordinator,
    storage: CheckpointStorage,
    sinks: Sequence[TwoPhaseCommitSink],
    setup: RunSetup,
    shape: Shape,
    stage_id: str,
    *,
    log: Log,
    fault: Callable[[str], None] | None = None,
) -> StageRunner:
    from airflow_finalckpt.runtime.runner import CommitMode, StageRunner, StageSpec
    from faults.shapes import make_logic, stage_splits

    splits = stage_splits(shape, stage_id, upstream_manifests(coordinator, shape, stage_id))
    publish = shape.stage(stage_id).role in PUBLISHING
    logic = make_logic(shape, stage_id, storage, coordinator.pipeline_key, sinks)
    return StageRunner(
        coordinator,
        StageSpec(
            pipeline_key=coordinator.pipeline_key,
            stage_id=stage_id,
            splits=tuple(splits),
            batch_size=setup.batch_sizes.get(stage_id, 2),
            checkpoint_interval_s=setup.checkpoint_interval_s,
            commit_mode=CommitMode(setup.commit_mode),
            attempt_lease_s=setup.attempt_lease_s,
        ),
        logic,
        list(sinks) if publish else [],
        output_handle=None if publish else logic.output_handle,
        log=log,
        fault=fault,
    )


def wait_and_close(
    runner: StageRunner, setup: RunSetup, *, timeout_s: float = CLOSE_TIMEOUT_S
) -> None:
    """Wait for the stage's final checkpoint as the deferred task does, by polling the real
    ``FinalCheckpointTrigger`` (over this attempt's coordinator), then commit and close."""
    from airflow_finalckpt.triggers.final_checkpoint import STATUS_CLOSABLE, FinalCheckpointTrigger

    coordinator = runner.coordinator
    stage_id = runner.spec.stage_id
    assert runner.epoch is not None
    trigger = FinalCheckpointTrigger(
        coordinator.pipeline_key,
        stage_id,
        setup.store_url,
        poll_interval=POLL_S,
        storage_uri=setup.storage_root,
        epoch=runner.epoch,
    )
    trigger._coordinator = coordinator  # the fault-injecting one: its transitions are faulted
    deadline = time.monotonic() + timeout_s
    while True:
        payload = trigger._poll().payload
        if payload is not None and payload["status"] == STATUS_CLOSABLE:
            if runner.try_close() is not None:
                return
        elif payload is not None:
            coordinator.check_epoch(stage_id, runner.epoch)  # a stale attempt: StaleEpochError
            raise FinalCheckpointError(f"waiting for stage {stage_id!r}: {payload}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"stage {stage_id} did not reach its final checkpoint in {timeout_s:.0f} s"
            )
        time.sleep(POLL_S)


def run_stage_to_close(
    coordinator: Coordinator,
    storage: CheckpointStorage,
    sinks: Sequence[TwoPhaseCommitSink],
    setup: RunSetup,
    shape: Shape,
    stage_id: str,
    *,
    log: Log,
    fault: Callable[[str], None] | None = None,
) -> bool:
    """One attempt of one stage, as its Airflow task runs it; False if it was suspended."""
    from airflow_finalckpt.runtime.runner import RunStatus

    coordinator.register(shape.graph())
    runner = build_runner(coordinator, storage, sinks, setup, shape, stage_id, log=log, fault=fault)
    result = runner.run()
    if result.status is RunStatus.SUSPENDED:
        return False
    if result.status is not RunStatus.CLOSED:
        wait_and_close(runner, setup)
    return True


def join_pipeline(
    coordinator: Coordinator, shape: Shape, stage_id: str, dag_run: str, take_over: bool
) -> bool:
    """Start the pipeline as a stage task of DAG run ``dag_run`` does (``start_pipeline`` with
    its driver, then ``link_dag_run``); True if the stage's commit belongs to an earlier DAG
    run, which announced it: this attempt only re-publishes, without an Asset event."""
    options = getattr(coordinator, "options", None)  # the fault proxy pins the run's options
    coordinator.start_pipeline(
        shape.graph(), options=options, driver=(DAG_ID, dag_run), take_over=take_over
    )
    coordinator.link_dag_run(DAG_ID, dag_run)
    return coordinator.closed_before_dag_run(stage_id, DAG_ID, dag_run)


def _successor(
    setup: RunSetup, shape: Shape, label: str, log: logging.Logger
) -> Callable[[str], None]:
    """A ZOMBIE fault's newer attempt: runs the stage to CLOSED with fresh objects in this
    process while the stalled attempt waits in its fault point."""

    def run_newer_attempt(stage_id: str) -> None:
        from airflow_finalckpt.storage import CheckpointStorage
        from airflow_finalckpt.store.engine import make_engine
        from faults.injector import append_event
        from faults.proxies import FaultySink
        from faults.worker import dispose_sinks, make_sinks

        recorder = FaultInjector(events_path=setup.events_path, label=f"{label}.successor")
        engine = make_engine(setup.store_url)
        real = make_sinks(setup)
        event = {"label": label, "stage": stage_id, "pid": os.getpid()}
        try:
            storage = CheckpointStorage(setup.storage_root)
            append_event(setup.events_path, {"event": "successor-start", "t": time.time(), **event})
            log.info("zombie: attempt %s stalls while a newer attempt runs %s", label, stage_id)
            run_stage_to_close(
                _coordinator(engine, setup, storage, None),
                storage,
                [FaultySink(s, recorder) for s in real],
                setup,
                shape,
                stage_id,
                log=log,
            )
            append_event(setup.events_path, {"event": "successor-end", "t": time.time(), **event})
        finally:
            dispose_sinks(real)
            engine.dispose()

    return run_newer_attempt


def _coordinator(
    engine: Engine, setup: RunSetup, storage: CheckpointStorage, injector: FaultInjector | None
) -> Coordinator:
    from airflow_finalckpt.coordination import CoordinatorOptions
    from faults.proxies import faulty_coordinator

    options = CoordinatorOptions(
        retain_checkpoints=setup.retain_checkpoints,
        checkpoint_timeout_s=setup.checkpoint_timeout_s,
    )
    return faulty_coordinator(
        engine,
        setup.pipeline_key,
        injector=injector or FaultInjector(),
        writer=storage,
        options=options,
    )


def _lifecycle_reader(engine: Engine, setup: RunSetup) -> Callable[[], dict[str, str]]:
    """Every stage's lifecycle, read without fault points (for holds: ``FaultSpec.until``),
    and the scheduler's markers: ``@<name>`` is FINISHED once a ``marker`` event named
    ``<name>`` is in the run's events (a hold until something outside the store happened)."""
    from faults.injector import read_events

    reader = Coordinator(engine, setup.pipeline_key)

    def read() -> dict[str, str]:
        states = {sid: view.lifecycle.value for sid, view in reader.stages().items()}
        for event in read_events(setup.events_path):
            if event.get("event") == "marker":
                states[f"@{event['name']}"] = StageLifecycle.FINISHED.value
        return states

    return read


def execute_stage_attempt(job: StageJob) -> AttemptOutcome:
    """Run one stage attempt in this process with its armed faults (a CRASH kills it)."""
    from airflow_finalckpt.store.engine import make_engine
    from faults.injector import append_event, specs_from
    from faults.proxies import FaultySink, FaultyStorage, gc_hook
    from faults.worker import dispose_sinks, make_sinks

    setup, label, shape = job.setup, job.label, SHAPES[job.shape]
    injector = FaultInjector(
        specs_from(job.faults), events_path=setup.events_path, label=label, stage=job.stage_id
    )
    handler = logging.FileHandler(setup.log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(f"%(asctime)s {label} %(levelname)s %(message)s"))
    package_log = logging.getLogger("airflow_finalckpt")
    package_log.addHandler(handler)
    package_log.setLevel(logging.INFO)
    stage_log = logging.getLogger("airflow_finalckpt.faults.stage")
    start = time.monotonic()
    outcome = AttemptOutcome(label=label, status="completed")
    append_event(setup.events_path, {"event": "attempt", "label": label, "pid": os.getpid()})
    engine = make_engine(setup.store_url)
    real_sinks = make_sinks(setup)
    coordinator: Coordinator | None = None
    try:
        storage = FaultyStorage(setup.storage_root, injector)
        sinks = [FaultySink(s, injector) for s in real_sinks]
        injector.zombie = _successor(setup, shape, label, stage_log)
        injector.lifecycles = _lifecycle_reader(engine, setup)
        coordinator = _coordinator(engine, setup, storage, injector)
        republish = join_pipeline(coordinator, shape, job.stage_id, job.dag_run, job.take_over)
        with gc_hook(injector, setup.gc_grace_s):
            done = run_stage_to_close(
                coordinator,
                storage,
                sinks,
                setup,
                shape,
                job.stage_id,
                log=stage_log,
                fault=lambda point: injector.hit(point, job.stage_id),
            )
        outcome.status = "completed" if done else "suspended"
        # the task's success emits the stage's Asset events, as the operator's _publish decides:
        # not for a stage closed before this DAG run, nor for a close another try returned first
        this_try = TaskTry(DAG_ID, job.dag_run, job.stage_id, job.attempt)
        recorded = coordinator.publish(job.stage_id, this_try) if done else None
        if recorded is Publication.FIRST and not republish:
            view = coordinator.stage(job.stage_id)
            publication = {"stage": job.stage_id, "dag_run": job.dag_run, "label": label}
            closed_on = {"closed_on": view.closed_checkpoint_id}
            append_event(setup.events_path, {"event": "publication", **publication, **closed_on})
    except PipelineDrivenError as exc:  # permanent: Airflow does not retry it
        stage_log.warning("attempt %s refused: %s", label, exc)
        outcome.status, outcome.error_type, outcome.error = "refused", type(exc).__name__, str(exc)
    except (StaleEpochError, FinalCheckpointError) as exc:
        driver = _driver(coordinator)
        if driver is not None and driver != (DAG_ID, job.dag_run):
            # operators.failures.taken_over: the run lost its pipeline, the task fails for good
            stage_log.warning("attempt %s: taken over by %s: %s", label, driver, exc)
            outcome.status = "taken-over"
        elif isinstance(exc, StaleEpochError):
            stage_log.warning("stage %s: stale attempt stops itself: %s", exc.stage_id, exc)
            outcome.status = "stale"
        else:
            stage_log.warning("attempt %s failed: %s: %s", label, type(exc).__name__, exc)
            outcome.status = "failed"
        outcome.error_type, outcome.error = type(exc).__name__, str(exc)
    except Exception as exc:
        stage_log.warning("attempt %s failed: %s: %s", label, type(exc).__name__, exc)
        outcome.status, outcome.error_type, outcome.error = "failed", type(exc).__name__, str(exc)
    finally:
        dispose_sinks(real_sinks)
        engine.dispose()
        package_log.removeHandler(handler)
        handler.close()
    outcome.seconds = time.monotonic() - start
    outcome.hits = dict(injector.hits)
    outcome.fired = list(injector.fired)
    return outcome


def _driver(coordinator: Coordinator | None) -> tuple[str, str] | None:
    """The DAG run driving the pipeline, read without fault points (None if unknown)."""
    if coordinator is None:
        return None
    try:
        return Coordinator(coordinator.engine, coordinator.pipeline_key).driver()
    except Exception:
        return None


def stage_main(job: StageJob, conn: Connection, output_path: str) -> None:
    """Entry point of a stage attempt's process."""
    with open(output_path, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    conn.send(execute_stage_attempt(job))
    conn.close()


# ------------------------------------------------------------------------------ one run


_context: Any = None


def process_context() -> Any:
    """The fork-server context (one preloaded server per campaign process)."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        _context = context
    return _context


@dataclass
class _Attempt:
    job: StageJob
    process: Any
    conn: Connection
    started: float
    kill_after_s: float | None = None
    killed: bool = False


@dataclass
class StageScheduler:
    """Starts stage attempts of one DAG run as Airflow would (downstream after upstream closed,
    every ready stage at once, retries after failures; a stage out of tries fails for good and
    its downstream stages never start, while the other branches go on) and collects their
    outcomes; ``hung`` if the run outlived its timeout."""

    plan: RunPlan
    setup: RunSetup
    shape: Shape
    run_timeout_s: float = RUN_TIMEOUT_S
    #: The DAG run whose tasks these are, and whether it takes the pipeline over.
    dag_run: str = DAG_RUN
    take_over: bool = False
    outcomes: list[AttemptOutcome] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    started: Counter[str] = field(default_factory=Counter)
    running: dict[str, _Attempt] = field(default_factory=dict)
    #: Stages that failed for good (out of tries, or a permanent error), in order.
    gave_up: list[str] = field(default_factory=list)
    #: When each attempt started and ended (label -> monotonic seconds).
    launched_at: dict[str, float] = field(default_factory=dict)
    ended_at: dict[str, float] = field(default_factory=dict)
    hung: bool = False

    def faults_for(self, stage_id: str, attempt: int) -> tuple[dict[str, Any], ...]:
        if attempt > len(self.plan.attempts):
            return ()
        return tuple(s.to_dict() for s in self.plan.attempts[attempt - 1] if s.stage == stage_id)

    def tries(self, stage_id: str) -> int:
        """A stage's tries: its planned faulty attempts, plus clean ones unless it is doomed."""
        if stage_id in self.plan.doomed:
            return max(1, len(self.plan.attempts))
        return len(self.plan.attempts) + CLEAN_RETRIES

    def kill_for(self, stage_id: str, attempt: int) -> float | None:
        if self.plan.kill_stage != stage_id or attempt > len(self.plan.kills):
            return None
        return self.plan.kills[attempt - 1]

    def ready(self) -> list[str]:
        return [
            s.stage_id
            for s in self.shape.stages
            if s.stage_id not in self.closed
            and s.stage_id not in self.running
            and s.stage_id not in self.gave_up
            and all(up in self.closed for up in s.upstream)
        ]

    def launch(self, stage_id: str) -> None:
        attempt = self.started[stage_id] + 1
        self.started[stage_id] = attempt
        job = StageJob(
            self.setup,
            self.shape.name,
            stage_id,
            attempt,
            self.faults_for(stage_id, attempt),
            dag_run=self.dag_run,
            take_over=self.take_over,
        )
        context = process_context()
        parent, child = context.Pipe()
        output = os.path.join(os.path.dirname(self.setup.events_path), "stages.out")
        process = context.Process(target=stage_main, args=(job, child, output), daemon=True)
        process.start()
        child.close()
        now = time.monotonic()
        self.launched_at[job.label] = now
        self.running[stage_id] = _Attempt(
            job, process, parent, now, self.kill_for(stage_id, attempt)
        )

    def _end(self, stage_id: str, outcome: AttemptOutcome) -> None:
        attempt = self.running.pop(stage_id)
        attempt.conn.close()
        attempt.process.join(5)
        outcome.exitcode = attempt.process.exitcode
        self.outcomes.append(outcome)
        self.ended_at[outcome.label] = time.monotonic()
        if outcome.status == "completed":
            self.closed.add(stage_id)
        elif outcome.status in PERMANENT or self.started[stage_id] >= self.tries(stage_id):
            self.gave_up.append(stage_id)

    def poll(self, stage_id: str, now: float) -> None:
        attempt = self.running[stage_id]
        elapsed = now - attempt.started
        label = attempt.job.label
        try:
            if attempt.conn.poll(0):
                self._end(stage_id, attempt.conn.recv())
                return
        except (EOFError, OSError):
            pass
        if not attempt.process.is_alive():
            status = "killed" if attempt.killed else "crashed"
            self._end(stage_id, AttemptOutcome(label, status, seconds=elapsed))
            return
        due = attempt.kill_after_s
        if due is not None and not attempt.killed and elapsed >= due:
            attempt.killed = True
            _sigkill(attempt.process.pid)
        if elapsed > STAGE_ATTEMPT_TIMEOUT_S:
            _sigkill(attempt.process.pid)
            self._end(
                stage_id,
                AttemptOutcome(label, "hung", error=f"no result after {elapsed:.0f} s"),
            )

    def step(self) -> bool:
        """Start what is ready, poll what runs; False once nothing runs and nothing can start
        (every stage closed, failed for good, or downstream of one that did)."""
        for stage_id in self.ready():
            self.launch(stage_id)
        now = time.monotonic()
        for stage_id in list(self.running):
            self.poll(stage_id, now)
        return bool(self.running or self.ready())

    def run(self) -> None:
        deadline = time.monotonic() + self.run_timeout_s
        while self.step():
            if time.monotonic() > deadline:
                self.hung = True
                break
            time.sleep(0.02)
        self.stop()

    def stop(self) -> None:
        """Kill what still runs (the run ended or hung)."""
        for attempt in list(self.running.values()):
            _sigkill(attempt.process.pid)
            attempt.process.join(5)
            status = "hung" if self.hung else "killed"
            self.outcomes.append(AttemptOutcome(attempt.job.label, status, error="run ended"))
        self.running.clear()


def _sigkill(pid: int | None) -> None:
    if pid is not None and pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def execute_concurrent_run(env: Environment, plan: RunPlan) -> RunReport:
    """Run a concurrent-graph plan to the end (or its timeout), then verify it."""
    from faults.fake import KEY_COLUMNS
    from faults.injector import read_events

    start = time.monotonic()
    assert plan.shape is not None
    setup = env.setup(plan)
    scheduler = StageScheduler(plan, setup, SHAPES[plan.shape])
    report = RunReport(plan)
    try:
        scheduler.run()
    finally:
        events = read_events(setup.events_path)
    for outcome in scheduler.outcomes:
        outcome.fired = [
            e for e in events if e.get("event") == "fault" and e.get("label") == outcome.label
        ]
        kill_planned = plan.kill_stage is not None and outcome.label.startswith(
            f"{plan.run_id}.{plan.kill_stage}."
        )
        _issue, problem = _classify(outcome, kill_planned)
        if problem is not None and outcome.error != "run ended":
            report.unexpected.append(problem)
    report.attempts = scheduler.outcomes
    report.completed = len(scheduler.closed) == len(scheduler.shape.stages)
    report.hung = scheduler.hung
    report.stale_commits = stale_commits(events)
    report.republished = publication_problems(events, closed_stages(setup))
    report.verdict = verify_against(setup, env.expected(plan), KEY_COLUMNS)
    report.out_of_order, report.late_closes = _closes(setup)
    report.seconds = time.monotonic() - start
    return report


def closed_stages(setup: RunSetup) -> set[str]:
    """The stages the run's store shows CLOSED."""
    from airflow_finalckpt.store.engine import make_engine

    engine = make_engine(setup.store_url)
    try:
        views = Coordinator(engine, setup.pipeline_key).stages()
    finally:
        engine.dispose()
    return {sid for sid, view in views.items() if view.lifecycle is StageLifecycle.CLOSED}


def publication_problems(events: Sequence[dict[str, Any]], closed: set[str]) -> list[str]:
    """One publication (the Asset events of a task's success) per commit: every CLOSED stage
    announced exactly once, over all DAG runs, and no other stage announced."""
    runs: dict[str, list[str]] = {}
    for event in events:
        if event.get("event") == "publication":
            runs.setdefault(event["stage"], []).append(event["dag_run"])
    found = []
    for stage_id in sorted(closed | set(runs)):
        by = runs.get(stage_id, [])
        if stage_id not in closed:
            found.append(f"stage {stage_id} is not CLOSED but was announced by {by}")
        elif len(by) != 1:
            found.append(f"stage {stage_id} closed once, announced {len(by)} times (by {by})")
    return found


def _closes(setup: RunSetup) -> tuple[int, int]:
    from airflow_finalckpt.store.engine import make_engine

    engine = make_engine(setup.store_url)
    try:
        coordinator = Coordinator(engine, setup.pipeline_key)
        closes = closes_after_later_checkpoints(
            coordinator.stages(),
            coordinator.checkpoints(),
            last_acks(engine, setup.pipeline_key),
            setup.checkpoint_timeout_s,
        )
    finally:
        engine.dispose()
    return sum(1 for c in closes if c.overlapping), len(closes)


# ------------------------------------------------------------------------------ out of order


@dataclass(frozen=True)
class LateClose:
    """A finished stage closed on ``closed_on`` although checkpoint ``earlier`` (>= its finish
    threshold) had been triggered before it and never completed. ``overlapping``: ``earlier``
    was still pending when ``closed_on`` was triggered (FLIP-147: 42, 43 pending, 43 completes
    first)."""

    stage_id: str
    threshold: int
    earlier: int
    closed_on: int
    overlapping: bool


def last_acks(engine: Engine, pipeline_key: str) -> dict[int, float]:
    """checkpoint id -> time of its last acknowledgement (when its completion was attempted)."""
    from airflow_finalckpt.store import schema as t

    with engine.connect() as conn:
        rows = conn.execute(
            select(t.acks.c.checkpoint_id, func.max(t.acks.c.acked_at))
            .where(t.acks.c.pipeline_key == pipeline_key)
            .group_by(t.acks.c.checkpoint_id)
        ).all()
    return {int(cid): float(at) for cid, at in rows}


def aborted_no_earlier_than(
    info: CheckpointInfo, acks: dict[int, float], timeout_s: float
) -> float:
    """A lower bound of when a never-completed checkpoint was aborted, from its reason."""
    reason = info.failure_reason or ""
    if reason.startswith("subsumed"):
        return float("inf")  # pending until the later checkpoint completed
    if reason.startswith("timed out"):
        return info.triggered_at + timeout_s
    if reason.startswith("writing checkpoint metadata failed"):
        return acks.get(info.checkpoint_id, info.triggered_at)
    if info.failure_reason is None:  # still pending (the run did not end)
        return float("inf")
    return info.triggered_at


def closes_after_later_checkpoints(
    stages: dict[str, StageView],
    checkpoints: Sequence[CheckpointInfo],
    acks: dict[int, float],
    timeout_s: float,
) -> list[LateClose]:
    """Every closed stage whose first candidate checkpoint never completed (see LateClose)."""
    by_id = {c.checkpoint_id: c for c in checkpoints}
    found = []
    for stage_id, view in sorted(stages.items()):
        threshold, closed_on = view.finish_threshold, view.closed_checkpoint_id
        if threshold is None or closed_on is None or closed_on <= threshold:
            continue
        later = by_id.get(closed_on)
        earlier = [
            c
            for cid, c in sorted(by_id.items())
            if threshold <= cid < closed_on and not c.is_completed
        ]
        if later is None or not earlier:
            continue
        overlapping = [
            c
            for c in earlier
            if c.triggered_at <= later.triggered_at
            and aborted_no_earlier_than(c, acks, timeout_s) >= later.triggered_at
        ]
        first = (overlapping or earlier)[0]
        found.append(
            LateClose(stage_id, threshold, first.checkpoint_id, closed_on, bool(overlapping))
        )
    return found


# ------------------------------------------------------------------------------ planning


def stage_points(shape: Shape, stage_id: str) -> list[str]:
    """The fault points an attempt of the stage passes (sink points only in publishers, state
    writes not in publishers, the orphan abort only after a crash that left one)."""
    role = shape.stage(stage_id).role
    names = []
    for name, spec in sorted(POINTS.items()):
        if spec.sink_stage_only and role not in PUBLISHING:
            continue
        if name == "state-mid-write" and role == PUBLISH:
            continue
        if name == "sink-before-abort":
            continue
        names.append(name)
    return names


@dataclass
class ShapeCoverage:
    """Per shape, per stage: the points still to arm, so the first runs of a shape arm every
    point of every stage once (then the queues refill in a new random order)."""

    rng: random.Random
    queues: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def next_point(self, shape: Shape, stage_id: str) -> str:
        queue = self.queues.setdefault((shape.name, stage_id), [])
        if not queue:
            queue += stage_points(shape, stage_id)
            self.rng.shuffle(queue)
        return queue.pop(0)


ACTION_WEIGHTS = {
    Action.CRASH: 5,
    Action.RAISE: 3,
    Action.DELAY: 3,
    Action.EIO: 2,
    Action.ENOSPC: 2,
    Action.ZOMBIE: 2,
}


def _spec(rng: random.Random, name: str, stage_id: str, action: Action | None = None) -> FaultSpec:
    allowed = POINTS[name].actions
    chosen = action or rng.choices(allowed, weights=[ACTION_WEIGHTS[a] for a in allowed])[0]
    return FaultSpec(
        point=name,
        action=chosen,
        stage=stage_id,
        nth=rng.choice((1, 1, 1, 2)),
        delay_s=round(rng.uniform(0.1, 1.5), 3) if chosen is Action.DELAY else 0.0,
    )


#: Share of the runs of a shape with parallel stages that get a straggler (see straggler()).
STRAGGLER_SHARE = 0.5
#: The longest a straggler run's hold waits (a sibling killed or crashed may never get there).
HOLD_CAP_S = 30.0


def straggler(
    rng: random.Random, shape: Shape, first: list[FaultSpec], batch_sizes: dict[str, int | str]
) -> list[FaultSpec]:
    """Order three parallel stages so that a checkpoint stays pending while a later one
    completes, and fail the first checkpoint completion of the one that finishes last.

    Stages ``a``, ``b`` and the straggler ``s`` start together; each holds before its first
    batch (a DELAY ``until`` the store shows the others there):

    1. ``a`` waits for ``b`` and ``s`` to start, runs, and finishes: eager checkpoint N waits
       for ``b`` and ``s``;
    2. ``b`` waits for ``a``'s finish: its first batch boundary acknowledges N, so its own
       finish cannot join N and triggers N+1 (FLIP-147: 42, then 43);
    3. ``s`` waits for both finishes: its first batch acknowledges N and N+1 in one transition,
       writing N's ``_metadata`` fails (EIO/ENOSPC), N+1 completes first and ``a`` closes on it.

    Without the holds this depended on timing (and a CI machine saw none in 42 runs). Holds
    end after ``HOLD_CAP_S`` at the latest: a sibling killed from outside does not hang the run.
    """
    slow = rng.choice(shape.parallel)
    a, b = [sid for sid in shape.parallel if sid != slow][:2]
    upstream = {up for sid in shape.parallel for up in shape.stage(sid).upstream}
    for sid in upstream:
        batch_sizes[sid] = 1  # more parts: more batches for the straggler
    for sid in shape.parallel:
        batch_sizes[sid] = 1 if sid == slow else 4
    action = rng.choice((Action.EIO, Action.ENOSPC))

    def hold(stage: str, *until: str) -> FaultSpec:
        return FaultSpec("before-batch", Action.DELAY, stage=stage, delay_s=HOLD_CAP_S, until=until)

    return [s for s in first if s.stage not in shape.parallel] + [
        hold(a, f"{b}:started", f"{slow}:started"),
        hold(b, f"{a}:finished"),
        hold(slow, f"{a}:finished", f"{b}:finished"),
        FaultSpec("metadata-before-write", action, stage=slow, nth=1),
    ]


def plan_concurrent_run(
    index: int, shape: Shape, rng: random.Random, coverage: ShapeCoverage
) -> RunPlan:
    """A run of ``shape``: about half of its stages get a fault in their first attempt (the
    next point of that stage's coverage queue), sometimes a crash in a second attempt, an
    orphan for the recovery to abort, or a SIGKILL from outside at a random moment."""

    first: list[FaultSpec] = []
    second: list[FaultSpec] = []
    for stage_id in shape.stage_ids:
        if rng.random() < 0.5:
            first.append(_spec(rng, coverage.next_point(shape, stage_id), stage_id))
    publishers = shape.roles(*PUBLISHING)
    if rng.random() < 0.15:  # a crash after staging leaves an orphan the retry aborts
        pub = rng.choice(publishers)
        first = [s for s in first if s.stage != pub]
        first.append(FaultSpec("mid-batch", Action.CRASH, stage=pub))
        second.append(
            FaultSpec(
                "sink-before-abort", rng.choice(POINTS["sink-before-abort"].actions), stage=pub
            )
        )
    if rng.random() < 0.25:
        stage_id = rng.choice(shape.stage_ids)
        if all(s.stage != stage_id for s in second):
            names = [n for n in stage_points(shape, stage_id) if Action.CRASH in POINTS[n].actions]
            second.append(_spec(rng, rng.choice(names), stage_id, Action.CRASH))
    batch_sizes: dict[str, int | str] = {
        sid: rng.choice((1, 1, 2, 3, "auto")) for sid in shape.stage_ids
    }
    interval = rng.choice((0.0, 0.0, 3600.0))
    straggling = bool(shape.parallel) and rng.random() < STRAGGLER_SHARE
    if straggling:
        first, interval = straggler(rng, shape, first, batch_sizes), 3600.0
    kill_stage = None
    kills: tuple[float | None, ...] = ()
    if rng.random() < 0.12:
        kill_stage = rng.choice(
            [s for s in shape.stage_ids if all(f.stage != s for f in first)] or [shape.stage_ids[0]]
        )
        kills = (round(rng.uniform(0.05, 0.8), 2),)
    attempts = tuple(a for a in (tuple(first), tuple(second)) if a)
    if second and not first:
        attempts = ((), tuple(second))
    commit_mode = "final" if rng.random() < 0.25 else "progressive"
    retain = rng.choice((1, 2, 3))
    timeout = 1.0 if rng.random() < 0.3 else 600.0
    return RunPlan(
        index=index,
        kind=CONCURRENT,
        purpose=f"concurrent {shape.name}",
        attempts=attempts,
        kills=kills,
        batch_sizes=batch_sizes,
        commit_mode=commit_mode,
        checkpoint_interval_s=interval,
        retain_checkpoints=retain,
        # a straggler's N stays pending through two stages' work: a 1 s timeout would abort it
        checkpoint_timeout_s=600.0 if straggling else timeout,
        shape=shape.name,
        kill_stage=kill_stage,
    )


def plan_concurrent(
    runs: int, seed: int, first_index: int, shapes: Sequence[str] = RANDOM_SHAPES
) -> list[RunPlan]:
    """``runs`` plans spread round-robin over ``shapes``, deterministic for a seed."""
    rng = random.Random(seed * 7919 + 13)
    coverage = ShapeCoverage(random.Random(rng.getrandbits(64)))
    return [
        plan_concurrent_run(
            first_index + n,
            SHAPES[shapes[n % len(shapes)]],
            random.Random(rng.getrandbits(64)),
            coverage,
        )
        for n in range(runs)
    ]


def shape_of(plan: RunPlan) -> str | None:
    return plan.shape if plan.kind == CONCURRENT else None
