"""What the table-format sinks (Iceberg, Delta Lake) share: Spark stages Parquet files inside the
table's own directory, where no reader looks until a table commit references them.

Layout of a transaction, under ``<data root>/finalckpt/<sink_id>/<txn_id>/``:

- ``part-*.parquet``: its data files, written by Spark (or pyarrow); no snapshot or log entry
  references them yet, so table readers never see them;
- ``_finalckpt_manifest.json``: written by precommit; seals the files (names, sizes, row counts);
- ``_finalckpt_committed.json``: the manifest renamed after the table commit. The table's history
  is the commit record; this marker keeps a committed transaction recognisable (never aborted,
  never re-committed) after that history was expired.

A subclass says where the data root is, checks and creates the table schema before any file is
written, and publishes the sealed files in ONE table commit that records the transaction id.
"""

from __future__ import annotations

import functools
import json
import os
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks.base import (
    SAFE_IDENTIFIER,
    AlreadyCommittedError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    TwoPhaseCommitSink,
)
from airflow_finalckpt.sinks.parquet_files import fsync
from airflow_finalckpt.sinks.storage_connection import StorageConnectionMixin
from airflow_finalckpt.storage.bounded import MAX_DOCUMENT_BYTES, read_capped

if TYPE_CHECKING:
    import pandas
    import pyarrow
    import pyspark.sql

STAGING_DIR = "finalckpt"
MANIFEST_NAME = "_finalckpt_manifest.json"
COMMITTED_NAME = "_finalckpt_committed.json"
MANIFEST_FORMAT = 1

#: Summary / commit-info keys naming the transaction a table commit published.
SINK_ID_KEY = "finalckpt.sink-id"
TXN_ID_KEY = "finalckpt.txn-id"
CHECKPOINT_ID_KEY = "finalckpt.checkpoint-id"


def first_line(exc: BaseException) -> str:
    """One line for an error message: JVM and catalog errors span pages; their first line
    with content (Py4J's starts with a useless "An error occurred while calling") says it.
    """
    getter = getattr(exc, "getMessage", None)
    text = str(getter() if callable(getter) else exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line.lstrip(": ") for line in lines if not line.startswith("An error occurred")]
    return lines[0][:300] if lines else type(exc).__name__


def spark_uri(uri: str) -> str:
    """Spark's Hadoop filesystems call S3 ``s3a``; table formats store ``s3``."""
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri


def _optional(kind: pyarrow.DataType) -> pyarrow.DataType:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        return pa.struct([f.with_type(_optional(f.type)).with_nullable(True) for f in fields])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = kind.value_field.with_type(_optional(kind.value_type)).with_nullable(True)
        return pa.list_(element) if pa.types.is_list(kind) else pa.large_list(element)
    if pa.types.is_map(kind):
        item = kind.item_field.with_type(_optional(kind.item_type)).with_nullable(True)
        return pa.map_(kind.key_field.with_type(_optional(kind.key_type)), item)
    return kind


def micros_timestamps(table: pyarrow.Table) -> pyarrow.Table:
    """``table`` with nanosecond timestamps cast to microseconds, the unit Iceberg and Delta
    keep (pandas writes nanoseconds).
    """
    import pyarrow as pa

    fields = [
        field.with_type(pa.timestamp("us", tz=field.type.tz))
        if pa.types.is_timestamp(field.type) and field.type.unit == "ns"
        else field
        for field in table.schema
    ]
    return table.cast(pa.schema(fields), safe=False)


def optional_schema(schema: pyarrow.Schema) -> pyarrow.Schema:
    """Every field optional, nested ones too: Spark's nullability follows the query plan, so a
    table created from the first batch must accept the nulls of the next one.
    """
    import pyarrow as pa

    return pa.schema(f.with_type(_optional(f.type)).with_nullable(True) for f in schema)


def _no_step(_name: str) -> None:
    return None


def _plain_path(uri: str) -> str:
    """A local path or an object key without its ``file://`` scheme, for comparing sets."""
    return uri.removeprefix("file://")


P = ParamSpec("P")
R = TypeVar("R")


def storage_errors(method: Callable[P, R]) -> Callable[P, R]:
    """A filesystem error (no permission, disk full, store unreachable) becomes a one-line
    SinkError; every step is idempotent, so the stage retries it once the cause is fixed.
    """

    @functools.wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            sink_id = getattr(args[0], "sink_id", "?")
            raise SinkError(
                f"sink {sink_id!r}: cannot use the table's storage: {first_line(exc)} "
                "(retry once fixed)"
            ) from exc

    return translated


class StagedTableSink(StorageConnectionMixin, TwoPhaseCommitSink):
    """A table-format sink: files staged under the table, published by one table commit."""

    def __init__(
        self,
        sink_id: str,
        storage_options: dict[str, Any] | None = None,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__(sink_id)
        self._init_storage(storage_options, storage_conn_id)
        self._fs_cache: fsspec.AbstractFileSystem | None = None
        #: Called with a step name between the steps of a commit or an abort that a crash can
        #: separate (``table-committed``: the table commit is done, the marker not yet;
        #: ``abort-started``: the manifest and one data file are deleted, the rest not yet).
        #: A no-op; the fault campaign injects crashes here.
        self.on_step: Callable[[str], None] = _no_step

    def _storage_options_changed(self) -> None:
        self._fs_cache = None

    # -- what a table format provides -------------------------------------------------------

    @abstractmethod
    def _data_root(self) -> str | None:
        """URI of the directory holding the table's data files; None if the table is absent."""

    @abstractmethod
    def _prepare_spark(self, df: pyspark.sql.DataFrame) -> pyspark.sql.DataFrame:
        """Create the table from the batch if absent, refuse a mismatching schema (before any
        file is written) and return the frame as it must be written.
        """

    @abstractmethod
    def _prepare_arrow(self, table: pyarrow.Table) -> pyarrow.Table:
        """``_prepare_spark`` for an Arrow table."""

    @abstractmethod
    def _publish(self, txn_id: str, manifest: dict[str, Any]) -> bool:
        """One table commit adding the manifest's files and recording ``txn_id``; False if the
        table turned out to hold it already (a racing committer won).
        """

    def _publish_replacing(self, manifests: dict[str, dict[str, Any]]) -> bool:
        """One table commit removing the slice's rows and adding every manifest's files."""
        raise SinkError(f"sink {self.sink_id!r}: {type(self).__name__} cannot replace a slice")

    @storage_errors
    def commit_replacing(self, txns: Sequence[SinkTransaction]) -> bool:
        """The stage's transactions replace the slice in one table commit (``staged_replace``)."""
        from airflow_finalckpt.sinks.staged_replace import commit_replacing

        return commit_replacing(self, txns)

    @abstractmethod
    def _table_committed(self, candidates: dict[str, dict[str, Any] | None]) -> set[str]:
        """Which of the transaction ids (with their manifest, if still there) the table's
        history records as committed by this sink.
        """

    @abstractmethod
    def _table_txn_ids(self) -> set[str]:
        """Every transaction id of this sink the table's history records."""

    @abstractmethod
    def table_commits(self) -> list[str | None]:
        """One entry per commit in the table's history (Iceberg snapshot, Delta version),
        oldest first: the transaction id this sink recorded in it, None for other writers'.
        """

    @abstractmethod
    def table_files(self) -> set[str]:
        """Paths (no scheme) of the data files the table's current snapshot / version
        references.
        """

    # -- paths and files ---------------------------------------------------------------------

    def _fs(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, path = fsspec.core.url_to_fs(uri, **self.storage_options)
        return fs, path.rstrip("/")

    def _staging_uri(self, txn_id: str) -> str | None:
        root = self._data_root()
        if root is None:
            return None
        return f"{root.rstrip('/')}/{STAGING_DIR}/{self.sink_id}/{txn_id}"

    def staging_location(self, txn_id: str) -> str:
        """Where Spark writes the transaction's files (the table must exist)."""
        uri = self._staging_uri(self._check_txn_id(txn_id))
        if uri is None:
            raise SinkError(f"sink {self.sink_id!r}: the table does not exist yet")
        return uri

    def _sink_dir(self) -> tuple[fsspec.AbstractFileSystem, str] | None:
        root = self._data_root()
        if root is None:
            return None
        return self._fs(f"{root.rstrip('/')}/{STAGING_DIR}/{self.sink_id}")

    def _read_json(self, fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any] | None:
        fs.invalidate_cache(path)
        try:
            what = f"sink {self.sink_id!r}: manifest"
            raw = read_capped(fs, path, MAX_DOCUMENT_BYTES, what=what, error=SinkError)
            document = json.loads(raw)
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            raise SinkError(f"sink {self.sink_id!r}: {path} is not valid JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
            raise SinkError(f"sink {self.sink_id!r}: {path} is not a finalckpt manifest")
        return document

    def _write_json(
        self, fs: fsspec.AbstractFileSystem, path: str, document: dict[str, Any]
    ) -> None:
        """Readers see the old document or the new one, never a torn file."""
        data = json.dumps(document, sort_keys=True).encode()
        if not isinstance(fs, LocalFileSystem):
            fs.pipe_file(path, data)  # one object PUT
            return
        directory = path.rsplit("/", 1)[0]
        temporary = f"{directory}/_tmp-{os.getpid()}-{time.monotonic_ns()}.json"
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        fsync(directory, directory=True)

    def _manifest(self, txn_id: str) -> dict[str, Any] | None:
        uri = self._staging_uri(txn_id)
        if uri is None:
            return None
        fs, path = self._fs(uri)
        return self._read_json(fs, f"{path}/{MANIFEST_NAME}")

    def _has_marker(self, txn_id: str) -> bool:
        uri = self._staging_uri(txn_id)
        if uri is None:
            return False
        fs, path = self._fs(uri)
        fs.invalidate_cache(path)
        return bool(fs.exists(f"{path}/{COMMITTED_NAME}"))

    def _save_manifest(self, txn_id: str, manifest: dict[str, Any]) -> None:
        fs, path = self._fs(self.staging_location(txn_id))
        self._write_json(fs, f"{path}/{MANIFEST_NAME}", manifest)

    def _mark_committed(self, txn_id: str) -> None:
        """The manifest becomes the committed marker (one rename on local disks)."""
        fs, path = self._fs(self.staging_location(txn_id))
        source, target = f"{path}/{MANIFEST_NAME}", f"{path}/{COMMITTED_NAME}"
        if isinstance(fs, LocalFileSystem):
            try:
                os.replace(source, target)
            except FileNotFoundError:
                return  # a racing committer marked it
            fsync(path, directory=True)
            return
        document = self._read_json(fs, source)
        if document is not None:
            fs.pipe_file(target, json.dumps(document, sort_keys=True).encode())
            fs.rm(source)

    # -- writing -----------------------------------------------------------------------------

    def _check_writable(self, txn_id: str) -> str:
        txn_id = self._check_txn_id(txn_id)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "write to")
        if self._manifest(txn_id) is not None:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} is pre-committed and sealed; "
                "data written now would not be covered by its checkpoint (open a new transaction)"
            )
        return txn_id

    @storage_errors
    def write_spark(self, txn_id: str, df: pyspark.sql.DataFrame) -> None:
        """Stage a Spark DataFrame: Spark writes Parquet in parallel (microsecond timestamps,
        not INT96, which other engines misread); nothing goes through this process.
        """
        txn_id = self._check_writable(txn_id)
        self._check_rows_in_slice(df)
        prepared = self._prepare_spark(df)
        target = self.staging_location(txn_id)
        spark = df.sparkSession
        key = "spark.sql.parquet.outputTimestampType"
        previous = spark.conf.get(key)
        spark.conf.set(key, "TIMESTAMP_MICROS")
        try:
            writer = prepared.write.mode("append")
            writer = writer.option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
            writer.parquet(spark_uri(target))
        except Exception as exc:
            raise SinkError(
                f"sink {self.sink_id!r}: Spark could not stage transaction {txn_id!r} in "
                f"{target}: {first_line(exc)}"
            ) from exc
        finally:
            if previous is not None:
                spark.conf.set(key, previous)

    @storage_errors
    def write_arrow(self, txn_id: str, table: pyarrow.Table) -> None:
        """Stage an Arrow table as one Parquet file (small outputs; never seen half-written)."""
        import uuid

        import pyarrow.parquet as pq

        txn_id = self._check_writable(txn_id)
        prepared = self._prepare_arrow(table)
        fs, path = self._fs(self.staging_location(txn_id))
        name = f"part-{uuid.uuid4().hex}.parquet"
        try:
            fs.makedirs(path, exist_ok=True)
            with fs.open(f"{path}/.{name}.tmp", "wb") as handle:
                pq.write_table(prepared, handle, coerce_timestamps="us")
            fs.mv(f"{path}/.{name}.tmp", f"{path}/{name}")
        except OSError as exc:
            raise SinkError(
                f"sink {self.sink_id!r}: cannot stage transaction {txn_id!r} in {path}: {exc}"
            ) from exc

    def write_pandas(self, txn_id: str, frame: pandas.DataFrame) -> None:
        """Stage a pandas frame (its index is dropped)."""
        import pyarrow as pa

        self.write_arrow(txn_id, pa.Table.from_pandas(frame, preserve_index=False))

    # -- two-phase commit --------------------------------------------------------------------

    @storage_errors
    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        """Seal the staged files with a manifest (names, sizes, rows from the Parquet footers).

        Idempotent: pre-committing again (a later checkpoint) describes the same files.
        """
        txn_id = self._check_txn_id(txn_id)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "pre-commit")
        uri = self._staging_uri(txn_id)
        files: list[dict[str, Any]] = []
        if uri is not None:  # None: the table does not exist, so nothing was ever written
            fs, path = self._fs(uri)
            fs.makedirs(path, exist_ok=True)
            files = self._seal_files(fs, path)
            self._write_json(
                fs,
                f"{path}/{MANIFEST_NAME}",
                {
                    "format": MANIFEST_FORMAT,
                    "sink_id": self.sink_id,
                    "txn_id": txn_id,
                    "checkpoint_id": checkpoint_id,
                    "files": files,
                    "rows": sum(entry["rows"] for entry in files),
                    "precommitted_at": time.time(),
                },
            )
        return SinkTransaction(
            sink_id=self.sink_id,
            txn_id=txn_id,
            checkpoint_id=checkpoint_id,
            payload={
                "location": uri,
                "files": [entry["path"] for entry in files],
                "rows": sum(entry["rows"] for entry in files),
                "bytes": sum(entry["size"] for entry in files),
            },
        )

    def _seal_files(self, fs: fsspec.AbstractFileSystem, path: str) -> list[dict[str, Any]]:
        """The data files staged in ``path``; Spark's side files (``.crc``) are removed so
        nothing unreferenced stays in the table directory after commit.
        """
        import pyarrow.parquet as pq

        fs.invalidate_cache(path)
        files: list[dict[str, Any]] = []
        for entry in sorted(fs.ls(path, detail=True), key=lambda item: str(item["name"])):
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name in (MANIFEST_NAME, COMMITTED_NAME):
                continue
            full = f"{path}/{name}"
            if entry.get("type") == "directory" or name.startswith((".", "_")):
                fs.rm(full, recursive=True)
                continue
            try:
                with fs.open(full, "rb") as handle:
                    rows = int(pq.ParquetFile(handle).metadata.num_rows)
            except Exception as exc:  # pyarrow raises ArrowInvalid and friends
                raise SinkError(
                    f"sink {self.sink_id!r}: staged file {full} is not Parquet: {first_line(exc)}"
                ) from exc
            files.append({"path": name, "size": int(entry.get("size") or 0), "rows": rows})
            if isinstance(fs, LocalFileSystem):
                fsync(full)
        if isinstance(fs, LocalFileSystem):
            fsync(path, directory=True)
        return files

    @storage_errors
    def commit(self, txn: SinkTransaction) -> bool:
        """Publish a pre-committed transaction in one table commit; False if it already was."""
        txn_id = self._check_owned(txn)
        self._require_checkpoint(txn)
        if self._has_marker(txn_id):
            return False
        manifest = self._manifest(txn_id)
        if manifest is None:
            if txn.payload.get("location", "") is None:
                return False  # pre-committed before the table existed: nothing to publish
            if self._table_committed({txn_id: None}) or self._has_marker(txn_id):
                return False
            raise NotPrecommittedError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} has no pre-committed files to "
                "commit: it was never pre-committed or it was aborted"
            )
        staged = [entry["path"] for entry in manifest["files"]]
        expected = txn.payload.get("files")
        if expected is not None and list(expected) != staged:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} stages files {staged} but was "
                f"pre-committed with {list(expected)}; refusing to publish unchecked data"
            )
        if not staged:
            published = True  # an empty transaction needs no table commit
        elif self._table_committed({txn_id: manifest}):
            published = False
        else:
            published = self._publish(txn_id, manifest)
        self.on_step("table-committed")
        self._mark_committed(txn_id)
        return published

    @storage_errors
    def abort(self, txn: SinkTransaction) -> None:
        """Delete the staged files, the manifest first (a half-deleted transaction can never be
        committed); refused once committed.
        """
        txn_id = self._check_owned(txn)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "abort")
        uri = self._staging_uri(txn_id)
        if uri is None:
            return
        fs, path = self._fs(uri)
        fs.invalidate_cache(path)
        if not fs.exists(path):
            return
        if fs.exists(f"{path}/{MANIFEST_NAME}"):
            fs.rm(f"{path}/{MANIFEST_NAME}")
        data = sorted(str(p) for p in fs.ls(path, detail=False) if str(p).endswith(".parquet"))
        if data:  # one file first: a crash here leaves a half-deleted, uncommittable directory
            fs.rm(data[0])
        self.on_step("abort-started")
        fs.rm(path, recursive=True)

    # -- state -------------------------------------------------------------------------------

    def _txn_dirs(self) -> dict[str, bool]:
        """Transaction directories of this sink -> whether they carry the committed marker."""
        located = self._sink_dir()
        if located is None:
            return {}
        fs, path = located
        fs.invalidate_cache(path)
        if not fs.exists(path):
            return {}
        found: dict[str, bool] = {}
        for entry in fs.ls(path, detail=False):
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            if SAFE_IDENTIFIER.fullmatch(name):
                found[name] = bool(fs.exists(f"{path}/{name}/{COMMITTED_NAME}"))
        return found

    @storage_errors
    def is_committed(self, txn_id: str) -> bool:
        """The committed marker exists, or the table's history records the transaction."""
        txn_id = self._check_txn_id(txn_id)
        if self._has_marker(txn_id):
            return True
        return bool(self._table_committed({txn_id: self._manifest(txn_id)}))

    @storage_errors
    def committed_txn_ids(self) -> set[str]:
        """Transactions with the committed marker, or recorded in the table's history (a crash
        may have come between the table commit and the marker).
        """
        marked = {txn_id for txn_id, committed in self._txn_dirs().items() if committed}
        return marked | self._table_txn_ids()

    @storage_errors
    def staged_txn_ids(self) -> set[str]:
        """Transaction directories without the committed marker that the table does not
        record either (a crash between the table commit and the marker).
        """
        open_ids = [txn_id for txn_id, committed in self._txn_dirs().items() if not committed]
        if not open_ids:
            return set()
        candidates = {txn_id: self._manifest(txn_id) for txn_id in open_ids}
        return set(open_ids) - self._table_committed(candidates)

    @storage_errors
    def staged_files(self) -> set[str]:
        """Paths (no scheme) of every Parquet file under this sink's staging directories,
        committed or not: after a clean recovery exactly ``table_files()`` (this sink being
        the table's only writer); any other is a leak.
        """
        located = self._sink_dir()
        if located is None:
            return set()
        fs, path = located
        fs.invalidate_cache(path)
        if not fs.exists(path):
            return set()
        return {_plain_path(str(p)) for p in fs.find(path) if str(p).endswith(".parquet")}

    def read_pandas(self) -> pandas.DataFrame:
        """The table's current snapshot / version, as pandas (small tables)."""
        return self.read_arrow().to_pandas()

    @abstractmethod
    def read_arrow(self) -> pyarrow.Table:
        """The table's current snapshot / version, as Arrow (small tables)."""

    def _require_files(self, txn_id: str, manifest: dict[str, Any]) -> list[str]:
        """The manifest's file URIs, each checked to exist (abort or cleanup may have run)."""
        base = self.staging_location(txn_id)
        uris = [f"{base}/{entry['path']}" for entry in manifest["files"]]
        fs, _ = self._fs(base)
        for uri in uris:
            if not fs.exists(self._fs(uri)[1]):
                raise SinkTransactionError(
                    f"sink {self.sink_id!r}: staged file {uri} of transaction {txn_id!r} is gone; "
                    "nothing was committed"
                )
        return uris
