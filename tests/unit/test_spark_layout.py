"""The two sides of ``spark/``: the driver side runs where Spark runs, without Airflow; the
Airflow side (``spark.launch``) runs in the Airflow task."""

from __future__ import annotations

import os
import subprocess
import sys

from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark.job import driver_script

#: run in a fresh interpreter where any ``import airflow...`` raises ImportError
WITHOUT_AIRFLOW = """
import sys
sys.modules["airflow"] = None
import airflow_finalckpt.spark.driver
import airflow_finalckpt.spark.job
loaded = sorted(m for m in sys.modules if m.startswith("airflow_finalckpt.spark"))
print(loaded, "pyspark" in sys.modules)
"""


def test_the_driver_side_imports_without_airflow_and_without_the_launchers() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_AIRFLOW],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = "['airflow_finalckpt.spark', 'airflow_finalckpt.spark.driver', "
    loaded += "'airflow_finalckpt.spark.job', 'airflow_finalckpt.spark.sealed_spec', "
    loaded += "'airflow_finalckpt.spark.secrets'] False"
    # neither spark.launch (Airflow side) nor pyspark until a stage really runs Spark
    assert proc.stdout.strip().splitlines()[-1] == loaded, proc.stdout


def test_the_submitted_application_is_the_driver_module_file() -> None:
    assert driver_script() == os.path.abspath(driver.__file__)
