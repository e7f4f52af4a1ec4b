"""OpenLineage events of a real ``dag.test()``: Airflow's OpenLineage provider, with a file
transport, asks the stage operator for its lineage when a stage succeeds. The publishing stage
reports its Iceberg and Delta tables (schema, rows committed), the downstream stage reads them
and reports its Parquet table. Run in a child process: the provider's listener is registered
when Airflow loads its plugins, so the transport must be configured before that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.extras import import_extra

pytestmark = pytest.mark.slow
import_extra("airflow.providers.openlineage", "lineage")

TWO_STAGE_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink, ParquetTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s, len(s)) for s in ctx.splits], "k string, n long")


def report(ctx):
    return ctx.read_parts().groupBy("n").count()


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    publish = FinalCheckpointStageOperator(
        task_id="publish",
        transform=rows,
        splits=["a", "bb", "ccc"],
        batch_size=2,
        sinks=[
            IcebergTableSink("ice", "lake.keys", warehouse=OUT_DIR + "/warehouse"),
            DeltaTableSink("delta", OUT_DIR + "/delta/keys"),
        ],
        retries=0,
    )
    summary = FinalCheckpointStageOperator(
        task_id="summary",
        transform=report,
        sinks=[ParquetTableSink("counts", OUT_DIR + "/counts")],
        retries=0,
    )
    publish >> summary
"""

RUN_DAG = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lineage_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test(run_conf={"pipeline_key": sys.argv[2]})
open(sys.argv[3], "w").write(str(run.state))
"""


def completes(events_file: Path) -> dict[str, dict[str, Any]]:
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    return {e["job"]["name"]: e for e in events if e["eventType"] == "COMPLETE"}


def test_stage_tasks_emit_their_tables_schema_and_rows(airflow_home: Any, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    dag_id, out = f"lineage_{suffix}", tmp_path / "out"
    dag_file = airflow_home.dags_folder / f"test_dag_lineage_{suffix}.py"
    dag_file.write_text(f"DAG_ID = {dag_id!r}\nOUT_DIR = {str(out)!r}\n" + TWO_STAGE_DAG)
    events_file, state = tmp_path / "openlineage.json", str(tmp_path / "state")
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__FINALCKPT__STORE_URL": f"sqlite:///{tmp_path}/coordination.db",
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"),
    }
    try:
        child = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RUN_DAG), str(dag_file), f"ol.{suffix}", state],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        dag_file.unlink(missing_ok=True)
    result = Path(state).read_text() if Path(state).exists() else None
    assert result is not None and result.endswith("success"), (
        child.returncode,
        child.stdout[-3000:],
        child.stderr[-3000:],
    )

    done = completes(events_file)
    publish, summary = done[f"{dag_id}.publish"], done[f"{dag_id}.summary"]
    outputs = {(d["namespace"], d["name"]): d for d in publish["outputs"]}
    iceberg = outputs[("iceberg://finalckpt", "lake.keys")]
    delta = outputs[("file", str(out / "delta" / "keys"))]
    for dataset in (iceberg, delta):
        assert dataset["outputFacets"]["outputStatistics"]["rowCount"] == 3
        fields = {f["name"]: f["type"] for f in dataset["facets"]["schema"]["fields"]}
        assert set(fields) == {"k", "n"}
    assert {f["name"]: f["type"] for f in iceberg["facets"]["schema"]["fields"]} == {
        "k": "string",
        "n": "long",
    }
    assert publish["inputs"] == []
    assert {(d["namespace"], d["name"]) for d in summary["inputs"]} == set(outputs)
    (counts,) = summary["outputs"]
    assert (counts["namespace"], counts["name"]) == ("file", str(out / "counts"))
    assert counts["outputFacets"]["outputStatistics"]["rowCount"] == 3  # n = 1, 2, 3
    assert {f["name"] for f in counts["facets"]["schema"]["fields"]} == {"n", "count"}


EXAMPLE_DAG = """
from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag

dag = build_branching_dag(
    DAG_ID, input_dir=INPUT, output_dir=OUT_DIR, days=DAYS, retries=0, lakehouse=True
)
"""
EXAMPLE_DAYS = 2


def test_example_dag_emits_every_sink_with_schema_and_rows(
    airflow_home: Any, tmp_path: Path
) -> None:
    """The branching example (lakehouse sinks on) in a real ``dag.test()`` with the provider's
    file transport: every stage task completes with an event; ``publish`` and ``carrier_daily``
    report each of their tables (Parquet, SQL, Iceberg, Delta) under its OpenLineage name, with
    the table's columns in the schema facet and the rows committed, equal to the pandas
    reference's row counts."""
    from airflow_finalckpt.examples.nycflights13.branching import STAGE_IDS
    from airflow_finalckpt.examples.nycflights13.data import first_days
    from airflow_finalckpt.examples.nycflights13.reference import (
        CARRIER_DAILY_COLUMNS,
        WINDOW_COLUMNS,
        reference_carrier_daily,
        reference_pipeline,
    )

    suffix = uuid.uuid4().hex[:8]
    dag_id, out = f"lineage_example_{suffix}", tmp_path / "out"
    dag_file = airflow_home.dags_folder / f"test_dag_lineage_example_{suffix}.py"
    dag_file.write_text(
        f"DAG_ID = {dag_id!r}\nOUT_DIR = {str(out)!r}\nINPUT = {str(tmp_path / 'input')!r}\n"
        f"DAYS = {EXAMPLE_DAYS}\n" + EXAMPLE_DAG
    )
    events_file, state = tmp_path / "openlineage.json", str(tmp_path / "state")
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__FINALCKPT__STORE_URL": f"sqlite:///{tmp_path}/coordination.db",
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"),
    }
    try:
        child = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RUN_DAG), str(dag_file), f"ol.{suffix}", state],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        dag_file.unlink(missing_ok=True)
    result = Path(state).read_text() if Path(state).exists() else None
    assert result is not None and result.endswith("success"), (
        child.returncode,
        child.stdout[-3000:],
        child.stderr[-3000:],
    )

    done = completes(events_file)
    assert {f"{dag_id}.{sid}" for sid in STAGE_IDS} <= set(done)
    days = first_days(EXAMPLE_DAYS)
    windows = len(reference_pipeline(days).windows)
    carriers = len(reference_carrier_daily(days))
    assert windows > 0 and carriers > 0
    expected = {
        "publish": (
            {
                ("file", str(out / "delay_windows")),
                # namespace: the database's SQLAlchemy URL (sqlite:////absolute/path.db)
                (f"sqlite:///{out / 'delay_windows.db'}", "delay_windows"),
                ("iceberg://finalckpt", "nycflights13.delay_windows"),
                ("file", str(out / "delta" / "delay_windows")),
            },
            set(WINDOW_COLUMNS),
            windows,
        ),
        "carrier_daily": (
            {
                ("file", str(out / "carrier_daily")),
                ("iceberg://finalckpt", "nycflights13.carrier_daily"),
                ("file", str(out / "delta" / "carrier_daily")),
            },
            set(CARRIER_DAILY_COLUMNS),
            carriers,
        ),
    }
    for stage, (names, columns, rows) in expected.items():
        outputs = {(d["namespace"], d["name"]): d for d in done[f"{dag_id}.{stage}"]["outputs"]}
        assert set(outputs) == names, (stage, sorted(outputs))
        for name, dataset in outputs.items():
            fields = {f["name"]: f["type"] for f in dataset["facets"]["schema"]["fields"]}
            assert set(fields) == columns, (stage, name, fields)
            assert dataset["outputFacets"]["outputStatistics"]["rowCount"] == rows, (stage, name)
        iceberg = next(d for (ns, _), d in outputs.items() if ns.startswith("iceberg://"))
        types = {f["name"]: f["type"] for f in iceberg["facets"]["schema"]["fields"]}
        assert types["flights"] == "long" and types["avg_dep_delay"] == "double", types
    # stages without sinks report no outputs
    for stage in ("ingest", "weather", "enrich", "delay_windows"):
        assert done[f"{dag_id}.{stage}"]["outputs"] == [], stage
