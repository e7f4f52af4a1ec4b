"""External faults: a really full file system, a restarted PostgreSQL server, faults during a stop.

The fault points of :mod:`~faults.points` fail one call from inside the process;
these scenarios change the world around a fake-pipeline run instead, then let clean recovery
attempts finish it (as Airflow retries would) and verify it like any campaign run:

- ``disk-full``: checkpoint storage (one run), then the Parquet sink's directory (another) live
  on a tiny tmpfs, so a write fails with a real ENOSPC mid-run. The failed attempt must leave
  only what it may (no commit the coordinator does not know, every completed checkpoint
  restorable); then the file system grows and the recovery finishes.
- ``store-restart``: a private PostgreSQL 15 cluster (never the shared server) is the
  coordination store and the SQL sink; it is restarted (``-m immediate``: a crash, then WAL
  recovery) while the pipeline holds an open completing transition.
- ``stop-savepoint`` / ``stop-drain``: an operator requests a stop from another process mid-run
  and a crash or exception fires while the stop is under way (the savepoint being acknowledged,
  completed but the stage not suspended yet, a drained stage finished but not closed, ...); the
  run recovers (and resumes) to the fault-free result.

``python -m faults.campaign --runs 0 --seed 1 --external all`` runs them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.core.model import StageLifecycle, StopMode, StopState
from faults.fake import FakeData
from faults.injector import FaultSpec, read_events
from faults.partition import PartitionedPostgres, partition_unavailable
from faults.points import Action
from faults.postgres import PG_BIN, PrivatePostgres, postgres_unavailable
from faults.runs import (
    AttemptRunner,
    Environment,
    RunPlan,
    RunReport,
    stale_commits,
    verify_against,
)
from faults.worker import AttemptJob, AttemptOutcome, RunSetup

if TYPE_CHECKING:
    from faults.verify import Verdict

#: tmpfs sizes a run fills mid-way, per what lives on the disk (calibrated on 2026-11-23: with
#: 96 KiB the checkpoint storage fills in stage agg, after checkpoints completed; 16 KiB of
#: Parquet sink fills in stage publish, after transactions were committed).
DISK_FULL_SIZES = {"checkpoints": "96k", "sink": "16k"}
DISK_GROWN_SIZE = "64m"
ENOSPC_TEXT = "No space left on device"
#: How long a watched fault stalls the attempt while the parent acts (restart, stop request).
WINDOW_S = 3.0
ATTEMPT_TIMEOUT_S = 180.0
#: Attempts after the first before a scenario counts as unrecovered (a stop needs one more).
RECOVERY_ATTEMPTS = 4
STOP_NAMES = ("stop-savepoint", "stop-drain")
NAMES = ("disk-full", "store-restart", "store-partition", *STOP_NAMES)


# ------------------------------------------------------------------------------ a tiny disk


def mount_unavailable() -> str | None:
    """Why a tmpfs cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (the disk-full scenario mounts a real small disk)"
    probe = tempfile.mkdtemp(prefix="finalckpt-probe-")
    try:
        with tmpfs(Path(probe), "4k"):
            return None
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot mount a tmpfs ({exc}); the disk-full scenario needs mount permission"
    finally:
        os.rmdir(probe)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path``, unmounted (lazily if busy) whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def resize_tmpfs(path: Path, size: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True
    )


# ------------------------------------------------------------------------------ a private server


# ------------------------------------------------------------------------------ running


class _OnFault(threading.Thread):
    """Runs ``action`` as soon as attempt ``label`` reports the firing of a fault at ``point``
    (the injector logs the event before the fault stalls the attempt)."""

    def __init__(self, events: str, label: str, point: str, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.events, self.label, self.point, self.action = events, label, point, action
        self.done = threading.Event()
        self.error: str | None = None
        self.fired = False

    def run(self) -> None:
        try:
            while not self.done.is_set():
                if any(
                    e.get("event") == "fault"
                    and e.get("label") == self.label
                    and e.get("point") == self.point
                    for e in read_events(self.events)
                ):
                    self.fired = True
                    self.action()
                    return
                time.sleep(0.02)
        except Exception as exc:  # reported as a problem of the run
            self.error = f"{type(exc).__name__}: {exc}"

    def finish(self) -> list[str]:
        self.done.set()
        self.join(120)
        if self.error is not None:
            return [f"external action at {self.point} failed: {self.error}"]
        if not self.fired:
            return [f"the fault at {self.point} never fired: the external action did not run"]
        return []


def _coordinator_call(setup: RunSetup, call: Callable[[Any], object]) -> None:
    """Call the run's coordinator from this process (an operator's CLI / REST request)."""
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.store.engine import make_engine

    engine = make_engine(setup.store_url)
    try:
        call(Coordinator(engine, setup.pipeline_key))
    finally:
        engine.dispose()


def _resume_if_suspended(setup: RunSetup) -> list[str]:
    problems: list[str] = []

    def resume(coordinator: Any) -> None:
        stop = coordinator.stop_request()
        if stop is None or stop.mode is not StopMode.SAVEPOINT:
            problems.append(f"an attempt ended suspended without a savepoint stop ({stop})")
        elif stop.state is StopState.COMPLETED:
            coordinator.resume("faults.external")
        else:
            problems.append(f"an attempt ended suspended but the stop is {stop.state.value}")

    _coordinator_call(setup, resume)
    return problems


@dataclass(frozen=True)
class Watch:
    """Run ``action`` in the parent while attempt 1 stalls in its fault at ``point``."""

    point: str
    action: Callable[[RunSetup], None]


@dataclass
class Scenario:
    """One external-fault run: a plan, the world around it, and what attempt 1 must do."""

    name: str
    plan: RunPlan
    #: Statuses attempt 1 may end with (its faults, or the external fault, explain them).
    first: tuple[str, ...]
    watch: Watch | None = None
    #: Checks after attempt 1 (problems found) and the repair before the recovery.
    after_first: Callable[[RunSetup, AttemptOutcome], list[str]] | None = None
    #: Expected sink rows: the first ``splits`` splits of the input (a drain), else all.
    splits: int | None = None


def execute_scenario(
    env: Environment,
    scenario: Scenario,
    worker: AttemptRunner,
    *,
    setup: RunSetup | None = None,
) -> RunReport:
    """Attempt 1 with its faults (and the watched external action), then clean attempts,
    resuming after a savepoint stop, until the pipeline completes; then verify."""

    start = time.monotonic()
    plan = scenario.plan
    report = RunReport(plan)
    setup = setup or env.setup(plan)
    for number in range(1, RECOVERY_ATTEMPTS + 2):
        specs = plan.attempts[0] if number == 1 and plan.attempts else ()
        job = AttemptJob(setup, number, tuple(s.to_dict() for s in specs))
        watch = scenario.watch if number == 1 else None
        watcher = None
        if watch is not None:
            watcher = _OnFault(
                setup.events_path, job.label, watch.point, partial(watch.action, setup)
            )
            watcher.start()
        outcome = worker.run(job, ATTEMPT_TIMEOUT_S)
        if watcher is not None:
            report.unexpected += watcher.finish()
        outcome.fired = [
            e
            for e in read_events(setup.events_path)
            if e.get("event") == "fault" and e.get("label") == job.label
        ]
        report.attempts.append(outcome)
        allowed = scenario.first if number == 1 else ("completed", "suspended")
        if outcome.status not in allowed:
            report.unexpected.append(
                f"attempt {outcome.label} ended {outcome.status} (expected "
                f"{' or '.join(allowed)}): {outcome.error_type}: {outcome.error}"
            )
        if number == 1 and scenario.after_first is not None:
            report.unexpected += scenario.after_first(setup, outcome)
        if outcome.status == "completed":
            report.completed = True
            report.ended_at = time.monotonic()
            break
        if outcome.status == "suspended":
            report.unexpected += _resume_if_suspended(setup)
    report.stale_commits = stale_commits(read_events(setup.events_path))
    report.verdict = verify(setup, scenario.splits, plan)
    report.seconds = time.monotonic() - start
    return report


def verify(setup: RunSetup, splits: int | None, plan: RunPlan) -> Verdict:
    """verify_run against the reference of the whole input, or of its first ``splits``."""
    import pandas as pd

    from faults.fake import KEY_COLUMNS, reference_windows

    data = FakeData(**(plan.fake or {}))
    if splits is not None:
        data = dataclasses.replace(data, splits=splits)
    return verify_against(setup, pd.DataFrame(reference_windows(data)), KEY_COLUMNS)


def check_interrupted(setup: RunSetup, plan: RunPlan) -> list[str]:
    """What a failed attempt must not leave: a sink commit the coordinator does not know (or
    the reverse), duplicated or wrong rows, a completed checkpoint that would not restore. It
    may leave rows missing, transactions pre-committed and staged data for the recovery."""
    verdict = verify(setup, None, plan)
    problems = [p for p in verdict.orphaned if "still PRECOMMITTED" not in p]
    problems += verdict.double_committed + verdict.broken
    for sink_id, rows in verdict.rows.items():
        if rows.duplicated or rows.wrong or rows.unexpected:
            problems.append(f"sink {sink_id} after the failed attempt: {rows.examples[:3]}")
    return problems


# ------------------------------------------------------------------------------ the scenarios


def _plan(index: int, name: str, faults: Sequence[FaultSpec] = (), **config: Any) -> RunPlan:

    plan = RunPlan.single(index, [tuple(faults)], **config)
    return dataclasses.replace(plan, purpose=f"external {name}")


def _progress(setup: RunSetup) -> tuple[int, int]:
    """(completed checkpoints, committed transactions) of a run so far."""
    found: list[int] = []

    def count(coordinator: Any) -> None:
        found.append(sum(1 for c in coordinator.checkpoints() if c.is_completed))
        found.append(sum(1 for _t, state in coordinator.transactions() if state == "COMMITTED"))

    _coordinator_call(setup, count)
    return found[0], found[1]


def disk_full_scenario(index: int, disk: Path, target: str) -> Scenario:
    """Attempt 1 runs with ``target`` (checkpoint storage or the Parquet sink) on a tiny disk
    and must fail with a real ENOSPC, cleanly; then the disk grows and the recovery runs."""

    def after_first(setup: RunSetup, outcome: AttemptOutcome) -> list[str]:
        problems = []
        if ENOSPC_TEXT not in f"{outcome.error}":
            problems.append(f"attempt 1 did not fail with ENOSPC: {outcome.error}")
        completed, committed = _progress(setup)
        if completed < 1 or (target == "sink" and committed < 1):
            problems.append(
                f"the disk filled too early ({completed} checkpoints completed, {committed} "
                "transactions committed): make it larger"
            )
        problems += check_interrupted(setup, plan)
        resize_tmpfs(disk, DISK_GROWN_SIZE)
        return problems

    name = f"disk-full ({target})"
    plan = _plan(index, name, checkpoint_interval_s=0.0, fake=FakeData(8).to_dict())
    return Scenario(name, plan, first=("failed",), after_first=after_first)


@contextlib.contextmanager
def on_full_disk(
    env: Environment, scenario: Scenario, disk: Path, target: str
) -> Iterator[RunSetup]:
    """The scenario's setup with ``target`` on a tmpfs at ``disk`` (unmounted on exit)."""
    setup = env.setup(scenario.plan)
    with tmpfs(disk, DISK_FULL_SIZES[target]):
        if target == "checkpoints":
            yield dataclasses.replace(setup, storage_root=str(disk))
        else:
            yield dataclasses.replace(setup, parquet_dir=str(disk))


def store_restart_scenario(index: int, server: PrivatePostgres) -> Scenario:
    """The server restarts (crash + recovery) while attempt 1 holds the completing transition
    of a checkpoint open (stalled before writing ``_metadata``): the transaction is lost with
    the connection, the attempt fails, the recovery retries."""
    stall = FaultSpec("metadata-before-write", Action.DELAY, stage="agg", delay_s=WINDOW_S)
    plan = _plan(index, "store-restart", [stall], checkpoint_interval_s=0.0)
    return Scenario(
        "store-restart",
        plan,
        first=("failed",),
        watch=Watch("metadata-before-write", lambda _setup: server.restart("immediate")),
        after_first=lambda setup, _outcome: check_interrupted(setup, plan),
    )


@dataclass(frozen=True)
class PartitionCase:
    """The network to the store is cut for ``seconds`` while attempt 1 stalls at ``point``."""

    point: str
    stage: str
    seconds: float
    #: what the attempt was doing when the link went down
    during: str

    @property
    def name(self) -> str:
        return f"store-partition {self.seconds:g}s during {self.during}"


#: The seeded sample (CI): every moment with a cut shorter than the call bounds (the calls wait
#: and carry on), and a completion cut past them (the attempt fails; the server must release
#: the pipeline's row lock). ``--partition-seconds`` (campaign) sets every cut's length instead.
PARTITION_CASES = (
    PartitionCase("before-ack", "agg", 5.0, "a batch record"),
    PartitionCase("metadata-before-write", "agg", 5.0, "a checkpoint's completion"),
    PartitionCase("before-commit", "publish", 5.0, "a sink commit"),
    PartitionCase("before-close", "publish", 5.0, "a close"),
    PartitionCase("metadata-before-write", "agg", 45.0, "a checkpoint's completion"),
)


def store_partition_scenario(
    index: int, server: PartitionedPostgres, case: PartitionCase
) -> Scenario:
    """Attempt 1 stalls at ``case.point``; the link to the store (coordination and SQL sink)
    goes down for ``case.seconds``. The attempt either carries on once the link is back or
    fails within the connection's bounds (``store.engine.PG_NETWORK_DEFAULTS``); the recovery
    starts after the link is back and must finish exactly once."""
    stall = FaultSpec(case.point, Action.DELAY, stage=case.stage, delay_s=WINDOW_S)
    plan = _plan(index, case.name, [stall], checkpoint_interval_s=0.0)

    def cut(_setup: RunSetup) -> None:
        server.cut(case.seconds)

    def after_first(setup: RunSetup, _outcome: AttemptOutcome) -> list[str]:
        server.wait_restored(case.seconds + 60)
        return []

    return Scenario(
        case.name,
        plan,
        first=("failed", "completed"),
        watch=Watch(case.point, cut),
        after_first=after_first,
    )


@dataclass(frozen=True)
class StopCase:
    """A stop requested while ``stage`` stalls after its 2nd batch, then ``fault`` (if any);
    after attempt 1 the stop must be in ``stop_state`` and ``stage`` in ``lifecycle`` (so the
    fault fired where the case says)."""

    mode: StopMode
    stage: str
    fault: FaultSpec | None
    stop_state: StopState
    lifecycle: StageLifecycle
    what: str

    @property
    def name(self) -> str:
        fault = self.fault.describe() if self.fault else "no fault"
        return f"stop-{self.mode.value} in {self.stage}: {fault}"


def _f(point: str, action: Action, stage: str, nth: int = 1) -> FaultSpec:
    return FaultSpec(point, action, stage=stage, nth=nth)


_SP, _DRAIN = StopMode.SAVEPOINT, StopMode.DRAIN
_REQUESTED, _COMPLETED = StopState.REQUESTED, StopState.COMPLETED
_RUNNING, _SUSPENDED, _FINISHED = (
    StageLifecycle.RUNNING,
    StageLifecycle.SUSPENDED,
    StageLifecycle.FINISHED,
)
_CRASH, _RAISE = Action.CRASH, Action.RAISE

#: Batch size 1 and no periodic checkpoints, so hit numbers are exact: the stop stage records
#: batches 1 and 2, stalls, sees the stop at the next boundary. In a savepoint stop its 3rd
#: ``before-ack`` is the savepoint's acknowledgement and its 1st completion the savepoint's.
STOP_CASES = (
    StopCase(_SP, "publish", None, _COMPLETED, _SUSPENDED, "fault-free: suspend, resume"),
    StopCase(
        _SP,
        "publish",
        _f("before-ack", _CRASH, "publish", 3),
        _REQUESTED,
        _RUNNING,
        "crash while the stage acknowledges the savepoint",
    ),
    StopCase(
        _SP,
        "publish",
        _f("after-checkpoint-complete", _CRASH, "publish"),
        _COMPLETED,
        _RUNNING,
        "crash after the savepoint completed, before the stage suspended",
    ),
    StopCase(
        _SP,
        "agg",
        _f("after-checkpoint-complete", _RAISE, "agg"),
        _COMPLETED,
        _RUNNING,
        "exception after the savepoint completed, before the stage suspended",
    ),
    StopCase(_DRAIN, "gen", None, _COMPLETED, StageLifecycle.CLOSED, "fault-free drain"),
    StopCase(
        _DRAIN,
        "gen",
        _f("after-finish", _CRASH, "gen"),
        _REQUESTED,
        _FINISHED,
        "crash after the drained source finished, before it closed",
    ),
    StopCase(
        _DRAIN,
        "gen",
        _f("after-checkpoint-complete", _CRASH, "publish"),
        _COMPLETED,
        _FINISHED,
        "crash after the drained savepoint completed, before its transactions committed",
    ),
)


def stop_scenario(index: int, case: StopCase) -> Scenario:
    """Stop requested from another process while ``case.stage`` stalls after batch 2."""
    stall = _f("after-record-batch", Action.DELAY, case.stage, 2)
    stall = dataclasses.replace(stall, delay_s=WINDOW_S)
    faults = [stall] if case.fault is None else [stall, case.fault]
    plan = _plan(
        index,
        case.name,
        faults,
        checkpoint_interval_s=3600.0,
        fake=FakeData(splits=6).to_dict(),
    )

    def request(setup: RunSetup) -> None:
        _coordinator_call(setup, lambda c: c.request_stop(case.mode, "faults.external"))

    def after_first(setup: RunSetup, _outcome: AttemptOutcome) -> list[str]:
        found: list[Any] = []
        faulted = case.fault.stage if case.fault else case.stage
        _coordinator_call(
            setup, lambda c: found.extend((c.stop_request(), c.stage(faulted).lifecycle))
        )
        stop, lifecycle = found
        state = stop.state if stop else None
        if state is case.stop_state and lifecycle is case.lifecycle:
            return []
        return [
            f"after attempt 1 the stop is {state} and stage {faulted} {lifecycle}, expected "
            f"{case.stop_state.value} and {case.lifecycle.value} ({case.what})"
        ]

    if case.fault is None:
        first: tuple[str, ...] = ("suspended",) if case.mode is _SP else ("completed",)
    else:
        first = ("crashed",) if case.fault.action is _CRASH else ("failed",)
    return Scenario(
        case.name,
        plan,
        first=first,
        watch=Watch("after-record-batch", request),
        after_first=after_first,
        # a drain stops the source after its 2 batches (one split each): only they are output
        splits=2 if case.mode is _DRAIN else None,
    )


def _disk_full_run(env: Environment, index: int, target: str, worker: AttemptRunner) -> RunReport:
    disk = env.workdir / f"disk-{index}"
    scenario = disk_full_scenario(index, disk, target)
    with on_full_disk(env, scenario, disk, target) as setup:
        return execute_scenario(env, scenario, worker, setup=setup)


def _on_private_store(
    env: Environment,
    subdir: str,
    server: PrivatePostgres,
    scenario: Scenario,
    worker: AttemptRunner,
) -> RunReport:
    """Run ``scenario`` with ``server`` (a private cluster) as its store and SQL sink."""
    pg_env = Environment(env.workdir / subdir, store="postgres", pg_admin_url=server.admin_url)
    pg_env.prepare(spark=False)
    try:
        return execute_scenario(pg_env, scenario, worker)
    finally:
        pg_env.cleanup()


def _store_restart_run(
    env: Environment, index: int, worker: AttemptRunner, bindir: Path
) -> RunReport:
    with PrivatePostgres(bindir) as server:
        scenario = store_restart_scenario(index, server)
        return _on_private_store(env, "store-restart", server, scenario, worker)


Planned = tuple[str, "str | None", Callable[[int], RunReport]]


def _planned(
    env: Environment, wanted: set[str], worker: AttemptRunner, bindir: Path
) -> list[Planned]:
    """The runs the names ask for: (name, why it cannot run here or None, the run)."""
    runs: list[Planned] = []
    if "disk-full" in wanted:
        reason = mount_unavailable()
        for target in DISK_FULL_SIZES:
            disk_run = partial(_disk_full_run, env, target=target, worker=worker)
            runs.append((f"disk-full ({target})", reason, disk_run))
    if "store-restart" in wanted:
        store = partial(_store_restart_run, env, worker=worker, bindir=bindir)
        runs.append(("store-restart", postgres_unavailable(bindir), store))
    if "store-partition" in wanted:
        reason = partition_unavailable(bindir)
        for case in PARTITION_CASES:
            cut = partial(_store_partition_run, env, case=case, worker=worker, bindir=bindir)
            runs.append((case.name, reason, cut))
    for stop_case in STOP_CASES:
        if f"stop-{stop_case.mode.value}" in wanted:
            stop = partial(_stop_run, env, case=stop_case, worker=worker)
            runs.append((stop_case.name, None, stop))
    return runs


def run_external(
    env: Environment,
    names: Sequence[str],
    worker: AttemptRunner,
    *,
    first_index: int = 0,
    bindir: Path = PG_BIN,
) -> list[RunReport]:
    """Run the named scenarios (``disk-full``, ``store-restart``, ``store-partition``,
    ``stop-savepoint``, ``stop-drain``, ``stop`` = both stops, ``all``). One that cannot run
    here, or whose harness fails, is reported as a run with an error saying why."""

    reports = []
    planned = _planned(env, expand_names(names), worker, bindir)
    for index, (name, reason, run) in enumerate(planned, start=first_index):
        if reason is not None:
            reports.append(RunReport(_plan(index, name), error=f"{name} not run: {reason}"))
            continue
        try:
            reports.append(run(index))
        except Exception as exc:  # a harness failure must not hide the other scenarios
            error = f"{name}: {type(exc).__name__}: {exc}"
            reports.append(RunReport(_plan(index, name), error=error))
    return reports


def _store_partition_run(
    env: Environment, index: int, case: PartitionCase, worker: AttemptRunner, bindir: Path
) -> RunReport:
    with PartitionedPostgres(bindir) as server:
        scenario = store_partition_scenario(index, server, case)
        report = _on_private_store(env, f"store-partition-{index}", server, scenario, worker)
    if server.cuts and server.cuts[-1][1] is not None and report.attempts:
        end = server.cuts[-1][1]
        report.recovery_after_fault_s = round(max(0.0, report.ended_at - end), 2)
    return report


def _stop_run(env: Environment, index: int, case: StopCase, worker: AttemptRunner) -> RunReport:
    return execute_scenario(env, stop_scenario(index, case), worker)


def expand_names(names: Sequence[str]) -> set[str]:
    wanted: set[str] = set()
    for name in names:
        if name == "all":
            wanted.update(NAMES)
        elif name == "stop":
            wanted.update(STOP_NAMES)
        elif name in NAMES:
            wanted.add(name)
        else:
            raise ValueError(
                f"unknown external fault {name!r}; known: {', '.join((*NAMES, 'stop', 'all'))}"
            )
    return wanted
