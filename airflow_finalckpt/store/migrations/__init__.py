"""Alembic migrations of the coordination store (driven by ``airflow_finalckpt.store.migrate``)."""
