"""OpenLineage for a stage: what Airflow's OpenLineage provider asks the stage operator for when
the task succeeded (``get_openlineage_facets_on_complete``).

Outputs are the stage's sink tables, named after the OpenLineage naming spec from the sinks'
Asset URIs, with their schema and the rows the stage committed to each; inputs are the tables
its upstream stages published. Needs ``apache-airflow-providers-openlineage`` (imported only
when the provider calls).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from airflow_finalckpt.sinks.base import TwoPhaseCommitSink


def dataset_name(asset_uri: str) -> tuple[str, str]:
    """(namespace, name) of a sink's Asset URI in OpenLineage's naming: ``file`` + path,
    ``s3://bucket`` + key, ``postgres://host:port`` + ``db.schema.table``,
    ``iceberg://catalog`` + ``namespace.table``.
    """
    parts = urlsplit(asset_uri)
    path = parts.path.strip("/")
    if parts.scheme == "file":
        return "file", parts.path
    if parts.scheme == "postgres":
        return f"postgres://{parts.netloc}", path.replace("/", ".")
    if parts.scheme == "iceberg":
        return f"iceberg://{parts.netloc}", path.replace("/", ".")
    if parts.scheme == "sqlite":
        database, table = os.path.split(parts.path)
        return f"sqlite://{database}", table
    return f"{parts.scheme}://{parts.netloc}", path


def sink_fields(sink: TwoPhaseCommitSink) -> list[tuple[str, str]]:
    """The columns (name, type) of a sink's table; empty if it has none yet."""
    from airflow_finalckpt.sinks import (
        DeltaTableSink,
        IcebergTableSink,
        ParquetTableSink,
        SqlTableSink,
    )

    if isinstance(sink, IcebergTableSink):
        table = sink.table()
        return [] if table is None else [(f.name, str(f.field_type)) for f in table.schema().fields]
    if isinstance(sink, DeltaTableSink):
        return _delta_fields(sink)
    if isinstance(sink, SqlTableSink):
        tables = sink._data_tables()
        return [] if tables is None else [(c.name, str(c.type)) for c in tables[0].columns]
    if isinstance(sink, ParquetTableSink):
        import fsspec
        import pyarrow.parquet as pq

        files = sink.committed_files()
        if not files:
            return []
        with fsspec.open(files[0], "rb") as handle:  # one footer, not the data
            return [(f.name, str(f.type)) for f in pq.read_schema(handle)]
    return []


def _delta_fields(sink: Any) -> list[tuple[str, str]]:
    """The Delta table's schema from its log (JSON commits, newest metaData wins), not through
    deltalake: the provider emits from a forked process by default, where deltalake's tokio
    runtime panics.
    """
    import json

    import fsspec

    fs, root = fsspec.core.url_to_fs(f"{sink.table_uri}/_delta_log", **sink.storage_options)
    schema: str | None = None
    for path in sorted(p for p in fs.ls(root, detail=False) if str(p).endswith(".json")):
        with fs.open(path, "rb") as handle:
            for line in handle.read().decode().splitlines():
                action = json.loads(line) if line.strip() else {}
                if "metaData" in action:
                    schema = action["metaData"]["schemaString"]
    if schema is None:
        return []
    return [(f["name"], json.dumps(f["type"]).strip('"')) for f in json.loads(schema)["fields"]]


def output_dataset(sink: TwoPhaseCommitSink, rows: int | None) -> Any:
    """The OpenLineage output dataset of a sink: its namespace and name, schema and row count."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset, schema_dataset

    assert sink.asset_uri is not None
    namespace, name = dataset_name(sink.asset_uri)
    fields = [
        schema_dataset.SchemaDatasetFacetFields(name=column, type=kind)
        for column, kind in sink_fields(sink)
    ]
    statistics = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=rows)
    return OutputDataset(
        namespace=namespace,
        name=name,
        facets={"schema": schema_dataset.SchemaDatasetFacet(fields=fields)},
        outputFacets={"outputStatistics": statistics},
    )


def committed_rows(transactions: list[tuple[Any, str]]) -> dict[str, int]:
    """Rows per sink of a stage's committed transactions (from their pre-commit payload), not
    counting those a recompute superseded.
    """
    from airflow_finalckpt.core.partitions import counts

    rows: dict[str, int] = {}
    for txn, state in transactions:
        if counts(txn, state):
            rows[txn.sink_id] = rows.get(txn.sink_id, 0) + int(txn.payload.get("rows") or 0)
    return rows


def stage_lineage(operator: Any, task_instance: Any) -> Any:
    """The OperatorLineage of a succeeded stage task."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset

    context = task_instance.get_template_context()
    coordinator = operator._hook().get_coordinator(
        getattr(operator, "_pipeline_key", None) or operator._resolve_key(context).pipeline_key
    )
    rows = committed_rows(coordinator.transactions(operator.stage_id))
    outputs = [
        output_dataset(sink, rows.get(sink.sink_id, 0))
        for sink in operator.sinks
        if sink.asset_uri is not None
    ]
    inputs = [
        InputDataset(*dataset_name(sink.asset_uri))
        for upstream in operator._upstream_stage_tasks()
        for sink in upstream.sinks
        if sink.asset_uri is not None
    ]
    return OperatorLineage(inputs=inputs, outputs=outputs)
