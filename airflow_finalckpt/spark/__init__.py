"""Spark: the driver side of a stage, and (in ``spark.launch``) the Airflow side that starts it.

Two sides, kept apart so a Spark driver runs without Airflow installed:

- the driver side, here: ``driver`` (the stage logic factory and the ``spark-submit``
  entry point), ``job`` (the job spec and result files it exchanges with the Airflow task),
  ``stage`` (the Spark adapter of the stage runtime) and ``windows`` (event-time windows). These
  run inside Spark's driver and never import Airflow, nor ``spark.launch``;
- the Airflow side, ``spark.launch``: runs in the Airflow task and decides where the driver
  runs (``launch``), submits it through ``spark-submit`` (``launch.submit``) and reattaches to
  it across task tries (``launch.resumable``).
"""
