"""The ``finalckpt`` command line (entry point ``airflow_finalckpt.cli.main:main``)."""
