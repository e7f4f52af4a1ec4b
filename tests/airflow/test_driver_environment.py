"""spark-submit no longer hands the worker's whole environment to the driver and its
executors (issue 37): Airflow's connections, variables and configuration (``AIRFLOW_CONN_*``,
``AIRFLOW_VAR_*``, ``AIRFLOW__*``, ``_AIRFLOW_*``) stay in the Airflow task; what Java, Spark,
Python and the storage's clients read, and the launcher's own variables, still reach them. A
real spark-submit (local[1], client mode) runs a stage whose transform records the
environment of the Python driver and of an executor's Python worker."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.spark.job import STORAGE_URI_ENV
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget
from airflow_finalckpt.spark.launch.submit import SubmitLauncher
from airflow_finalckpt.spark.launch.submit_hook import driver_environment
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

pytestmark = pytest.mark.usefixtures("airflow_home")

PLANTED = "Planted-Env-5c1e0b"
AIRFLOW_SECRETS = {
    "AIRFLOW_CONN_WAREHOUSE": f"postgresql://writer:{PLANTED}@warehouse.example/dw",
    "AIRFLOW_VAR_API_TOKEN": PLANTED,
    "AIRFLOW__API_AUTH__JWT_SECRET": PLANTED,
    "_AIRFLOW_WWW_USER_PASSWORD": PLANTED,
}
OUT_ENV = "FINALCKPT_TEST_ENV_OUT"


def record_environment(ctx: Any) -> Any:
    """The transform: writes the driver's and an executor Python worker's environment."""
    out = Path(os.environ[OUT_ENV])
    out.joinpath("driver.json").write_text(json.dumps(dict(os.environ)))
    rdd = ctx.spark.sparkContext.parallelize([0], 1)
    (worker,) = rdd.map(lambda _: json.dumps(dict(os.environ))).collect()
    out.joinpath("executor.json").write_text(worker)
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "split string")


def test_a_submitted_driver_and_its_executors_get_no_airflow_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    Coordinator(engine, "env", writer=storage).register(StageGraph.from_edges(["probe"], []))
    for name, value in AIRFLOW_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(OUT_ENV, str(tmp_path))
    here = str(Path(__file__).resolve().parent)  # the driver imports the transform from here
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, *([path] if path else [])]))
    launcher = SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "local[1]", "client"),
        storage,
        store_url=url,
        store_url_masked=mask_url(url),
        spark_conf={"spark.pyspark.python": sys.executable},
        poll_interval_s=0.1,
    )
    spec = StageSpec(pipeline_key="env", stage_id="probe", splits=("a",), batch_size=1)
    job, code = launcher.build_job(StageJob(spec), StageCode(transform=record_environment))
    outcome = launcher.run(job, code, {})
    assert outcome.result.processed_splits == ("a",)
    for side in ("driver", "executor"):
        seen = json.loads((tmp_path / f"{side}.json").read_text())
        leaked = sorted(n for n in seen if n in AIRFLOW_SECRETS or PLANTED in seen[n])
        assert leaked == [], (side, leaked)
        assert not [n for n in seen if n.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))], side
        assert seen[OUT_ENV] == str(tmp_path), side  # everything else is still there
    driver_env = json.loads((tmp_path / "driver.json").read_text())
    assert driver_env[STORAGE_URI_ENV] == storage.root_uri  # the launcher's own variables


def test_the_scoped_environment_rule() -> None:
    environ = {
        "PATH": "/usr/bin",
        "JAVA_HOME": "/jdk",
        "AWS_PROFILE": "lake",
        "AIRFLOW_HOME": "/opt/airflow",
        "AIRFLOW_CONN_X": "postgresql://u:p@h/d",
        "airflow_var_y": "lower case too",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:p@db/airflow",
        "_AIRFLOW_WWW_USER_PASSWORD": "admin",
    }
    scoped = driver_environment(environ, {STORAGE_URI_ENV: "s3://bucket/ckpt"})
    assert scoped == {
        "PATH": "/usr/bin",
        "JAVA_HOME": "/jdk",
        "AWS_PROFILE": "lake",
        "AIRFLOW_HOME": "/opt/airflow",
        STORAGE_URI_ENV: "s3://bucket/ckpt",
    }
