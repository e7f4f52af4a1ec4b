"""Benchmarks of airflow-finalckpt against plain PySpark / Airflow baselines.

Run everything with ``python -m benchmarks.run`` (``--quick`` for a smoke run, ``--only NAME``
for one benchmark); results go to ``benchmarks/results/*.json`` plus PNG charts. See
``docs/benchmarks.md`` for the measured numbers and the JSON shape.
"""
