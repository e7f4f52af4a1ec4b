"""Airflow listeners of airflow-finalckpt (registered by the plugin)."""
