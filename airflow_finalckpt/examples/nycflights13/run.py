"""Run the example DAG end to end with ``dag.test()`` on embedded defaults and print a summary.

    python -m airflow_finalckpt.examples.nycflights13.run [--days N] [--crash-mid-enrich]

Embedded defaults: Airflow's metadata in SQLite, the coordination store in SQLite, checkpoints
and outputs on the local filesystem, Spark ``local[*]``, all under ``--home`` (./var/example).
With ``--crash-mid-enrich`` the first DAG run fails inside ``enrich``; a second DAG run of the
same pipeline key then resumes: ``ingest`` submits no Spark job, ``enrich`` redoes only its
unfinished splits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO_DAGS = Path(__file__).resolve().parents[3] / "dags"


def _configure_environment(home: Path, days: int) -> None:
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
    os.environ.setdefault("FINALCKPT_EXAMPLE_OUTPUT", str(home / "output"))
    os.environ["FINALCKPT_EXAMPLE_DAYS"] = str(days)


def _migrate_airflow() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)


def _load_dag() -> Any:
    spec = importlib.util.spec_from_file_location(
        "nycflights13_pipeline", REPO_DAGS / "nycflights13_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _run(dag: Any, key: str) -> str:
    started = time.monotonic()
    dag_run = dag.test(run_conf={"pipeline_key": key})
    state = str(getattr(dag_run, "state", "unknown"))
    print(f"==> DAG run {dag_run.run_id}: {state} in {time.monotonic() - started:.1f}s")
    return state


def summarize(key: str, days: int) -> dict[str, Any]:
    """The checkpoint history, every stage's state, and the sinks checked against pandas."""
    from airflow_finalckpt.cli.checkpoints import info_to_json
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.core.coordinator import Coordinator
    from airflow_finalckpt.examples.nycflights13.data import first_days
    from airflow_finalckpt.examples.nycflights13.reference import (
        assert_windows_match,
        reference_pipeline,
    )
    from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
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
    sql_url = os.environ.get("FINALCKPT_EXAMPLE_SQL_URL", f"sqlite:///{output}/delay_windows.db")
    expected = reference_pipeline(first_days(days)).windows
    checks = {}
    for name, sink in (
        ("parquet", ParquetTableSink("delay_windows_parquet", f"{output}/delay_windows")),
        ("sql", SqlTableSink("delay_windows_sql", sql_url, "delay_windows")),
    ):
        actual = sink.read_pandas()
        try:
            assert_windows_match(actual, expected)
            verdict = "equal to the pandas reference"
        except AssertionError as exc:
            verdict = f"DIFFERENT from the pandas reference: {str(exc)[:200]}"
        checks[name] = {"rows": len(actual), "expected_rows": len(expected), "verdict": verdict}
        print(f"==> {name} sink: {len(actual)} window rows, {verdict}")
    return {"stages": stages, "sinks": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365, help="days of 2013 to process (1-365)")
    parser.add_argument("--home", type=Path, default=Path("var/example").resolve())
    parser.add_argument("--crash-mid-enrich", action="store_true")
    parser.add_argument("--pipeline-key", default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.days <= 365:
        parser.error("--days must be between 1 and 365")
    _configure_environment(args.home.resolve(), args.days)
    _migrate_airflow()
    key = args.pipeline_key or f"nycflights13-{uuid.uuid4().hex[:8]}"
    if args.crash_mid_enrich:
        os.environ["FINALCKPT_EXAMPLE_CRASH"] = "enrich:2"
        os.environ["FINALCKPT_EXAMPLE_RETRIES"] = "0"
    dag = _load_dag()
    print(f"==> pipeline key {key}: {args.days} days of nycflights13 through 4 stages")
    state = _run(dag, key)
    if args.crash_mid_enrich:
        print("==> first DAG run ended with the injected crash in enrich; starting a new DAG run")
        print(f"    of the same pipeline key ({key}): it resumes from the stored progress")
        os.environ.pop("FINALCKPT_EXAMPLE_CRASH")
        state = _run(dag, key)
    report = summarize(key, args.days)
    ok = state.endswith("success") and all(
        c["verdict"].startswith("equal") for c in report["sinks"].values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
