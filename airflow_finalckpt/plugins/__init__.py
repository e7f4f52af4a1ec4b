"""Airflow plugin of airflow-finalckpt (registered by the ``airflow.plugins`` entry point)."""
