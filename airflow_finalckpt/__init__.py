"""Airflow 3 provider running multi-stage PySpark pipelines with final checkpoints (FLIP-147)."""
