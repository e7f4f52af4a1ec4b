"""Coordinator scale (no Spark): cost of one checkpoint as the graph grows.

A graph of N stages is N/4 independent lanes ``ingest -> enrich -> windows -> publish`` (the
example pipeline's shape, many times over; the last lane may be shorter). The lanes are in the
FLIP-147 mix of states, cycling over four lane types::

    done      CLOSED   CLOSED    CLOSED       FINISHED     (waiting for its final checkpoint)
    late      CLOSED   CLOSED    CLOSED       RUNNING
    middle    CLOSED   FINISHED  NOT_STARTED  NOT_STARTED
    new       NOT_STARTED x 4

so 1/16 of the stages are running (half of their S splits finished) and acknowledge every
checkpoint, 9/16 are finished with all S splits, 6/16 have not started. (Airflow itself caps
concurrently running tasks per DAG, 16 by default: a running share of 1/16 of a 10,000-stage
graph, 625 concurrently running stages, is already a stress test.) Every finished or running
stage holds one output state handle
per 10 finished splits (as the runtime records them) and one pre-committed sink transaction.

That starting state is written directly into the store (``register`` through the API, then one
bulk UPDATE; setting 10,000 stages up through ``finish`` would itself trigger thousands of eager
checkpoints). What is measured is one complete checkpoint through the public API, exactly as the
runtime drives it: ``trigger`` (the plan), then one ``record_batch`` per running stage (each a
split-batch boundary that acknowledges, in its own transition, as separate stage processes
would), the last one completing the checkpoint and writing ``_metadata`` atomically to a
temporary ``CheckpointStorage``. Each case measures several consecutive checkpoints; the growth
exponent is the log-log slope of the median seconds per checkpoint over N at fixed S.
"""

from __future__ import annotations

import cProfile
import hashlib
import io
import pstats
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, bindparam, update

from benchmarks.common import (
    Result,
    Stopwatch,
    Target,
    log,
    loglog_slope,
    postgres_available,
    postgres_database,
)

NAME = "coordinator_scale"
LANE = ("ingest", "enrich", "windows", "publish")
LANE_TYPES = (
    ("CLOSED", "CLOSED", "CLOSED", "FINISHED"),
    ("CLOSED", "CLOSED", "CLOSED", "RUNNING"),
    ("CLOSED", "FINISHED", "NOT_STARTED", "NOT_STARTED"),
    ("NOT_STARTED", "NOT_STARTED", "NOT_STARTED", "NOT_STARTED"),
)
RUNNING_SHARE = "1/16"
SPLITS_PER_HANDLE = 10
#: A growth exponent above this is flagged: the cost per checkpoint must be about linear.
LINEAR_LIMIT = 1.3


@dataclass(frozen=True)
class Size:
    stages: int
    splits: int


def plan_sizes(quick: bool) -> dict[str, list[Size]]:
    """Series of graph sizes at fixed splits per stage (one growth exponent per series)."""
    if quick:
        return {"splits=10": [Size(10, 10), Size(40, 10)]}
    return {
        "splits=100": [Size(10, 100), Size(100, 100), Size(1000, 100), Size(10_000, 100)],
        "splits=1000": [Size(10, 1000), Size(100, 1000), Size(1000, 1000)],
    }


def stage_ids(n: int) -> list[str]:
    return [f"lane{i // 4:05d}_{LANE[i % 4]}" for i in range(n)]


def lifecycle_of(index: int) -> str:
    return LANE_TYPES[(index // 4) % len(LANE_TYPES)][index % 4]


def _graph(n: int) -> Any:
    from airflow_finalckpt.core.graph import StageGraph

    ids = stage_ids(n)
    edges = [(ids[i - 1], ids[i]) for i in range(n) if i % 4 != 0]
    return StageGraph.from_edges(ids, edges)


def _splits(stage_id: str, count: int) -> list[str]:
    return [f"data/{stage_id}/part-{k:05d}" for k in range(count)]


def _handles(stage_id: str, finished: int) -> list[dict[str, Any]]:
    out = []
    for k in range(0, finished, SPLITS_PER_HANDLE):
        path = f"data/{stage_id}/_parts/b{k // SPLITS_PER_HANDLE:05d}.json"
        out.append(
            {
                "name": f"output:data/{stage_id}/b{k // SPLITS_PER_HANDLE:05d}",
                "path": path,
                "size": 120,
                "sha256": hashlib.sha256(path.encode()).hexdigest(),
            }
        )
    return out


def seed_state(engine: Engine, pipeline_key: str, size: Size) -> list[str]:
    """Put every stage into its lane state in one bulk UPDATE; returns the running stages."""
    from airflow_finalckpt.core.model import MAX_WATERMARK, StageSnapshot
    from airflow_finalckpt.store import schema as t
    from airflow_finalckpt.store.rows import final_entry

    rows: list[dict[str, Any]] = []
    txns: list[dict[str, Any]] = []
    running: list[str] = []
    for index, sid in enumerate(stage_ids(size.stages)):
        lifecycle = lifecycle_of(index)
        if lifecycle == "NOT_STARTED":
            continue
        splits = _splits(sid, size.splits)
        finished = splits if lifecycle != "RUNNING" else splits[: size.splits // 2]
        handles = _handles(sid, len(finished))
        progress: dict[str, Any] = {
            "finished_splits": sorted(finished),
            "state": handles,
            "pending_transactions": [],
            "watermark": 1_370_000_000_000,
            "end_of_data": None,
        }
        row: dict[str, Any] = {
            "b_stage_id": sid,
            "lifecycle": lifecycle,
            "epoch": 1,
            "total_splits": size.splits,
            "progress": progress,
            "finish_threshold": None,
            "final_snapshot": None,
            "final_end": None,
            "final_entry": None,
            "closed_checkpoint_id": None,
        }
        if lifecycle in ("FINISHED", "CLOSED"):
            final = dict(
                progress,
                watermark=MAX_WATERMARK,
                end_of_data={
                    "drain": False,
                    "manifest": [h["name"][len("output:") :] for h in handles],
                    "watermark": MAX_WATERMARK,
                    "finished_at_checkpoint": 0,
                    "unread_splits": 0,
                },
            )
            # final_end: what finish() writes beside the final snapshot (store.rows.final_end)
            end = {"end_of_data": final["end_of_data"], "watermark": MAX_WATERMARK}
            row.update(
                progress=final,
                final_snapshot=final,
                final_end=dict(end, finished=len(finished)),
                # final_entry: the stage's metadata entry, encoded once at finish (rows.final_entry)
                final_entry=final_entry(StageSnapshot.model_validate(final)),
                finish_threshold=0,
            )
            if lifecycle == "CLOSED":
                row["closed_checkpoint_id"] = 0
        else:
            running.append(sid)
        rows.append(row)
        if lifecycle in ("FINISHED", "RUNNING"):
            txns.append(
                {
                    "pipeline_key": pipeline_key,
                    "stage_id": sid,
                    "sink_id": "out",
                    "txn_id": f"{sid}.seed.e1",
                    "epoch": 1,
                    "checkpoint_id": None,
                    "state": "PRECOMMITTED",
                    "payload": {"staging": f"_staging/{sid}/seed"},
                    "updated_at": 0.0,
                }
            )
    with engine.begin() as conn:
        if rows:
            conn.execute(
                update(t.stages)
                .where(
                    t.stages.c.pipeline_key == pipeline_key,
                    t.stages.c.stage_id == bindparam("b_stage_id"),
                )
                .values(
                    lifecycle=bindparam("lifecycle"),
                    epoch=bindparam("epoch"),
                    total_splits=bindparam("total_splits"),
                    progress=bindparam("progress"),
                    finish_threshold=bindparam("finish_threshold"),
                    final_snapshot=bindparam("final_snapshot"),
                    final_end=bindparam("final_end"),
                    final_entry=bindparam("final_entry"),
                    closed_checkpoint_id=bindparam("closed_checkpoint_id"),
                ),
                rows,
            )
        if txns:
            conn.execute(t.transactions.insert(), txns)
    settle(engine)
    return running


def settle(engine: Engine) -> None:
    """After the bulk seed, what a running store has done long before: SQLite checkpoints its
    WAL (else the first measured commit copies the whole seed, tens of MB, into the database
    and every read searches a huge WAL), PostgreSQL has table statistics (autovacuum's ANALYZE).
    """
    raw = engine.raw_connection()  # outside a transaction: neither may run inside one
    try:
        cursor = raw.cursor()
        if engine.dialect.name == "sqlite":
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            raw.commit()
            raw.driver_connection.autocommit = True  # type: ignore[union-attr]
            cursor.execute("ANALYZE")
            raw.driver_connection.autocommit = False  # type: ignore[union-attr]
        cursor.close()
    finally:
        raw.close()


@dataclass
class CheckpointCost:
    checkpoint_id: int
    trigger_s: float
    acks_s: float
    last_ack_s: float
    total_s: float
    acks: int
    metadata_bytes: int
    plan_bytes: int


def one_checkpoint(coordinator: Any, running: Sequence[str], round_no: int) -> CheckpointCost:
    """Trigger, acknowledge from every running stage at a batch boundary, complete."""
    import json

    from airflow_finalckpt.core.model import CheckpointState, SinkTransaction, TriggerReason

    with Stopwatch() as whole:
        with Stopwatch() as trig:
            cid = coordinator.trigger(TriggerReason.MANUAL)
        assert cid is not None, "a manual trigger always triggers"
        acks_s = 0.0
        last_s = 0.0
        for pos, sid in enumerate(running):
            txn = SinkTransaction(sink_id="out", txn_id=f"{sid}.r{round_no}.e1", checkpoint_id=0)
            with Stopwatch() as ack:
                coordinator.record_batch(
                    sid,
                    1,
                    finished_splits=(f"data/{sid}/extra-{round_no:05d}",),
                    transactions=(txn,),
                )
            if pos == len(running) - 1:
                last_s = ack.seconds
            else:
                acks_s += ack.seconds
    info = coordinator.checkpoint(cid)
    if info.state is not CheckpointState.COMPLETED:
        raise RuntimeError(f"checkpoint {cid} ended {info.state.value}: {info.failure_reason}")
    plan_bytes = len(json.dumps(info.plan.to_dict(), separators=(",", ":")))
    return CheckpointCost(
        checkpoint_id=cid,
        trigger_s=trig.seconds,
        acks_s=acks_s,
        last_ack_s=last_s,
        total_s=whole.seconds,
        acks=len(running),
        metadata_bytes=int(info.size_bytes or 0),
        plan_bytes=plan_bytes,
    )


def fan_in(store_url: str, finishing: int) -> dict[str, float]:
    """``finishing`` stages finish one by one while a sibling runs (each finish its own
    transition, through the real API), then the sibling reaches its next batch boundary. Returns
    the total and per-finish cost, the most checkpoints pending at once (read after every
    finish, outside the timing) and what the sibling's boundary completed.
    """
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.core.graph import StageGraph
    from airflow_finalckpt.core.model import CheckpointState, EndOfData, StageSnapshot
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(store_url)
    try:
        ensure_schema(engine)
        with tempfile.TemporaryDirectory(prefix="finalckpt-bench-fan-") as tmp:
            ids = [f"f{i:05d}" for i in range(finishing)]
            coordinator = Coordinator(engine, "fan-in", writer=CheckpointStorage(tmp))
            coordinator.register(StageGraph.from_edges([*ids, "busy"], ()))
            busy = coordinator.start_attempt("busy", total_splits=10)
            coordinator.record_batch("busy", busy.epoch, finished_splits=("s0",))
            epochs = {sid: coordinator.start_attempt(sid, total_splits=1).epoch for sid in ids}
            total_s = 0.0
            max_pending = 0
            for sid in ids:
                snapshot = StageSnapshot(
                    finished_splits=frozenset({"s0"}),
                    end_of_data=EndOfData(manifest=[f"{sid}/p"]),
                )
                with Stopwatch() as one:
                    coordinator.finish(sid, epochs[sid], snapshot)
                total_s += one.seconds
                pending = [
                    c for c in coordinator.checkpoints() if c.state is CheckpointState.PENDING
                ]
                max_pending = max(max_pending, len(pending))
            with Stopwatch() as boundary:
                outcome = coordinator.record_batch("busy", busy.epoch, finished_splits=("s1",))
            closable = sum(1 for sid in ids if coordinator.closable_checkpoint(sid) is not None)
            return {
                "finishes_s": total_s,
                "finish_s_mean": total_s / finishing,
                "max_pending": float(max_pending),
                "sibling_boundary_s": boundary.seconds,
                "completed_at_boundary": float(len(outcome.completed)),
                "closable_after_boundary": float(closable),
            }
    finally:
        engine.dispose()


def measure(
    store_url: str,
    size: Size,
    checkpoints: int,
    *,
    profile: bool = False,
) -> tuple[list[CheckpointCost], dict[str, float], str | None]:
    """Set a store up with a graph of ``size`` and measure ``checkpoints`` checkpoints."""
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(store_url)
    setup: dict[str, float] = {}
    try:
        ensure_schema(engine)
        with tempfile.TemporaryDirectory(prefix="finalckpt-bench-ckpt-") as tmp:
            key = f"scale-{size.stages}x{size.splits}"
            coordinator = Coordinator(engine, key, writer=CheckpointStorage(tmp))
            graph = _graph(size.stages)
            with Stopwatch() as reg:
                coordinator.register(graph)
            setup["register_s"] = reg.seconds
            with Stopwatch() as seed:
                running = seed_state(engine, key, size)
            setup["seed_s"] = seed.seconds
            costs = []
            profiler = cProfile.Profile() if profile else None
            for round_no in range(checkpoints):
                if profiler is not None and round_no == checkpoints - 1:
                    profiler.enable()
                costs.append(one_checkpoint(coordinator, running, round_no))
                if profiler is not None and round_no == checkpoints - 1:
                    profiler.disable()
            report = _profile_report(profiler) if profiler is not None else None
            return costs, setup, report
    finally:
        engine.dispose()


def _profile_report(profiler: cProfile.Profile, lines: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(lines)
    out.write("\n--- by own time ---\n")
    stats.sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def _backends(tmp: str) -> list[tuple[str, Callable[[], Any]]]:
    """(name, context factory yielding a store URL) for every store we can reach."""
    import contextlib
    import os

    counter = iter(range(1_000_000))

    @contextlib.contextmanager
    def sqlite_store() -> Any:
        path = os.path.join(tmp, f"store-{next(counter)}.db")
        yield f"sqlite:///{path}"

    backends: list[tuple[str, Callable[[], Any]]] = [("sqlite", sqlite_store)]
    backends.append(("postgresql", postgres_database))
    return backends


#: Acceptance of issue 16: (stages, splits) -> seconds per checkpoint at most.
CHECKPOINT_LIMITS_S = {(10_000, 100): 2.0, (1000, 1000): 1.5}
#: ms per acknowledgement at 10,000 stages over 100 stages (100 splits) at most.
ACK_FLATNESS_LIMIT = 1.5
#: At most this many checkpoints pending at once while F stages finish beside a running one.
FAN_IN_MAX_PENDING = 2
#: The growth of the finish cost is judged only with this many finishes or more.
FAN_IN_JUDGED_FROM = 30


def fan_sizes(quick: bool) -> tuple[int, ...]:
    return (5, 10) if quick else (15, 30, 60)


def run(quick: bool = False) -> Result:
    result = Result(NAME)
    checkpoints = 1 if quick else 3
    series = plan_sizes(quick)
    result.repetitions = checkpoints
    result.parameters = {
        "graph": "N/4 lanes ingest->enrich->windows->publish, lane states cycling "
        "done/late/middle/new: 1/16 running (half their splits finished), 9/16 finished, "
        "6/16 not started",
        "series": {name: [[s.stages, s.splits] for s in sizes] for name, sizes in series.items()},
        "checkpoints_per_case": checkpoints,
        "acknowledgements": "one record_batch per running stage, each its own transition",
        "metadata_storage": "CheckpointStorage on a local temporary directory",
        "linear_limit": LINEAR_LIMIT,
        "fan_in_finishing": list(fan_sizes(quick)),
        "fan_in": "F stages finish one by one while a sibling runs, then the sibling's next "
        "batch boundary; max pending read after every finish",
    }
    pg_problem = postgres_available()
    if pg_problem:
        result.notes.append(f"PostgreSQL skipped: {pg_problem}")
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-scale-") as tmp:
        for backend, store in _backends(tmp):
            if backend == "postgresql" and pg_problem:
                continue
            for series_name, sizes in series.items():
                _scale_series(result, backend, store, series_name, sizes, checkpoints)
            _acceptance_targets(result, backend)
            _fan_in_series(result, backend, store, fan_sizes(quick))
    flagged = [t for t in result.targets if t.passed is False]
    if flagged:
        result.notes.append(
            "a target is missed: see docs/benchmarks.md "
            "(hot spot found with python -m benchmarks.coordinator_scale --profile)"
        )
    return result


def _scale_series(
    result: Result,
    backend: str,
    store: Callable[[], Any],
    series_name: str,
    sizes: Sequence[Size],
    checkpoints: int,
) -> None:
    """One case per size, then the growth exponent of the series."""
    xs: list[float] = []
    ys: list[float] = []
    for size in sizes:
        log(f"{NAME}: {backend} {size.stages} stages x {size.splits} splits")
        with store() as url:
            # every size the median of consecutive checkpoints: the first of a process also
            # pays for compiling and preparing its statements
            costs, setup, _ = measure(url, size, checkpoints)
        case = result.case(
            f"{backend}/{size.stages}x{size.splits}",
            backend=backend,
            series=series_name,
            stages=size.stages,
            splits=size.splits,
            running_stages=costs[0].acks,
            first_checkpoint_s=costs[0].total_s,
            **setup,
        )
        for cost in costs:
            case.add("seconds_per_checkpoint", cost.total_s)
            case.add("trigger_s", cost.trigger_s)
            case.add("ack_s_mean", cost.acks_s / max(cost.acks - 1, 1))
            case.add("completing_ack_s", cost.last_ack_s)
            case.add("metadata_bytes", cost.metadata_bytes)
            case.add("plan_bytes", cost.plan_bytes)
        case.finalize()
        xs.append(size.stages)
        ys.append(case.medians["seconds_per_checkpoint"])
    slope = loglog_slope(xs, ys)
    key = f"{backend}/{series_name}"
    result.medians[f"growth_exponent/{key}"] = slope
    tail = loglog_slope(xs[-2:], ys[-2:])
    result.medians[f"growth_exponent_last_step/{key}"] = tail
    # Fixed per-transition costs dominate small graphs and flatten a fit over the whole
    # range: the largest step shows the asymptotic growth, so it is judged too.
    worst = max(slope, tail)
    result.targets.append(
        Target(
            name=f"growth exponent, {backend}, {series_name}",
            target=f"about linear (log-log slope <= {LINEAR_LIMIT})",
            measured=worst,
            passed=bool(worst <= LINEAR_LIMIT),
            note=f"fit over stages {', '.join(str(int(x)) for x in xs)}: "
            f"{slope:.2f}; largest step {int(xs[-2])}->{int(xs[-1])}: {tail:.2f}",
        )
    )


def _case_medians(result: Result, name: str) -> dict[str, Any] | None:
    for case in result.cases:
        if case.name == name:
            return case.medians
    return None


def _acceptance_targets(result: Result, backend: str) -> None:
    """Issue 16: seconds per checkpoint at the large sizes, ms per ack flat in the graph."""
    for (stages, splits), limit in CHECKPOINT_LIMITS_S.items():
        medians = _case_medians(result, f"{backend}/{stages}x{splits}")
        if medians is None:
            continue
        seconds = float(medians["seconds_per_checkpoint"])
        result.targets.append(
            Target(
                name=f"seconds per checkpoint, {backend}, {stages:,} stages x {splits:,} splits",
                target=f"<= {limit} s (trigger + acknowledgements + completion)",
                measured=seconds,
                unit="s",
                passed=bool(seconds <= limit),
            )
        )
    small = _case_medians(result, f"{backend}/100x100")
    large = _case_medians(result, f"{backend}/10000x100")
    if small is None or large is None:
        return
    ratio = float(large["ack_s_mean"]) / float(small["ack_s_mean"])
    result.medians[f"ack_ms_ratio_10000_over_100/{backend}"] = ratio
    result.targets.append(
        Target(
            name=f"ms per acknowledgement, {backend}, 10,000 over 100 stages",
            target=f"<= {ACK_FLATNESS_LIMIT}x",
            measured=ratio,
            unit="x",
            passed=bool(ratio <= ACK_FLATNESS_LIMIT),
            note=f"{1000 * float(small['ack_s_mean']):.1f} ms -> "
            f"{1000 * float(large['ack_s_mean']):.1f} ms",
        )
    )


def _fan_in_series(
    result: Result, backend: str, store: Callable[[], Any], sizes: Sequence[int]
) -> None:
    """F stages finishing beside a running sibling: pending checkpoints and finish cost."""
    xs: list[float] = []
    ys: list[float] = []
    most = 0.0
    for finishing in sizes:
        log(f"{NAME}: {backend}, fan-in of {finishing} finishing stages")
        with store() as url:
            got = fan_in(url, finishing)
        # Medians, not cases: a case here is one graph size of a checkpoint series (charts).
        for metric, value in got.items():
            result.medians[f"fan_in/{backend}/F={finishing}/{metric}"] = value
        xs.append(finishing)
        ys.append(got["finishes_s"])
        most = max(most, got["max_pending"])
    result.targets.append(
        Target(
            name=f"fan-in, {backend}: checkpoints pending at once",
            target=f"<= {FAN_IN_MAX_PENDING} at F = {', '.join(str(f) for f in sizes)}",
            measured=most,
            passed=bool(most <= FAN_IN_MAX_PENDING),
        )
    )
    slope = loglog_slope(xs, ys)
    result.medians[f"fan_in_growth_exponent/{backend}"] = slope
    result.targets.append(
        Target(
            name=f"fan-in, {backend}: total finish cost over F",
            target=f"at most linear (log-log slope <= {LINEAR_LIMIT})",
            measured=slope,
            # A few finishes are fixed costs and noise (quick mode): not judged.
            passed=bool(slope <= LINEAR_LIMIT) if max(sizes) >= FAN_IN_JUDGED_FROM else None,
            note=", ".join(f"F={int(x)}: {y:.3f} s" for x, y in zip(xs, ys, strict=True)),
        )
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.coordinator_scale --profile N S``: cProfile one checkpoint."""
    import argparse

    parser = argparse.ArgumentParser(description="profile one checkpoint of a large graph")
    parser.add_argument("--profile", nargs=2, type=int, metavar=("STAGES", "SPLITS"))
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--fan-in", type=int, nargs="+", metavar="F", help="only the fan-in case")
    args = parser.parse_args(argv)
    if args.fan_in:
        with tempfile.TemporaryDirectory(prefix="finalckpt-bench-fan-") as tmp:
            store = dict(_backends(tmp))[args.backend]
            for finishing in args.fan_in:
                with store() as url:
                    print(f"F={finishing}: {fan_in(url, finishing)}")
        return 0
    stages, splits = args.profile or (1000, 100)
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-prof-") as tmp:
        store = dict(_backends(tmp))[args.backend]
        with store() as url:
            costs, setup, report = measure(url, Size(stages, splits), 2, profile=True)
    print(f"setup {setup}")
    for cost in costs:
        print(cost)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
