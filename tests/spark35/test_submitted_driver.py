"""A submitted stage driver on this environment's pyspark (3.5 in CI's spark35 lane, no Airflow).

The Airflow task's half (job spec, code pickled by value) is written by ``task_side.py``, with the
Python of FINALCKPT_TASK_SIDE_PYTHON when set (CI: the newest lane's pyspark 4.x virtualenv, so
4.x's cloudpickle writes what 3.5's reads, as on a Spark 3.5 cluster); then
``spark-submit spark/driver.py --job <spec>`` runs the example's ingest stage against a SQLite
store: every split is processed, the driver's result says finished, and its output parts hold
exactly the input's rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.runtime.runner import RunStatus
from airflow_finalckpt.spark.job import (
    STORAGE_URI_ENV,
    STORE_URL_ENV,
    Files,
    driver_outcome,
    driver_script,
)
from airflow_finalckpt.storage import CheckpointStorage

pytestmark = pytest.mark.slow
TASK_SIDE = Path(__file__).with_name("task_side.py")


def _spark_submit() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def test_the_submitted_driver_runs_an_example_stage(tmp_path: Path) -> None:
    layout = prepare_inputs(tmp_path / "input", days=first_days(4))
    storage_uri = str(tmp_path / "checkpoints")
    store_url = f"sqlite:///{tmp_path}/store.db"
    key = f"spark35-{uuid.uuid4().hex[:8]}"
    task_python = os.environ.get("FINALCKPT_TASK_SIDE_PYTHON") or sys.executable
    # no PYTHONPATH to the checkout: each side imports the package its Python has installed (in
    # CI's spark35 lane the driver's is the lane's wheel, the thing under test)
    env = dict(os.environ)
    spec_uri = subprocess.run(
        [task_python, str(TASK_SIDE), str(layout.root), storage_uri, store_url, key],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()

    driver = subprocess.run(
        [
            _spark_submit(),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            driver_script(),
            "--job",
            spec_uri,
        ],
        capture_output=True,
        text=True,
        env={**env, STORE_URL_ENV: store_url, STORAGE_URI_ENV: storage_uri},
        timeout=540,
    )
    storage = CheckpointStorage(storage_uri)
    doc = Files(storage, key, "ingest").read_json("spark35-1", "result.json")
    assert driver.returncode == 0 and doc is not None and "error" not in doc, (
        driver.stdout[-3000:],
        driver.stderr[-3000:],
        json.dumps(doc)[:3000],
    )
    result = driver_outcome("ingest", "spark35-1", doc, reconnected=False).result
    assert result.status is RunStatus.FINISHED
    assert sorted(result.processed_splits) == sorted(layout.split_ids)
    assert result.end_of_data is not None and result.end_of_data.manifest
    rows = sum(
        pq.read_table(storage.resolve_handle(key, part).removeprefix("file://")).num_rows
        for part in result.end_of_data.manifest
    )
    assert rows == sum(pq.read_metadata(path).num_rows for path in layout.split_paths.values())
