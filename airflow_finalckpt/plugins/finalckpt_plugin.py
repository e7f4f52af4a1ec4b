"""The Airflow plugin of airflow-finalckpt.

Airflow loads it through the ``airflow.plugins`` entry point in every component (API server,
scheduler, triggerer, DAG processor, workers), so this module must stay cheap and side-effect
free: no database, no Spark, no configuration lookups at import time.

For now it only announces the package (``airflow plugins`` lists it). The stop/drain/resume
FastAPI app and the operator extra link are added here once they exist.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class FinalCheckpointPlugin(AirflowPlugin):
    """airflow-finalckpt: Flink-style final checkpoints for multi-stage PySpark pipelines."""

    name = "finalckpt"
