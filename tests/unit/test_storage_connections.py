"""Object-store credentials from Airflow connections (issue 28): real connections in
``AIRFLOW_CONN_*`` (JSON form, parsed by Airflow's own Connection API), rendered for fsspec,
deltalake and pyiceberg; the checkpoint storage's ``storage_conn_id`` applied to a real fsspec
filesystem (``dir://`` over a local directory: without the connection's options it cannot even
be opened); a Parquet sink's ``storage_conn_id`` bound on the driver side from its secrets file,
writing and committing on ``memory://``, and pickled without what it resolved to. The provider
path (AwsBaseHook) needs apache-airflow-providers-amazon, in no extra: CI's floors lane installs
it and runs this file (``FINALCKPT_REQUIRE_AMAZON=1``: that test fails there instead of
skipping); elsewhere the aws connections take the generic mapping."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

from airflow_finalckpt.config import load_settings, storage_options_with_connection
from airflow_finalckpt.connections.fields import ConnectionFields
from airflow_finalckpt.connections.storage import storage_options
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink, ParquetTableSink
from airflow_finalckpt.sinks.connections import (
    bind_from_secrets,
    connection_secrets,
    unbound_sinks,
)
from airflow_finalckpt.storage import CheckpointStorage

PLANTED = "Storage-Planted-Secret-91"


@pytest.fixture(autouse=True)
def _isolated(isolated_settings_env: Path) -> Path:
    return isolated_settings_env


def _env_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, doc: dict[str, object]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(doc))


def test_an_aws_connection_renders_for_fsspec_deltalake_and_pyiceberg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env_conn(
        monkeypatch,
        "lake_s3",
        {
            "conn_type": "aws",
            "login": "AKIAEXAMPLE",
            "password": PLANTED,
            "extra": {
                "region_name": "eu-west-1",
                "endpoint_url": "http://minio:9000",
                "storage_options": {"default_block_size": 1048576},
            },
        },
    )
    fields = ConnectionFields.from_env("lake_s3")
    assert fields is not None and fields.conn_type == "aws"

    assert storage_options(fields, "fsspec", "t") == {
        "key": "AKIAEXAMPLE",
        "secret": PLANTED,
        "endpoint_url": "http://minio:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "default_block_size": 1048576,
    }
    assert storage_options(fields, "delta", "t") == {
        "aws_access_key_id": "AKIAEXAMPLE",
        "aws_secret_access_key": PLANTED,
        "aws_region": "eu-west-1",
        "aws_endpoint_url": "http://minio:9000",
        "aws_allow_http": "true",
        "default_block_size": 1048576,
    }
    assert storage_options(fields, "iceberg", "t") == {
        "s3.access-key-id": "AKIAEXAMPLE",
        "s3.secret-access-key": PLANTED,
        "s3.region": "eu-west-1",
        "s3.endpoint": "http://minio:9000",
    }


def test_google_and_azure_connections_render_their_fields() -> None:
    keyfile = {"type": "service_account", "project_id": "p1"}
    google = ConnectionFields(
        "gcs",
        "google_cloud_platform",
        extra={"extra__google_cloud_platform__keyfile_dict": json.dumps(keyfile), "project": "p1"},
    )
    assert storage_options(google, "fsspec", "t") == {"token": keyfile, "project": "p1"}
    assert storage_options(google, "delta", "t") == {
        "google_service_account_key": json.dumps(keyfile)
    }
    shared_key = ConnectionFields("abfs", "wasb", login="acct", password=PLANTED)
    assert storage_options(shared_key, "fsspec", "t") == {
        "account_name": "acct",
        "account_key": PLANTED,
    }
    principal = ConnectionFields(
        "abfs_sp",
        "wasb",
        login="client",
        password=PLANTED,
        extra={"tenant_id": "tenant", "account_name": "acct"},
    )
    assert storage_options(principal, "iceberg", "t") == {
        "adls.account-name": "acct",
        "adls.tenant-id": "tenant",
        "adls.client-id": "client",
        "adls.client-secret": PLANTED,
    }
    bad = ConnectionFields("x", "generic", extra={"storage_options": [1]})
    with pytest.raises(ConfigurationError, match="extra storage_options must be a JSON object"):
        storage_options(bad, "fsspec", "sink 'out'")


def test_checkpoint_storage_takes_its_options_from_storage_conn_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "bucket"
    base.mkdir()
    _env_conn(
        monkeypatch,
        "ckpt_fs",
        {
            "conn_type": "generic",
            "extra": {"storage_options": {"path": str(base), "target_protocol": "file"}},
        },
    )
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", "dir://checkpoints")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_OPTIONS", '{"auto_mkdir": true}')
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_CONN_ID", "ckpt_fs")

    settings = load_settings()

    assert settings.storage_options == {
        "path": str(base),
        "target_protocol": "file",
        "auto_mkdir": True,
    }
    assert settings.sources["storage_options"] == (
        "env AIRFLOW__FINALCKPT__STORAGE_OPTIONS + Airflow connection ckpt_fs"
    )
    assert "storage_conn_id = ckpt_fs" in settings.describe()
    storage = CheckpointStorage(settings.storage_uri, settings.storage_options)
    fs, root = fsspec.core.url_to_fs(settings.storage_uri, **settings.storage_options)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/probe", b"x")  # the real directory under the connection's path
    assert (base / "checkpoints" / "probe").read_bytes() == b"x"
    assert storage is not None
    assert storage_options_with_connection() == settings.storage_options  # the CLI's progress

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_CONN_ID", "no_such_storage")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert str(info.value) == (
        "checkpoint storage: Airflow connection 'no_such_storage' (storage_conn_id) is not "
        "defined; create it (e.g. AIRFLOW_CONN_NO_SUCH_STORAGE, a secrets backend or the UI) or "
        "pass storage_options directly"
    )


def test_a_parquet_sink_binds_its_storage_connection_on_the_driver_and_pickles_its_id_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = f"memory://conn-{uuid.uuid4().hex[:8]}/rows"
    sink = ParquetTableSink("out", table, {"skip_instance_cache": True}, storage_conn_id="lake")
    assert unbound_sinks([sink]) == [sink]
    _env_conn(
        monkeypatch,
        "lake",
        {"conn_type": "generic", "extra": {"storage_options": {"token": PLANTED}}},
    )
    bind_from_secrets([sink], {})  # the driver without a secrets entry: AIRFLOW_CONN_LAKE
    assert unbound_sinks([sink]) == []
    assert sink.storage_options == {"token": PLANTED, "skip_instance_cache": True}
    assert sink._fs.storage_options["token"] == PLANTED

    sink.write_arrow("t1", pa.table({"n": [1, 2]}))
    sink.commit(sink.precommit("t1", 1))
    assert sink.read_arrow().column("n").to_pylist() == [1, 2]

    blob = pickle.dumps(sink)
    assert PLANTED.encode() not in blob
    shipped = pickle.loads(blob)
    assert unbound_sinks([shipped]) == [shipped]
    monkeypatch.delenv("AIRFLOW_CONN_LAKE")
    bind_from_secrets([shipped], connection_secrets([sink]))  # the secrets file
    assert shipped.storage_options == sink.storage_options


def test_delta_and_iceberg_sinks_take_the_table_library_spelling(
    tmp_path: Path,
) -> None:
    aws = ConnectionFields("lake_s3", "aws", login="AKIAEXAMPLE", password=PLANTED)
    delta = DeltaTableSink("d", str(tmp_path / "d"), {"timeout": "30s"}, storage_conn_id="lake_s3")
    with pytest.raises(ConfigurationError, match="'lake_s3' is resolved when the stage task"):
        delta.table()
    delta.bind_storage_connection(aws)
    assert delta._string_options() == {
        "aws_access_key_id": "AKIAEXAMPLE",
        "aws_secret_access_key": PLANTED,
        "timeout": "30s",
    }
    assert delta.storage_options == {"key": "AKIAEXAMPLE", "secret": PLANTED, "timeout": "30s"}
    assert PLANTED.encode() not in pickle.dumps(delta)
    assert delta.table() is None  # deltalake opened the (absent) local table with those options

    iceberg = IcebergTableSink(
        "i", "ns.rows", warehouse=str(tmp_path / "wh"), storage_conn_id="lake_s3"
    )
    iceberg.bind_storage_connection(aws)
    properties = iceberg._bound_properties()
    assert properties["s3.secret-access-key"] == PLANTED
    assert properties["type"] == "sql"
    assert connection_secrets([iceberg]) == {"storage:lake_s3": aws.to_json()}
    assert PLANTED.encode() not in pickle.dumps(iceberg)


def test_an_aws_profile_connection_resolves_through_the_amazon_providers_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where apache-airflow-providers-amazon is installed (in no extra; CI's floors lane:
    docs/compatibility.md): a connection naming a profile holds no key; AwsBaseHook reads the
    profile from the shared credentials file and the sink gets its keys."""
    if os.environ.get("FINALCKPT_REQUIRE_AMAZON") == "1":
        import airflow.providers.amazon.aws.hooks.base_aws  # noqa: F401  (an ImportError fails)
    else:
        pytest.importorskip("airflow.providers.amazon.aws.hooks.base_aws")
    from airflow_finalckpt.connections.resolve import resolve_storage_options

    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[lake]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = {PLANTED}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    _env_conn(
        monkeypatch,
        "lake_profile",
        {"conn_type": "aws", "extra": {"profile_name": "lake", "region_name": "eu-west-1"}},
    )
    fields = ConnectionFields.from_env("lake_profile")
    assert fields is not None and storage_options(fields, "fsspec", "t") == {
        "client_kwargs": {"region_name": "eu-west-1"}
    }  # the generic mapping alone has no key

    assert resolve_storage_options("lake_profile", "t", "fsspec") == {
        "key": "AKIAPROFILE",
        "secret": PLANTED,
        "client_kwargs": {"region_name": "eu-west-1"},
    }


@pytest.mark.parametrize(
    "uri",
    [
        "postgresql://user:p%40ss%2Fw@db.example:6543/coord?sslmode=require&cursor=dictcursor",
        'postgres://u@Host.Example/db?__extra__={"sslmode": "verify-full", "iam": true}',
        "sqlite:////abs/path.db",
        "sqlite://%2Fabs%2FPath.db",
        "aws://AKIA:se%2Fcret@/?region_name=eu-west-1&endpoint_url=http%3A%2F%2Fminio%3A9000",
        "google-cloud-platform://?key_path=%2Fkeys%2Fsa.json&project=p1",
    ],
)
def test_the_fallback_parser_reads_uris_as_airflows_connection_api(uri: str) -> None:
    """Where Airflow is absent (a Spark driver) ``AIRFLOW_CONN_*`` is parsed without it: the
    same fields as Airflow's own ``Connection.from_uri``, which is used wherever it exists."""
    from airflow.sdk.definitions.connection import Connection

    from airflow_finalckpt.connections.fields import _from_uri

    assert _from_uri("c", uri) == ConnectionFields.of(Connection.from_uri(uri, conn_id="c"))
