"""Airflow connections as plain values, and what the package makes of them.

``fields``: a connection's fields (parsed by Airflow's own ``Connection`` API where Airflow is
installed); ``database``: the SQLAlchemy URL of a ``postgres`` / ``sqlite`` connection (the
coordination store, SQL sinks, SQL catalogs); ``storage``: the object-store options of an
``aws`` / ``google_cloud_platform`` / ``wasb`` connection, or of any connection whose extra
holds fsspec ``storage_options``; ``resolve``: a connection id to its fields, on the task side.

Nothing here imports Airflow at module level: a Spark driver without Airflow uses it too.
"""
