"""Example pipelines built on airflow-finalckpt."""
