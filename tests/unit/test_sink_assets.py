"""Every sink names its table as an Airflow Asset URI in the providers' schemes, which
Airflow accepts as it is (its file handler normalises nothing away)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_finalckpt.sinks import (
    DeltaTableSink,
    IcebergTableSink,
    ParquetTableSink,
    SqlTableSink,
    TwoPhaseCommitSink,
)


def _cases(tmp_path: Path) -> list[tuple[TwoPhaseCommitSink, str]]:
    return [
        (ParquetTableSink("p", str(tmp_path / "orders")), f"file://{tmp_path}/orders"),
        (ParquetTableSink("p", "memory://warehouse/orders"), "memory://warehouse/orders"),
        (
            SqlTableSink("q", "postgresql+psycopg://app:secret@db.example:6543/reports", "totals"),
            "postgres://db.example:6543/reports/public/totals",
        ),
        (
            SqlTableSink("q", f"sqlite:///{tmp_path}/out.db", "totals"),
            f"sqlite:///{tmp_path}/out.db/totals",
        ),
        (
            IcebergTableSink("i", "sales.eu.orders", warehouse=str(tmp_path)),
            "iceberg://finalckpt/sales/eu/orders",
        ),
        (
            IcebergTableSink(
                "i", "db.orders", catalog={"type": "rest", "uri": "http://x"}, catalog_name="prod"
            ),
            "iceberg://prod/db/orders",
        ),
        (DeltaTableSink("d", str(tmp_path / "delta")), f"file://{tmp_path}/delta"),
        (DeltaTableSink("d", "s3://bucket/delta/orders"), "s3://bucket/delta/orders"),
    ]


def test_sinks_name_their_asset_in_provider_schemes(tmp_path: Path) -> None:
    for sink, expected in _cases(tmp_path):
        assert sink.asset_uri == expected, sink


def test_no_asset_uri_carries_its_sinks_credentials() -> None:
    """Asset URIs are shown in the UI and stored in Airflow's tables: the user and password a
    sink connects with must not be in them (checked on the sink's URI, not on an expected
    literal)."""
    sinks: list[TwoPhaseCommitSink] = [
        SqlTableSink("q", "postgresql+psycopg://app:secret@db.example:6543/reports", "totals"),
        IcebergTableSink(
            "i",
            "db.orders",
            catalog={"type": "rest", "uri": "http://app:secret@x"},
            catalog_name="p",
        ),
    ]
    for sink in sinks:
        uri = sink.asset_uri
        assert uri is not None and "secret" not in uri and "app:" not in uri, uri


@pytest.mark.parametrize("index", [0, 1, 2, 4, 6])
def test_airflow_accepts_the_asset_uris(tmp_path: Path, index: int) -> None:
    from airflow.sdk import Asset

    sink, expected = _cases(tmp_path)[index]
    uri = sink.asset_uri
    assert uri == expected
    assert Asset(uri).uri == uri


def test_lakehouse_sinks_survive_pickling_to_a_spark_driver(tmp_path: Path) -> None:
    import pickle

    iceberg = IcebergTableSink(
        "i", "db.orders", warehouse=str(tmp_path), catalog_name="prod", storage_options={"a": 1}
    )
    delta = DeltaTableSink("d", str(tmp_path / "delta"), {"b": "2"}, app_id="pipe-d")
    copy = pickle.loads(pickle.dumps(iceberg))
    assert (copy.sink_id, copy.table_name, copy.warehouse, copy.catalog_name) == (
        "i",
        "db.orders",
        str(tmp_path),
        "prod",
    )
    assert copy.storage_options == {"a": 1} and copy.asset_uri == iceberg.asset_uri
    again = pickle.loads(pickle.dumps(delta))
    assert (again.table_uri, again.storage_options, again.app_id) == (
        str(tmp_path / "delta"),
        {"b": "2"},
        "pipe-d",
    )


def test_openlineage_names_follow_the_naming_spec() -> None:
    from airflow_finalckpt.lineage import dataset_name

    assert dataset_name("file:///data/orders") == ("file", "/data/orders")
    assert dataset_name("s3://bucket/warehouse/orders") == ("s3://bucket", "warehouse/orders")
    assert dataset_name("postgres://db:5432/reports/public/totals") == (
        "postgres://db:5432",
        "reports.public.totals",
    )
    assert dataset_name("iceberg://prod/sales/eu/orders") == ("iceberg://prod", "sales.eu.orders")
    assert dataset_name("sqlite:///tmp/out.db/totals") == ("sqlite:///tmp/out.db", "totals")
