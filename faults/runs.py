"""One run of a fault campaign: its plan, the environment all runs share, its execution
attempt by attempt and its report. A leaf under the campaign, the external scenarios and the
concurrent runs, which all build on it (none of them imports the campaign)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from faults.fake import FAKE_STAGES, FakeData
from faults.injector import FaultSpec, read_events
from faults.points import FAILING_ACTIONS, Action
from faults.verify import Verdict
from faults.worker import (
    CONCURRENT,
    DEFAULT_SINKS,
    FAKE,
    SPARK,
    TABLE_SINKS,
    AttemptJob,
    AttemptOutcome,
    RunSetup,
)

if TYPE_CHECKING:
    import pandas

SPARK_STAGES = ("ingest", "enrich", "delay_windows", "publish")
DEFAULT_SPARK_DAYS = 2
DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: Clean attempts after the planned faults before a run counts as unrecovered.
CLEAN_RETRIES = 3
FAKE_ATTEMPT_TIMEOUT_S = 180.0
#: What a finished stage's attempt says when it gave up waiting for its final checkpoint.
CLOSE_WAIT = "did not reach its final checkpoint"
SPARK_ATTEMPT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class RunPlan:
    index: int
    kind: str
    purpose: str
    #: Armed faults per attempt (attempt 1 first); attempts beyond run clean.
    attempts: tuple[tuple[FaultSpec, ...], ...]
    #: Per attempt: SIGKILL the worker after this many seconds (external fault), or None.
    kills: tuple[float | None, ...]
    batch_sizes: dict[str, int | str]
    commit_mode: str
    checkpoint_interval_s: float
    retain_checkpoints: int
    checkpoint_timeout_s: float
    fake: dict[str, int] | None = None
    #: Concurrent runs: the graph shape (faults.shapes.SHAPES) and the stage ``kills`` apply to.
    shape: str | None = None
    kill_stage: str | None = None
    #: Scenario runs (``faults.scenarios``): the scenario's name, the stages that fail on every
    #: try (they get ``len(attempts)`` tries, no clean ones), the attempts' lease, and how a
    #: second DAG run on the same pipeline key starts (``"refused"`` or ``"take-over"``).
    scenario: str | None = None
    doomed: tuple[str, ...] = ()
    attempt_lease_s: float = 60.0
    second_run: str | None = None

    @property
    def run_id(self) -> str:
        return f"r{self.index:04d}"

    @classmethod
    def single(
        cls,
        index: int,
        attempts: Sequence[Sequence[FaultSpec]] = (),
        *,
        kind: str = FAKE,
        kills: Sequence[float | None] = (),
        **config: Any,
    ) -> RunPlan:
        """A hand-written plan (tests, reproductions): fixed faults, default configuration."""
        defaults: dict[str, Any] = {
            "batch_sizes": dict.fromkeys(SPARK_STAGES if kind == SPARK else FAKE_STAGES, 1),
            "commit_mode": "progressive",
            "checkpoint_interval_s": 0.0,
            "retain_checkpoints": 2,
            "checkpoint_timeout_s": 600.0,
            "fake": FakeData(splits=6).to_dict() if kind == FAKE else None,
        }
        defaults.update(config)
        padded = list(kills) + [None] * (len(attempts) - len(kills))
        return cls(
            index=index,
            kind=kind,
            purpose="hand-written",
            attempts=tuple(tuple(a) for a in attempts),
            kills=tuple(padded),
            **defaults,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["attempts"] = [[s.to_dict() for s in specs] for specs in self.attempts]
        data["run_id"] = self.run_id
        return data


@dataclass
class RunReport:
    plan: RunPlan
    attempts: list[AttemptOutcome] = field(default_factory=list)
    verdict: Verdict | None = None
    completed: bool = False
    unexpected: list[str] = field(default_factory=list)
    stale_commits: list[str] = field(default_factory=list)
    #: Known issues met by the attempts (see verify.KNOWN_ISSUES); the verdict has its own.
    known: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    #: Concurrent runs: the run outlived its timeout (or an attempt its own).
    hung: bool = False
    #: Concurrent runs: stages that closed on a later checkpoint while an earlier candidate was
    #: still pending (FLIP-147's "43 completes first"), and all closes past a failed candidate.
    out_of_order: int = 0
    late_closes: int = 0
    #: Scenario runs: a stage that closed later than the documented bound after its failing
    #: sibling ended; Asset events (publications) other than one per commit; attempts of two
    #: DAG runs that took the epoch from each other; the waiting branch's close latency (s).
    late: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    ping_pong: list[str] = field(default_factory=list)
    close_latency_s: float | None = None
    #: External runs: when the completing attempt ended (monotonic), and how long after the
    #: external fault ended (a cut network restored) that was.
    ended_at: float = 0.0
    recovery_after_fault_s: float | None = None

    @property
    def is_hung(self) -> bool:
        """The run, or one of its attempts, did not end within its bound: the run outlived its
        timeout, an attempt its own, or a finished stage gave up waiting for its final
        checkpoint (a wait nothing would have ended)."""
        return self.hung or any(
            a.status == "hung" or (a.error_type == "TimeoutError" and CLOSE_WAIT in (a.error or ""))
            for a in self.attempts
        )

    def known_issues(self) -> dict[str, list[str]]:
        merged = {k: list(v) for k, v in self.known.items()}
        for issue, details in (self.verdict.known if self.verdict else {}).items():
            merged.setdefault(issue, []).extend(details)
        return merged

    @property
    def fired(self) -> list[dict[str, Any]]:
        return [f for a in self.attempts for f in a.fired]

    @property
    def kills(self) -> int:
        return sum(1 for a in self.attempts if a.status == "killed")

    @property
    def faulted(self) -> bool:
        return bool(self.fired) or self.kills > 0

    def problems(self) -> list[str]:
        found = [] if self.verdict is None else self.verdict.problems()
        if self.is_hung:
            found.append("hung: the run or an attempt did not end within its timeout")
        found += [f"late: {x}" for x in self.late]
        found += [f"publication: {x}" for x in self.republished]
        found += [f"epoch ping-pong: {x}" for x in self.ping_pong]
        if not self.completed:
            found.append("the pipeline did not complete after its recovery attempts")
        found += [f"unexpected: {x}" for x in self.unexpected]
        found += [f"stale attempt committed: {x}" for x in self.stale_commits]
        if self.error:
            found.append(f"campaign error: {self.error}")
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "attempts": [asdict(a) for a in self.attempts],
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "completed": self.completed,
            "unexpected": self.unexpected,
            "stale_commits": self.stale_commits,
            "known_issues": self.known_issues(),
            "seconds": round(self.seconds, 2),
            "hung": self.is_hung,
            "late": self.late,
            "republished": self.republished,
            "ping_pong": self.ping_pong,
            "close_latency_s": self.close_latency_s,
            "recovery_after_fault_s": self.recovery_after_fault_s,
            "out_of_order": self.out_of_order,
            "late_closes": self.late_closes,
            "problems": self.problems(),
        }


@dataclass
class Environment:
    """What all runs share: the work directory, a migrated template store, the Spark inputs
    and the expected results."""

    workdir: Path
    store: str = "sqlite"
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL
    spark_days: int = DEFAULT_SPARK_DAYS
    gc_grace_s: float | None = 0.0
    #: The sink kinds of every run's last stage (see worker.SINK_KINDS).
    sinks: tuple[str, ...] = DEFAULT_SINKS
    template_db: Path | None = None
    pg_url: str | None = None
    input_dir: str | None = None
    _expected: dict[str, pandas.DataFrame] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self, *, spark: bool) -> None:
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.migrate import ensure_schema

        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.store == "postgres":
            self.pg_url = _create_pg_database(self.pg_admin_url)
            url = self.pg_url
        else:
            self.template_db = self.workdir / "template.db"
            url = f"sqlite:///{self.template_db}"
        engine = make_engine(url)
        try:
            ensure_schema(engine)
        finally:
            engine.dispose()
        if spark:
            from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs

            self.input_dir = str(self.workdir / "inputs")
            prepare_inputs(self.input_dir, days=first_days(self.spark_days))

    def cleanup(self) -> None:
        if self.pg_url is not None:
            _drop_pg_database(self.pg_admin_url, self.pg_url)
            self.pg_url = None

    def expected(self, plan: RunPlan) -> pandas.DataFrame:
        import pandas as pd

        key = json.dumps(plan.fake, sort_keys=True) if plan.kind == FAKE else SPARK
        if plan.kind == CONCURRENT:
            key = f"{CONCURRENT}:{plan.shape}:{','.join(plan.doomed)}"
        with self._lock:
            if key not in self._expected:
                if plan.kind == CONCURRENT:
                    from faults.shapes import SHAPES, reference_rows

                    assert plan.shape is not None
                    rows = reference_rows(SHAPES[plan.shape], failed=plan.doomed)
                    self._expected[key] = pd.DataFrame(rows)
                elif plan.kind == FAKE:
                    from faults.fake import reference_windows

                    data = FakeData(**(plan.fake or {}))
                    self._expected[key] = pd.DataFrame(reference_windows(data))
                else:
                    from airflow_finalckpt.examples.nycflights13.data import first_days
                    from airflow_finalckpt.examples.nycflights13.reference import (
                        reference_pipeline,
                    )

                    days = first_days(self.spark_days)
                    self._expected[key] = reference_pipeline(days).windows
            return self._expected[key]

    def setup(self, plan: RunPlan) -> RunSetup:
        """The run's setup; its store is created (from the template) on the first call only."""
        run_dir = self.workdir / plan.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.pg_url is not None:
            store_url = sql_url = self.pg_url
        else:
            assert self.template_db is not None
            store = run_dir / "store.db"
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.template_db}{suffix}")
                if source.exists() and not store.exists():
                    shutil.copyfile(source, f"{store}{suffix}")
            store_url = f"sqlite:///{store}"
            sql_url = f"sqlite:///{run_dir / 'sink.db'}"
        return RunSetup(
            kind=plan.kind,
            run_id=plan.run_id,
            store_url=store_url,
            pipeline_key=f"faults.{plan.run_id}",
            storage_root=str(run_dir / "checkpoints"),
            parquet_dir=str(run_dir / "out_parquet"),
            sql_url=sql_url,
            sql_table=f"out_{plan.run_id}",
            sink_ids=tuple(f"{kind}_{plan.run_id}" for kind in self.sinks),
            sinks=self.sinks,
            iceberg_warehouse=str(run_dir / "iceberg") if "iceberg" in self.sinks else None,
            delta_dir=str(run_dir / "out_delta") if "delta" in self.sinks else None,
            batch_sizes=plan.batch_sizes,
            commit_mode=plan.commit_mode,
            checkpoint_interval_s=plan.checkpoint_interval_s,
            retain_checkpoints=plan.retain_checkpoints,
            checkpoint_timeout_s=plan.checkpoint_timeout_s,
            events_path=str(run_dir / "events.jsonl"),
            log_path=str(run_dir / "pipeline.log"),
            gc_grace_s=self.gc_grace_s,
            fake=plan.fake,
            input_dir=self.input_dir,
            attempt_lease_s=plan.attempt_lease_s,
        )


def _create_pg_database(admin_url: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    admin = make_url(admin_url)
    name = f"finalckpt_faults_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return admin.set(database=name).render_as_string(hide_password=False)


def _drop_pg_database(admin_url: str, url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    name = make_url(url).database
    engine = create_engine(make_url(admin_url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


def _classify(outcome: AttemptOutcome, kill_planned: bool) -> tuple[str | None, str | None]:
    """(known issue id or None, description) of an attempt whose end its faults do not
    explain; (None, None) if they do."""
    actions = {Action(f["action"]) for f in outcome.fired}
    if outcome.status in ("completed", "suspended"):
        return None, None
    if outcome.status == "killed" and kill_planned:
        return None, None
    if outcome.status == "crashed" and Action.CRASH in actions:
        return None, None
    if outcome.status == "failed" and actions & (FAILING_ACTIONS - {Action.CRASH}):
        return None, None
    if outcome.status == "stale" and Action.ZOMBIE in actions:
        return None, None
    detail = f"{outcome.error_type}: {outcome.error}" if outcome.error_type else outcome.error
    fired = ", ".join(FaultSpec.from_dict(_spec_fields(f)).describe() for f in outcome.fired)
    description = (
        f"attempt {outcome.label} ended {outcome.status} (exit {outcome.exitcode})"
        f"{': ' + detail if detail else ''}; faults fired: {fired or 'none'}"
    )
    return None, description


def _spec_fields(event: dict[str, Any]) -> dict[str, Any]:
    fields = {k: event[k] for k in ("point", "action", "stage", "nth", "delay_s")}
    for optional in ("sink", "until"):
        if event.get(optional):
            fields[optional] = event[optional]
    return fields


def stale_commits(events: Sequence[dict[str, Any]]) -> list[str]:
    """Sink commits of a stage's transactions made by a stalled (zombie) attempt of that stage
    after its newer attempt started (transaction ids start with the stage id)."""
    started = {
        (e["label"], e["stage"]): e["t"] for e in events if e.get("event") == "successor-start"
    }
    found = []
    for event in events:
        if event.get("event") != "sink-commit" or not event.get("new"):
            continue
        stage = str(event["txn"]).split(".", 1)[0]
        since = started.get((event.get("label"), stage))
        if since is not None and event["t"] > since:
            found.append(
                f"{event['label']} committed {event['sink']}/{event['txn']} after a newer "
                f"attempt of stage {stage} took over"
            )
    return found


class AttemptRunner(Protocol):
    def run(
        self, job: AttemptJob, timeout_s: float, kill_after_s: float | None = None
    ) -> AttemptOutcome: ...


def verify_setup(env: Environment, plan: RunPlan, setup: RunSetup) -> Verdict:
    """Verify a run's sinks, coordinator and storage against its expected result."""
    from airflow_finalckpt.examples.nycflights13.reference import (
        APPROXIMATE_COLUMNS,
        WINDOW_KEY,
    )
    from faults.fake import KEY_COLUMNS

    spark = plan.kind == SPARK
    return verify_against(
        setup,
        env.expected(plan),
        WINDOW_KEY if spark else KEY_COLUMNS,
        approximate=APPROXIMATE_COLUMNS if spark else (),
    )


def verify_against(
    setup: RunSetup,
    expected: pandas.DataFrame,
    key_columns: Sequence[str],
    approximate: Sequence[str] = (),
) -> Verdict:
    """verify_run on the run's store, checkpoint storage and sinks against ``expected``."""
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.engine import make_engine
    from faults.verify import verify_run
    from faults.worker import dispose_sinks, make_sinks

    engine = make_engine(setup.store_url)
    sinks = make_sinks(setup)
    try:
        coordinator = Coordinator(engine, setup.pipeline_key)
        storage = CheckpointStorage(setup.storage_root)
        if set(setup.sinks) & set(TABLE_SINKS):
            # what `finalckpt gc` does; a table sink's leftovers are not its job: any staged
            # file the table does not reference after it counts as leaked
            from airflow_finalckpt.runtime.gc import collect_garbage

            collect_garbage(coordinator, storage, grace_s=0)
        return verify_run(
            coordinator,
            storage,
            sinks,
            expected,
            key_columns,
            approximate=approximate,
            sink_roots=[setup.parquet_dir, *setup.table_roots()],
        )
    finally:
        dispose_sinks(sinks)
        engine.dispose()


def execute_run(env: Environment, plan: RunPlan, worker: AttemptRunner) -> RunReport:
    """Run a plan's attempts until the pipeline completes, then verify the run."""
    start = time.monotonic()
    report = RunReport(plan)
    setup = env.setup(plan)
    timeout = SPARK_ATTEMPT_TIMEOUT_S if plan.kind == SPARK else FAKE_ATTEMPT_TIMEOUT_S
    for number in range(1, len(plan.attempts) + CLEAN_RETRIES + 1):
        specs = plan.attempts[number - 1] if number <= len(plan.attempts) else ()
        kill = plan.kills[number - 1] if number <= len(plan.kills) else None
        job = AttemptJob(setup, number, tuple(s.to_dict() for s in specs))
        outcome = worker.run(job, timeout, kill)
        events = read_events(setup.events_path)
        outcome.fired = [
            e for e in events if e.get("event") == "fault" and e.get("label") == job.label
        ]
        report.attempts.append(outcome)
        issue, problem = _classify(outcome, kill is not None)
        if issue is not None and problem is not None:
            report.known.setdefault(issue, []).append(problem)
        elif problem is not None:
            report.unexpected.append(problem)
        if outcome.status == "completed":
            report.completed = True
            break
    report.hung = any(a.status == "hung" for a in report.attempts)
    report.stale_commits = stale_commits(read_events(setup.events_path))
    report.verdict = verify_setup(env, plan, setup)
    report.seconds = time.monotonic() - start
    return report
