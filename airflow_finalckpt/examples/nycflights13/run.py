"""Run the example DAG end to end with ``dag.test()`` on embedded defaults and print a summary.

    python -m airflow_finalckpt.examples.nycflights13.run [--days N] [--crash-mid-enrich]
        [--no-lakehouse]

Embedded defaults: Airflow's metadata in SQLite, the coordination store in SQLite, checkpoints
and outputs on the local filesystem, Spark ``local[*]``, all under ``--home`` (./var/example).
Each pipeline key gets its own output directory (``<home>/output/<pipeline key>``): a second run
of the example writes new tables instead of appending to the first run's, so every run's check
against the reference holds; ``--pipeline-key`` continues a pipeline in its own directory.
Both tables (delay windows, carrier_daily) are published to Parquet (the delay windows to SQL
too) and, unless ``--no-lakehouse``, to Apache Iceberg (pyiceberg SQLite catalog) and Delta Lake
(``scripts/setup.sh`` installs the ``lakehouse`` extra these need); every sink is then checked
against the pandas reference.
With ``--crash-mid-enrich`` the first DAG run fails inside ``enrich`` when it starts its second
batch (its first is recorded); a second DAG run of the same pipeline key then resumes: ``ingest``
submits no Spark job, ``enrich`` redoes only its unfinished splits. What the runner prints about
the crash is read back from the first DAG run's state, the crash marker and the stored progress:
if enrich's splits did not reach a second batch, it says so instead of resuming.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_DAGS = Path(__file__).resolve().parents[3] / "dags"
#: The crash spec of ``--crash-mid-enrich``: fail when enrich starts batch 2 (batch 1 recorded),
#: whatever the batch sizes are.
CRASH_SPEC = "enrich:1"
#: enrich's splits are ingest's output parts, at most one per day: one day is one split, and a
#: crash cannot land between two batches of one split.
MIN_CRASH_DAYS = 2
#: What ``--lakehouse`` needs (the ``lakehouse`` extra).
LAKEHOUSE_MODULES = ("pyiceberg", "deltalake")


def output_dir_name(key: str) -> str:
    """A pipeline key as one safe directory name (no separators, never ``.`` or ``..``)."""
    return re.sub(r"[^A-Za-z0-9_=-]", "-", key)[:200] or "pipeline"


def _configure_environment(home: Path, days: int, lakehouse: bool, key: str) -> None:
    """Must run before Airflow is imported: Airflow reads its configuration at import."""
    airflow_home = home / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_HOME"] = str(airflow_home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_DAGS))
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    os.environ.setdefault("AIRFLOW__FINALCKPT__STORE_URL", f"sqlite:///{home}/coordination.db")
    os.environ.setdefault("AIRFLOW__FINALCKPT__STORAGE_URI", str(home / "checkpoints"))
    os.environ.setdefault("AIRFLOW__FINALCKPT__CHECKPOINT_INTERVAL_S", "30")
    os.environ.setdefault("FINALCKPT_EXAMPLE_INPUT", str(home / "input"))
    os.environ.setdefault("FINALCKPT_EXAMPLE_OUTPUT", str(home / "output" / output_dir_name(key)))
    os.environ["FINALCKPT_EXAMPLE_DAYS"] = str(days)
    os.environ["FINALCKPT_EXAMPLE_LAKEHOUSE"] = "1" if lakehouse else "0"


def _migrate_airflow() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)


def _load_dag(crash: Callable[[], str | None] | None = None) -> Any:
    """The DAG of ``dags/nycflights13_branching.py``; with ``crash`` (the crash spec, read when
    a batch runs) the same DAG built by its factory with the demo's crash hook on enrich, one
    split per enrich batch and no retries (the DAG file has no test knobs).
    """
    spec = importlib.util.spec_from_file_location(
        "nycflights13_branching", REPO_DAGS / "nycflights13_branching.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if crash is None:
        return module.dag
    from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag
    from airflow_finalckpt.examples.nycflights13.crash import crash_batch_sizes, crash_hook
    from airflow_finalckpt.examples.nycflights13.dag import env_settings

    return build_branching_dag(
        module.dag.dag_id,
        doc_md=module.__doc__,
        lakehouse=os.environ.get("FINALCKPT_EXAMPLE_LAKEHOUSE") == "1",
        retries=0,
        batch_sizes=crash_batch_sizes(int(os.environ["FINALCKPT_EXAMPLE_DAYS"])),
        batch_hooks={"enrich": crash_hook(crash)},
        **env_settings(),
    )


@dataclass(frozen=True)
class CrashReport:
    """What the first DAG run of ``--crash-mid-enrich`` really did."""

    fired: bool
    message: str


def describe_crash(
    state: str, outcome: dict[str, Any] | None, lifecycle: str, finished: int, total: int | None
) -> CrashReport:
    """The truth about the injected crash, from the first DAG run's state, the crash marker
    (``crash.crash_outcome``) and enrich's stored progress; ``fired`` only if all three agree
    that enrich failed mid-way with part of its splits recorded.
    """
    of = f"{finished} of {total}" if total is not None else f"{finished}"
    progress = f"enrich is {lifecycle} with {of} splits recorded"
    if outcome is None:
        return CrashReport(False, f"the injected crash did not fire: enrich never ran ({state})")
    if not outcome.get("fired"):
        reason = outcome.get("reason", "unknown")
        return CrashReport(
            False, f"the injected crash did not fire ({reason}); first DAG run: {state}, {progress}"
        )
    partial = lifecycle == "RUNNING" and finished > 0 and (total is None or finished < total)
    if state.endswith("failed") and partial:
        return CrashReport(
            True,
            f"first DAG run {state}: the injected crash fired in enrich after "
            f"{outcome.get('after_batches')} batch(es); {progress}",
        )
    return CrashReport(
        False,
        f"the injected crash fired, but the first DAG run ended {state} and {progress}: "
        "not the mid-enrich failure this option demonstrates",
    )


def crash_report(key: str, state: str) -> CrashReport:
    """``describe_crash`` for pipeline ``key`` from the configured store and storage."""
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.core.errors import FinalCheckpointError
    from airflow_finalckpt.examples.nycflights13.crash import crash_outcome
    from airflow_finalckpt.store.engine import make_engine

    settings = load_settings()
    outcome = crash_outcome(settings.storage_uri, key, "enrich")
    engine = make_engine(settings.store_url)
    try:
        view = Coordinator(engine, key).stage("enrich")
    except FinalCheckpointError:  # the pipeline was never registered: nothing ran
        return describe_crash(state, outcome, "unknown", 0, None)
    finally:
        engine.dispose()
    finished = len(view.progress.finished_splits)
    return describe_crash(state, outcome, view.lifecycle.value, finished, view.total_splits)


def _run(dag: Any, key: str) -> str:
    started = time.monotonic()
    dag_run = dag.test(run_conf={"pipeline_key": key})
    state = str(getattr(dag_run, "state", "unknown"))
    print(f"==> DAG run {dag_run.run_id}: {state} in {time.monotonic() - started:.1f}s")
    return state


def missing_lakehouse_modules() -> list[str]:
    """The lakehouse libraries (pyiceberg, deltalake) not installed here."""
    return [name for name in LAKEHOUSE_MODULES if importlib.util.find_spec(name) is None]


def read_sink(sink: Any) -> Any:
    """A sink's committed table as pandas (Iceberg: pyiceberg scan; Delta: deltalake)."""
    if hasattr(sink, "read_pandas"):
        return sink.read_pandas()
    return sink.read_arrow().to_pandas()


def summarize(key: str, days: int, *, lakehouse: bool = False) -> dict[str, Any]:
    """The checkpoint history, every stage's state, and every sink checked against pandas."""
    from airflow_finalckpt.cli.checkpoints import info_to_json
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.examples.nycflights13.branching import branching_sinks
    from airflow_finalckpt.examples.nycflights13.data import first_days
    from airflow_finalckpt.examples.nycflights13.reference import (
        assert_carrier_daily_match,
        assert_windows_match,
        reference_carrier_daily,
        reference_pipeline,
    )
    from airflow_finalckpt.store.engine import make_engine

    settings = load_settings()
    coord = Coordinator(make_engine(settings.store_url), key)
    print(f"\n==> checkpoints of pipeline {key}")
    print(f"{'id':>4} {'kind':<18} {'reason':<12} {'state':<10} {'duration':>9}  stages")
    for info in reversed(coord.checkpoints()):
        doc = info_to_json(info)
        duration = "-" if doc["duration_s"] is None else f"{doc['duration_s']:.3f}s"
        statuses = ", ".join(f"{k}={v}" for k, v in sorted(doc["statuses"].items()))
        print(
            f"{info.checkpoint_id:>4} {info.kind.value:<18} {info.reason.value:<12} "
            f"{info.state.value:<10} {duration:>9}  {statuses}"
        )
    print("\n==> stages")
    stages = {}
    for sid, view in coord.stages().items():
        stages[sid] = {
            "lifecycle": view.lifecycle.value,
            "attempt_epochs": view.epoch,
            "finished_splits": len(view.progress.finished_splits),
            "total_splits": view.total_splits,
            "closed_on_checkpoint": view.closed_checkpoint_id,
        }
        print(f"  {sid:<14} {json.dumps(stages[sid])}")
    output = os.environ["FINALCKPT_EXAMPLE_OUTPUT"]
    sinks = branching_sinks(
        output, os.environ.get("FINALCKPT_EXAMPLE_SQL_URL"), lakehouse=lakehouse
    )
    references = {
        "delay_windows": (reference_pipeline(first_days(days)).windows, assert_windows_match),
        "carrier_daily": (reference_carrier_daily(first_days(days)), assert_carrier_daily_match),
    }
    checks = {}
    for table, (expected, check) in references.items():
        for sink in sinks[table]:
            name = f"{table} {sink.sink_id.removeprefix(table + '_')}"
            actual = read_sink(sink)
            try:
                check(actual, expected)
                verdict = "equal to the pandas reference"
            except AssertionError as exc:
                verdict = f"DIFFERENT from the pandas reference: {str(exc)[:200]}"
            checks[name] = {"rows": len(actual), "expected_rows": len(expected), "verdict": verdict}
            print(f"==> {name} sink: {len(actual)} rows, {verdict}")
    return {"stages": stages, "sinks": checks}


def main(argv: list[str] | None = None) -> int:
    """Run the example DAG end to end (module docstring); 0 if every sink matches the reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365, help="days of 2013 to process (1-365)")
    parser.add_argument("--home", type=Path, default=Path("var/example").resolve())
    parser.add_argument("--crash-mid-enrich", action="store_true")
    parser.add_argument("--pipeline-key", default=None)
    parser.add_argument(
        "--lakehouse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also publish both tables to Iceberg and Delta Lake and check them (default: on; "
        "needs the lakehouse extra, which scripts/setup.sh installs)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.days <= 365:
        parser.error("--days must be between 1 and 365")
    if args.crash_mid_enrich and args.days < MIN_CRASH_DAYS:
        parser.error(
            f"--crash-mid-enrich needs --days >= {MIN_CRASH_DAYS}: enrich's splits are ingest's "
            f"output parts (at most one per day), so with {args.days} day enrich has one split "
            "and a crash cannot land between two of its batches"
        )
    if args.lakehouse and (missing := missing_lakehouse_modules()):
        parser.error(
            f"--lakehouse needs {', '.join(missing)} (pip install -e '.[lakehouse]'; "
            "scripts/setup.sh does); or pass --no-lakehouse"
        )
    key = args.pipeline_key or f"nycflights13-{uuid.uuid4().hex[:8]}"
    _configure_environment(args.home.resolve(), args.days, args.lakehouse, key)
    _migrate_airflow()
    armed: list[str | None] = [CRASH_SPEC]
    dag = _load_dag((lambda: armed[0]) if args.crash_mid_enrich else None)
    print(
        f"==> pipeline key {key}: {args.days} days of nycflights13 through 6 stages (two branches)"
    )
    kinds = "Parquet, SQL" + (", Iceberg, Delta Lake" if args.lakehouse else "")
    print(f"==> sinks: {kinds}, under {os.environ['FINALCKPT_EXAMPLE_OUTPUT']}")
    state = _run(dag, key)
    crashed = True
    if args.crash_mid_enrich:
        armed[0] = None  # the next DAG run resumes without a crash
        crash = crash_report(key, state)
        crashed = crash.fired
        print(f"==> {crash.message}")
        if crash.fired:
            print(f"==> starting a new DAG run of the same pipeline key ({key}): it resumes from")
            print("    the stored progress (ingest: no Spark job; enrich: only unfinished splits)")
            state = _run(dag, key)
        elif not state.endswith("success"):
            print(f"==> starting a new DAG run of the same pipeline key ({key}) to finish it")
            state = _run(dag, key)
    report = summarize(key, args.days, lakehouse=args.lakehouse)
    ok = crashed and state.endswith("success")
    ok = ok and all(c["verdict"].startswith("equal") for c in report["sinks"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
