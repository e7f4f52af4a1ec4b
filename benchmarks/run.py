"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--only NAME] [--out DIR]``.

Writes one ``<benchmark>.json`` per benchmark (shape: ``benchmarks.common``) and PNG charts into
``--out`` (default ``benchmarks/results``), then prints a summary of every target. ``--quick``
is the CI smoke mode: small sizes, one repetition, no timing is asserted anywhere. The full run
takes under 25 minutes on a 2-core machine (without ``overhead_x10``).

Benchmarks (``--only`` takes a name or its alias, repeatable):

    coordinator_scale         (scale)     plan + checkpoint cost as the graph grows, no Spark
    triggerer_load            (waiters)   W deferred stages polling for their final checkpoint
    final_checkpoint_latency  (latency)   end of input -> close, intervals 10 s / 60 s / 1 h
    steady_state_overhead     (overhead)  example pipeline: ours vs plain PySpark jobs, 365 d x1
    resume_savings            (resume)    crash at 25/50/75 % of enrich: resume vs retry/rerun
    batch_target_curve        (curve)     overhead and redone work against target_batch_s
    stop_latency              (stop)      stop request -> savepoint complete (drain / savepoint)
    steady_state_overhead_x10 (overhead_x10)  the same on 365 days x10 rows (3.4 M flights);
                                          only with --only (not in the default suite)
    steady_state_overhead_x100 (overhead_x100)  the same on 365 days x100 rows (33.7 M
                                          flights, cached input), 2 repetitions, memory peaks
                                          per side; only with --only (7.5 min measured quiet)
    resume_savings_x100       (resume_x100)  one crash at 50 % of enrich at x100; after
                                          overhead_x100 in the same command it reuses its
                                          hints; only with --only (3.6 min measured quiet)
    airflow_real              (airflow)   the example DAG vs plain @task.pyspark tasks on a real
                                          Airflow, cold and warm, per stage, with a profile of
                                          each stage task; only with --only (~15 min quiet)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import Result, log, stop_spark

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _scale(quick: bool) -> Result:
    from benchmarks import coordinator_scale

    return coordinator_scale.run(quick)


def _latency(quick: bool) -> Result:
    from benchmarks import final_checkpoint_latency

    return final_checkpoint_latency.run(quick)


def _overhead(quick: bool) -> Result:
    from benchmarks import steady_state

    return steady_state.run(quick)


def _overhead_x10(quick: bool) -> Result:
    from benchmarks import steady_state

    return steady_state.run_x10(quick)


def _overhead_x100(quick: bool) -> Result:
    from benchmarks import x100

    return x100.run(quick)


def _resume_x100(quick: bool) -> Result:
    from benchmarks import x100

    return x100.run_resume(quick)


def _curve(quick: bool) -> Result:
    from benchmarks import batch_curve

    return batch_curve.run(quick)


def _resume(quick: bool) -> Result:
    from benchmarks import resume

    return resume.run(quick)


def _stop(quick: bool) -> Result:
    from benchmarks import stop_latency

    return stop_latency.run(quick)


def _airflow(quick: bool) -> Result:
    from benchmarks import airflow_real

    return airflow_real.run(quick)


def _waiters(quick: bool) -> Result:
    from benchmarks import triggerer_load

    return triggerer_load.run(quick)


#: name -> (alias, runner), in the order they run.
BENCHMARKS: dict[str, tuple[str, Callable[[bool], Result]]] = {
    "coordinator_scale": ("scale", _scale),
    "triggerer_load": ("waiters", _waiters),
    "final_checkpoint_latency": ("latency", _latency),
    "steady_state_overhead": ("overhead", _overhead),
    "resume_savings": ("resume", _resume),
    "batch_target_curve": ("curve", _curve),
    "stop_latency": ("stop", _stop),
    "steady_state_overhead_x10": ("overhead_x10", _overhead_x10),
    "steady_state_overhead_x100": ("overhead_x100", _overhead_x100),
    "resume_savings_x100": ("resume_x100", _resume_x100),
    "sinks": ("sinks", lambda quick: __import__("benchmarks.sinks").sinks.run(quick)),
    "airflow_real": ("airflow", _airflow),
}
#: Run only when asked for with ``--only`` (too long for the 25-minute suite).
OPT_IN = (
    "steady_state_overhead_x10",
    "steady_state_overhead_x100",
    "resume_savings_x100",
    "sinks",
    "airflow_real",
)


def resolve(names: list[str] | None) -> list[str]:
    if not names:
        return [n for n in BENCHMARKS if n not in OPT_IN]
    aliases = {alias: name for name, (alias, _) in BENCHMARKS.items()}
    chosen = []
    for name in names:
        full = aliases.get(name, name)
        if full not in BENCHMARKS:
            known = ", ".join(f"{n} ({a})" for n, (a, _) in BENCHMARKS.items())
            raise SystemExit(f"unknown benchmark {name!r}; known: {known}")
        if full not in chosen:
            chosen.append(full)
    return [n for n in BENCHMARKS if n in chosen]


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING)
    for name in ("airflow_finalckpt", "py4j", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def run_one(name: str, quick: bool, out: Path) -> dict[str, Any]:
    _, runner = BENCHMARKS[name]
    started = time.perf_counter()
    log(f"=== {name} ({'quick' if quick else 'full'})")
    try:
        result = runner(quick)
    except Exception as exc:  # recorded, the suite goes on
        result = Result(name, status="error")
        result.notes.append(f"{type(exc).__name__}: {exc}")
        result.notes.append(traceback.format_exc())
        log(f"{name} failed: {type(exc).__name__}: {exc}")
    doc = result.to_json(quick=quick, duration_s=time.perf_counter() - started)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    log(f"{name}: {doc['status']} in {doc['duration_s']:.0f} s -> {path}")
    return doc


def summary(docs: list[dict[str, Any]]) -> str:
    lines = []
    for doc in docs:
        lines.append(f"{doc['benchmark']}: {doc['status']} ({doc['duration_s']} s)")
        for target in doc.get("targets", []):
            verdict = {True: "pass", False: "MISS", None: "-"}[target["pass"]]
            measured = target["measured"]
            shown = f"{measured:.3g}" if isinstance(measured, float) else str(measured)
            lines.append(
                f"  [{verdict:>4}] {target['name']}: {shown}{target['unit']} "
                f"(target {target['target']})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repetition (CI)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this benchmark (repeatable)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    parser.add_argument("--no-charts", action="store_true", help="write JSON only")
    args = parser.parse_args(argv)
    names = resolve(args.only)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    _quiet_logs()
    started = time.perf_counter()
    docs = []
    try:
        for name in names:
            docs.append(run_one(name, args.quick, out))
    finally:
        stop_spark()
    if not args.no_charts:
        from benchmarks.charts import render_all

        for message in render_all(out):
            log(message)
    log(f"suite finished in {time.perf_counter() - started:.0f} s")
    print(summary(docs))
    return 1 if any(doc["status"] == "error" for doc in docs) else 0


if __name__ == "__main__":
    sys.exit(main())
