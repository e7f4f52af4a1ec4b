"""The acceptance campaign of issue 30: scheduled runs over an Iceberg table, a Delta table and
a landing directory that a writer appends to between and during runs, with real SIGKILLs of the
process running the attempt (in the source stage, in the commit, between the commit and the
cursor's advance, after it, and at a random time), each killed run retried in a new process
until it completes; then every sink must hold each input row exactly once, checked against
duckdb over the raw inputs (and the writer's own log).

    python -m tests.integration.incremental_acceptance --runs 10 --seed 30

The plan (what the writer appends before each run, where each attempt asks for an append while
it runs, where it dies) is drawn from ``--seed`` and printed, so a failure can be replayed
with the same seed (timer kills land where the clock says, the rest at the same points).
Each attempt is a fork of a preloaded fork server (``incremental_attempt``): no Spark.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.integration.incremental_attempt import (
    ICEBERG_TABLE,
    IN_CLOSE,
    KINDS,
    AttemptJob,
    attempt_main,
    make_sink,
    source_dir,
    store_url,
)

#: Where an attempt dies, by what the protocol is doing there.
KILL_POINTS: dict[str, tuple[str, ...]] = {
    "source": (
        "read:claim",  # nothing recorded
        "read:claimed",  # the range is recorded OPEN, nothing read
        "read:before-batch",
        "read:mid-batch",  # a batch read, not recorded
        "read:after-record-batch",
        "read:after-finish",  # the source finished, its final checkpoint not closed
        "read:before-close",
        "read:after-close",
    ),
    "commit": ("publish:before-commit", "publish:mid-commit"),
    # every sink transaction committed, the cursor not advanced (before the closing
    # transaction, and inside it after the advance was written)
    "between": ("publish:before-close", IN_CLOSE),
    "after": ("publish:after-close",),  # the cursor advanced; the retry must do nothing
    "timer": ("timer",),  # the parent kills the attempt after a random delay
}
CATEGORIES = tuple(KILL_POINTS)
#: Points at which a running attempt asks the writer to append (a commit during the run).
APPEND_POINTS = ("read:claim", "read:claimed", "read:before-batch", "publish:before-commit")
#: What else the Delta writer does between runs (no new rows).
CHURN = ("compact", "purge")
ATTEMPT_TIMEOUT_S = 120.0
MAX_ATTEMPTS = 6


@dataclass(frozen=True)
class Kill:
    where: str
    nth: int = 1
    delay_s: float = 0.0

    def __str__(self) -> str:
        if self.where == "timer":
            return f"timer@{self.delay_s:.2f}s"
        return self.where if self.nth == 1 else f"{self.where}#{self.nth}"


@dataclass(frozen=True)
class RunPlan:
    kind: str
    index: int
    appends_before: int
    #: per attempt: (where it asks for an append or None, where it dies or None)
    attempts: tuple[tuple[str | None, Kill | None], ...]
    #: Delta only: the writer compacts the table or purges old rows before the run (the
    #: change data feed tells the purge from an overwrite: passed over, docs/sources.md)
    churn: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}-run-{self.index:02d}"


@dataclass
class Report:
    seed: int
    runs: int
    lines: list[str] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)


def plan_runs(seed: int, runs: int) -> list[RunPlan]:
    """The seeded plan: per source, ``runs`` runs; kill categories rotate from a random start
    so a series of 5 runs kills in every category."""
    rng = random.Random(seed)
    plans: list[RunPlan] = []
    for kind in KINDS:
        offset = rng.randrange(len(CATEGORIES))
        for index in range(runs):
            attempts: list[tuple[str | None, Kill | None]] = []
            for number in range(2):
                append_at = rng.choice(APPEND_POINTS) if rng.random() < 0.5 else None
                if number == 0:
                    category = CATEGORIES[(offset + index) % len(CATEGORIES)]
                elif rng.random() < 0.35:  # a second kill, during the recovery
                    category = rng.choice(CATEGORIES)
                else:
                    attempts.append((append_at, None))
                    break
                where = rng.choice(KILL_POINTS[category])
                # the second batch or commit, where there is one (a range of one file has one)
                nth = 2 if where.endswith(("batch", "commit")) and rng.random() < 0.3 else 1
                attempts.append((append_at, Kill(where, nth, round(rng.uniform(0.02, 0.6), 2))))
            churn = (*CHURN, None)[index % 3] if kind == "delta" else None
            plans.append(RunPlan(kind, index, rng.randint(0, 2), tuple(attempts), churn))
    return plans


def category_of(kill: Kill) -> str:
    return next(c for c, points in KILL_POINTS.items() if kill.where in points)


# ------------------------------------------------------------------------------ the writer


@dataclass
class Writer:
    """Appends files of 3 rows (``value = 7 * id % 1000``) to every source, never killed; its
    log of appended ids is checked against the tables at the end."""

    root: str
    next_id: dict[str, int] = field(default_factory=dict)
    written: dict[str, list[int]] = field(default_factory=dict)

    def setup(self) -> None:
        for kind in KINDS:
            Path(source_dir(self.root, kind)).mkdir(parents=True)
            self.next_id[kind] = 0
            self.written[kind] = []
        catalog = self.catalog()
        catalog.create_namespace(ICEBERG_TABLE.split(".")[0])
        catalog.create_table(ICEBERG_TABLE, schema=self._rows(0).schema)

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        where = source_dir(self.root, "iceberg")
        return load_catalog(
            "finalckpt", type="sql", uri=f"sqlite:///{where}/catalog.db", warehouse=where
        )

    @staticmethod
    def _rows(first: int) -> pa.Table:
        ids = list(range(first, first + 3))
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "value": pa.array([7 * i % 1000 for i in ids], pa.int64()),
            }
        )

    def append(self, kind: str) -> None:
        """One snapshot, version or landing file."""
        first = self.next_id[kind]
        table = self._rows(first)
        where = source_dir(self.root, kind)
        if kind == "iceberg":
            self.catalog().load_table(ICEBERG_TABLE).append(table)
        elif kind == "delta":
            from deltalake import write_deltalake

            cdf = {"delta.enableChangeDataFeed": "true"}
            write_deltalake(where, table, mode="append", configuration=cdf)
        else:
            import pyarrow.parquet as pq

            hidden = Path(where) / f".{first:08d}.tmp"
            pq.write_table(table, hidden)
            hidden.rename(Path(where) / f"{first:08d}.parquet")
        self.next_id[kind] = first + 3
        self.written[kind].extend(range(first, first + 3))

    def churn(self, what: str) -> None:
        """Delta: compact the table, or delete its oldest rows (rows read or not yet)."""
        from deltalake import DeltaTable

        where = source_dir(self.root, "delta")
        if DeltaTable.is_deltatable(where):
            if what == "compact":
                DeltaTable(where).optimize.compact()
            else:
                DeltaTable(where).delete(f"id < {max(0, self.next_id['delta'] - 4)}")


# ------------------------------------------------------------------------------ attempts

_context: Any = None
#: What every attempt imports (pyiceberg's SQL catalog alone takes a second or more).
PRELOAD = (
    "pandas",
    "pyarrow.parquet",
    "sqlalchemy",
    "pyiceberg.catalog.sql",
    "pyiceberg.table",
    "deltalake",
    "tests.integration.incremental_attempt",
)


def process_context() -> Any:
    """One fork server per campaign process, with the attempt's imports preloaded."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(list(PRELOAD))
    return _context


def run_attempt(job: AttemptJob, kill: Kill | None, writer: Writer, log_path: str) -> str:
    """Start the attempt, serve its append requests, kill it on a timer if planned; returns
    ``completed``, ``killed`` (SIGKILL, by itself or the timer) or raises with its log tail."""
    context = process_context()
    parent, child = context.Pipe()
    process = context.Process(target=attempt_main, args=(job, child, log_path), daemon=True)
    started = time.monotonic()
    process.start()
    child.close()
    done = False
    while process.is_alive() or parent.poll(0):
        elapsed = time.monotonic() - started
        if kill is not None and kill.where == "timer" and elapsed >= kill.delay_s:
            os.kill(process.pid, signal.SIGKILL)
            break
        if elapsed > ATTEMPT_TIMEOUT_S:
            os.kill(process.pid, signal.SIGKILL)
            raise AssertionError(f"{job.run_key}: attempt hung\n{_tail(log_path)}")
        try:
            if not parent.poll(0.02):
                continue
            message = parent.recv()
        except (EOFError, OSError):
            break
        if message[0] == "append":
            writer.append(job.kind)
            parent.send("ok")
        elif message[0] == "done":
            done = True
    process.join(30)
    parent.close()
    if process.exitcode == -signal.SIGKILL:
        return "killed"
    if process.exitcode == 0 and done:
        return "completed"
    raise AssertionError(
        f"{job.run_key}: attempt ended with exit code {process.exitcode}\n{_tail(log_path)}"
    )


def _tail(path: str, size: int = 4000) -> str:
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "replace")[-size:]


def execute(plan: RunPlan, root: str, writer: Writer, report: Report) -> None:
    """One scheduled run: its attempts until one completes (as Airflow retries a task)."""
    for _ in range(plan.appends_before):
        writer.append(plan.kind)
    if plan.churn is not None:
        writer.churn(plan.churn)
    outcomes: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        append_at, kill = plan.attempts[attempt] if attempt < len(plan.attempts) else (None, None)
        job = AttemptJob(
            kind=plan.kind,
            root=root,
            run_key=plan.key,
            logical_date=f"2026-01-01T00:{plan.index:02d}:00+00:00",
            kill_at=None if kill is None or kill.where == "timer" else kill.where,
            kill_nth=1 if kill is None else kill.nth,
            append_at=append_at,
        )
        status = run_attempt(job, kill, writer, f"{root}/logs/{plan.kind}.log")
        planned = "" if kill is None else f" (kill {kill})"
        outcomes.append(f"{status}{planned}{'' if append_at is None else f' +append@{append_at}'}")
        if status == "killed":
            assert kill is not None, f"{plan.key}: killed without a planned kill"
            category = category_of(kill)
            report.kills[category] = report.kills.get(category, 0) + 1
        if status == "completed":
            churn = "" if plan.churn is None else f", then {plan.churn}"
            before = f"appended {plan.appends_before} before{churn}"
            report.say(f"{plan.key}: {before}; " + "; ".join(outcomes))
            return
    raise AssertionError(f"{plan.key}: no attempt completed in {MAX_ATTEMPTS}: {outcomes}")


# ------------------------------------------------------------------------------ the check


def expected_rows(root: str, kind: str) -> pa.Table:
    """The raw input as its own reader sees it (not through the incremental sources)."""
    where = source_dir(root, kind)
    if kind == "iceberg":
        return Writer(root).catalog().load_table(ICEBERG_TABLE).scan().to_arrow()
    if kind == "delta":  # every row ever appended: the inserts of its change data feed
        import duckdb
        from deltalake import DeltaTable

        feed = pa.table(DeltaTable(where).load_cdf(starting_version=0))
        with duckdb.connect() as con:
            con.register("feed", feed)
            query = "select id, value from feed where _change_type = 'insert'"
            return pa.Table.from_pandas(con.execute(query).fetchdf(), preserve_index=False)
    import duckdb

    with duckdb.connect() as con:
        query = f"select id, value from read_parquet('{where}/*.parquet')"
        return pa.Table.from_pandas(con.execute(query).fetchdf(), preserve_index=False)


def check(root: str, kind: str, keys: Sequence[str], writer: Writer) -> list[str]:
    """What is wrong with one source's sink: rows lost, duplicated or not in the input, ranges
    left open or read twice. Empty: every input row published exactly once."""
    import duckdb

    from airflow_finalckpt.core.source_cursor import RangeState
    from airflow_finalckpt.store.cursors import ranges_of_pipeline
    from airflow_finalckpt.store.engine import make_engine

    expected = expected_rows(root, kind)
    out = pa.Table.from_pandas(make_sink(kind, root).read_pandas(), preserve_index=False)
    problems: list[str] = []
    con = duckdb.connect()
    con.register("expected", expected)
    con.register("out", out)
    wrong = con.execute(
        "with e as (select id, value, count(*) n from expected group by all), "
        "o as (select id, value, count(*) n from out group by all) "
        "select coalesce(e.id, o.id) id, coalesce(e.n, 0) want, coalesce(o.n, 0) got "
        "from e full join o using (id, value) "
        "where e.n is distinct from 1 or o.n is distinct from e.n order by id"
    ).fetchall()
    for row_id, want, got in wrong[:10]:
        problems.append(f"{kind}: id {row_id}: {want} in the input, {got} in the sink")
    if len(wrong) > 10:
        problems.append(f"{kind}: ... {len(wrong)} rows wrong in all")
    ids = sorted(r[0] for r in con.execute("select id from expected").fetchall())
    con.close()
    if ids != sorted(writer.written[kind]):
        problems.append(
            f"{kind}: the input has {len(ids)} ids, the writer wrote {len(writer.written[kind])}"
        )
    engine = make_engine(store_url(root))
    seen: set[str] = set()
    for key in keys:
        for record in ranges_of_pipeline(engine, key):
            if record.state is not RangeState.COMMITTED:
                problems.append(f"{kind}: {key}'s range is {record.state.value}")
            twice = seen & set(record.range.splits)
            if twice:
                problems.append(f"{kind}: {key} read {sorted(twice)[:3]} again")
            seen |= set(record.range.splits)
    engine.dispose()
    return problems


def campaign(seed: int, runs: int, root: str) -> Report:
    """``runs`` scheduled runs per source (then one clean run that reads what the last one
    left), every check; ``report.problems`` empty when exactly once held everywhere."""
    started = time.monotonic()
    report = Report(seed=seed, runs=runs)
    report.say(
        f"incremental acceptance: seed {seed}, {runs} runs per source "
        f"(replay: python -m tests.integration.incremental_acceptance --runs {runs} --seed {seed})"
    )
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    Path(root, "logs").mkdir(parents=True)
    engine = make_engine(store_url(root))
    ensure_schema(engine)
    engine.dispose()
    writer = Writer(root)
    writer.setup()
    plans = plan_runs(seed, runs)
    for plan in plans:
        execute(plan, root, writer, report)
    for kind in KINDS:
        final = RunPlan(kind, runs, 0, ((None, None),))
        execute(final, root, writer, report)
        keys = [p.key for p in plans if p.kind == kind] + [final.key]
        problems = check(root, kind, keys, writer)
        report.problems += problems
        rows = len(writer.written[kind])
        report.say(f"{kind}: {rows} rows written, each published once: {not problems}")
    report.seconds = time.monotonic() - started
    kills = ", ".join(f"{c} {report.kills.get(c, 0)}" for c in CATEGORIES)
    report.say(
        f"incremental acceptance: seed {seed}, {len(plans)} runs, SIGKILLs: {kills}; "
        f"{len(report.problems)} problem(s) in {report.seconds:.1f} s"
    )
    for problem in report.problems:
        report.say(f"  PROBLEM {problem}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="scheduled runs per source")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--root", default=None, help="work directory (default: a new temp one)")
    args = parser.parse_args(argv)
    seed = random.randrange(1_000_000) if args.seed is None else args.seed
    import tempfile

    root = args.root or tempfile.mkdtemp(prefix="finalckpt-incremental-")
    report = campaign(seed, args.runs, root)
    print(f"work directory: {root}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
