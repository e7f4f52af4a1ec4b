"""A Parquet table on any fsspec filesystem, published one whole transaction at a time.

Layout under the table root (names starting with ``_`` or ``.`` are hidden from Spark and pyarrow):

- ``_staging/<txn_id>/``: a transaction's data while it is open or pre-committed; pre-commit
  seals it with ``_manifest.json`` (the data files, their sizes and row counts).
- ``txn-<txn_id>/``: a committed transaction, plain Parquet files that any directory reader
  (Spark, pyarrow, DuckDB, pandas) sees. ``txn-<txn_id>/_manifest.json`` is the commit record.
  - commit mode ``rename`` (local filesystems, HDFS): one rename of the sealed staging directory,
    manifest included, so the published directory is complete or absent. Atomic.
  - commit mode ``copy`` (object stores, ``memory://``): the manifest's data files are copied
    (server side) into ``txn-<txn_id>/``, then the manifest is written there (one PUT: the commit
    point), then the staging directory is deleted. A replay copies what is missing.
- ``_commits/<txn_id>.json``: the commit record of the old ``manifest`` mode, whose data stayed
  in ``_staging/<txn_id>/``. Still read; the first commit of a new sink object on the table moves
  such transactions to ``txn-<txn_id>/`` (migration).

The crash-safe file operations these steps rest on are in ``parquet_files``. With
``replace_slice`` a stage's transactions replace the slice's partition directory in one swap
(``parquet_slices``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import fsspec

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks.base import (
    SAFE_IDENTIFIER,
    AlreadyCommittedError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    TwoPhaseCommitSink,
    check_slice,
)
from airflow_finalckpt.sinks.parquet_files import MANIFEST_FORMAT, TableFiles, fsync
from airflow_finalckpt.sinks.parquet_slices import SliceSwap
from airflow_finalckpt.sinks.storage_connection import StorageConnectionMixin

if TYPE_CHECKING:
    import pandas
    import pyarrow
    import pyspark.sql

CommitMode = Literal["auto", "rename", "copy", "manifest"]
ResolvedMode = Literal["rename", "copy"]

STAGING_DIR = "_staging"
COMMITS_DIR = "_commits"
PUBLISHED_PREFIX = "txn-"
MANIFEST_NAME = "_manifest.json"

#: Format of a published ``txn-<id>/_manifest.json`` written by a copy commit or a migration.
PUBLISHED_FORMAT = MANIFEST_FORMAT

#: Filesystems whose directory rename is atomic: ``auto`` commits by rename on these only.
ATOMIC_RENAME_PROTOCOLS = frozenset({"file", "local", "hdfs", "viewfs"})


class ParquetTableSink(StorageConnectionMixin, TwoPhaseCommitSink):
    """Two-phase-commit sink writing Parquet files into ``table_uri``.

    ``commit_mode`` ``auto`` commits by atomic directory rename on local filesystems and HDFS and
    by copying the files (server side) then writing the manifest elsewhere (S3, GCS, memory...).
    Pass ``rename`` only if the filesystem's directory rename is atomic. ``manifest``, the old
    mode that left committed data in the hidden staging folder, is accepted as ``copy``.

    :param sink_id: the sink's id, unique in the pipeline (it names its transactions).
    :param table_uri: the table's directory: a local path or an fsspec URI (``s3://...``).
    :param storage_options: fsspec options of that filesystem (credentials: masked in logs).
    :param commit_mode: ``"auto"`` (default), ``"rename"`` or ``"copy"`` (see above).
    :param replace_slice: ``{column: value}``, the slice of the table one pipeline run owns
        (templated, e.g. ``{"event_date": "{{ ds }}"}``): the stage's commit replaces its rows
        atomically (needs ``commit_mode="final"``); None appends.
    :param storage_conn_id: an Airflow connection (``aws``, ``google_cloud_platform``,
        ``wasb``, or any type whose extra holds fsspec ``storage_options``) giving the
        filesystem's credentials, resolved when the task runs, under ``storage_options``.
    """

    def __init__(
        self,
        sink_id: str,
        table_uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        commit_mode: CommitMode = "auto",
        replace_slice: Mapping[str, Any] | None = None,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__(sink_id)
        self.replace_slice = check_slice(sink_id, replace_slice)
        self._init_storage(storage_options, storage_conn_id)
        self._given_uri = table_uri
        fs, root = fsspec.core.url_to_fs(table_uri, **self.storage_options)
        root = root.rstrip("/")
        if not root:
            raise ConfigurationError(
                f"sink {sink_id!r}: argument table_uri={table_uri!r} must name a directory, "
                "not a root"
            )
        self._fs: fsspec.AbstractFileSystem = fs
        self._files = TableFiles(fs, sink_id)
        self._root = root
        self._local = self._files.local
        #: The URI given to Spark; local paths are made absolute so Spark and fsspec agree.
        self.table_uri = root if self._local else table_uri.rstrip("/")
        self.commit_mode: ResolvedMode = self._resolve_mode(commit_mode)
        self._legacy_checked = False
        self._slices = SliceSwap(self._files, root, sink_id)
        if self.replace_slice and self.commit_mode != "rename":
            raise ConfigurationError(
                f"sink {sink_id!r}: replace_slice swaps a partition directory, which needs a "
                f"filesystem with atomic directory rename (local, HDFS), not {table_uri!r}"
            )

    def _storage_options_changed(self) -> None:
        """Reopen the filesystem with the connection's options (``bind_storage_connection``)."""
        fs, _root = fsspec.core.url_to_fs(self._given_uri, **self.storage_options)
        self._fs = fs
        self._files = TableFiles(fs, self.sink_id)
        self._slices = SliceSwap(self._files, self._root, self.sink_id)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (shipped to a submitted Spark driver) without what a connection resolved
        to: the driver binds ``storage_conn_id`` again from its secrets file.
        """
        state = dict(self.__dict__)
        if self.bound_storage_connection is not None:
            fs, _root = fsspec.core.url_to_fs(self._given_uri, **self._declared_storage_options)
            files = TableFiles(fs, self.sink_id)
            state.update(
                _fs=fs,
                _files=files,
                _slices=SliceSwap(files, self._root, self.sink_id),
                storage_options=dict(self._declared_storage_options),
                bound_storage_connection=None,
                _connection_storage_options={},
            )
        return state

    @property
    def asset_uri(self) -> str:
        """``file:///<table>`` locally, the table URI (``s3://``, ``gs://``...) elsewhere."""
        return f"file://{self.table_uri}" if self._local else self.table_uri

    def _resolve_mode(self, requested: CommitMode) -> ResolvedMode:
        if requested not in ("auto", "rename", "copy", "manifest"):
            raise ConfigurationError(
                f"sink {self.sink_id!r}: argument commit_mode={requested!r} is not one of "
                "'auto', 'rename', 'copy' ('manifest' is the old name of 'copy')"
            )
        if requested == "rename":
            return "rename"
        if requested in ("copy", "manifest"):
            return "copy"
        protocols = self._fs.protocol
        names = {protocols} if isinstance(protocols, str) else set(protocols)
        return "rename" if names & ATOMIC_RENAME_PROTOCOLS else "copy"

    # -- paths -------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return "/".join((self._root, *parts))

    def _uri(self, *parts: str) -> str:
        return "/".join((self.table_uri, *parts))

    def _staging_path(self, txn_id: str) -> str:
        return self._path(STAGING_DIR, txn_id)

    def _published_path(self, txn_id: str) -> str:
        return self._path(PUBLISHED_PREFIX + txn_id)

    def _published_manifest_path(self, txn_id: str) -> str:
        return self._path(PUBLISHED_PREFIX + txn_id, MANIFEST_NAME)

    def _legacy_record_path(self, txn_id: str) -> str:
        """The commit record of the old ``manifest`` mode (data left in ``_staging``)."""
        return self._path(COMMITS_DIR, f"{txn_id}.json")

    def staging_location(self, txn_id: str) -> str:
        """The staging directory URI: a Spark or pyarrow writer may write Parquet files there."""
        return self._uri(STAGING_DIR, self._check_txn_id(txn_id))

    # -- writing -----------------------------------------------------------------------------

    def _check_writable(self, txn_id: str) -> str:
        txn_id = self._check_txn_id(txn_id)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "write to")
        if self._files.exists(self._path(STAGING_DIR, txn_id, MANIFEST_NAME)):
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} is pre-committed and sealed; "
                "data written now would not be covered by its checkpoint (open a new transaction)"
            )
        return txn_id

    def write_arrow(self, txn_id: str, table: pyarrow.Table) -> None:
        """Stage an Arrow table as one new Parquet file (never visible half-written)."""
        import pyarrow.parquet as pq

        txn_id = self._check_writable(txn_id)
        staging = self._staging_path(txn_id)
        self._fs.makedirs(staging, exist_ok=True)
        name = f"part-{uuid.uuid4().hex}.parquet"
        if not self._local:
            with self._fs.open(f"{staging}/{name}", "wb") as handle:
                pq.write_table(table, handle)
            return
        temporary = f"{staging}/_tmp-{name}"
        pq.write_table(table, temporary)
        os.replace(temporary, f"{staging}/{name}")

    def write_pandas(self, txn_id: str, frame: pandas.DataFrame) -> None:
        """Stage a pandas frame (its index is dropped)."""
        import pyarrow as pa

        self.write_arrow(txn_id, pa.Table.from_pandas(frame, preserve_index=False))

    def write_spark(self, txn_id: str, df: pyspark.sql.DataFrame) -> None:
        """Stage a Spark DataFrame with Spark's own Parquet writer (appending to the txn).

        Do not use ``partitionBy``: readers list files recursively and would drop the columns.
        """
        txn_id = self._check_writable(txn_id)
        self._check_rows_in_slice(df)
        df.write.mode("append").parquet(self.staging_location(txn_id))

    # -- two-phase commit --------------------------------------------------------------------

    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        """Flush the staged files to stable storage and seal the transaction with its manifest.

        Idempotent: pre-committing again (a later checkpoint) describes the same files.
        """
        txn_id = self._check_txn_id(txn_id)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "pre-commit")
        staging = self._staging_path(txn_id)
        self._fs.makedirs(staging, exist_ok=True)
        sizes = self._files.data_files(staging)
        files: list[dict[str, Any]] = [
            {"path": relative, "size": size, "rows": self._files.row_count(f"{staging}/{relative}")}
            for relative, size in sizes.items()
        ]
        if self._local:
            self._files.fsync_tree(staging, list(sizes), self._path(STAGING_DIR), self._root)
        rows = sum(entry["rows"] for entry in files)
        manifest = {
            "format": MANIFEST_FORMAT,
            "sink_id": self.sink_id,
            "txn_id": txn_id,
            "checkpoint_id": checkpoint_id,
            "files": files,
            "rows": rows,
            "precommitted_at": time.time(),
        }
        self._files.write_atomically(
            f"{staging}/{MANIFEST_NAME}", json.dumps(manifest, sort_keys=True).encode()
        )
        return SinkTransaction(
            sink_id=self.sink_id,
            txn_id=txn_id,
            checkpoint_id=checkpoint_id,
            payload={
                "commit_mode": self.commit_mode,
                "location": self.staging_location(txn_id),
                "files": [entry["path"] for entry in files],
                "rows": rows,
                "bytes": sum(sizes.values()),
            },
        )

    def commit(self, txn: SinkTransaction) -> bool:
        """Publish a pre-committed transaction exactly once; False if it already was.

        The first commit of a sink object also moves transactions committed by the old
        ``manifest`` mode out of the hidden staging folder (see ``migrate_legacy``).
        """
        txn_id = self._check_owned(txn)
        self._require_checkpoint(txn)
        if not self._legacy_checked:
            self.migrate_legacy()
        if self.is_committed(txn_id):
            self._drop_committed_staging(txn_id)
            return False
        try:
            manifest = self._files.read_manifest(self._path(STAGING_DIR, txn_id, MANIFEST_NAME))
        except FileNotFoundError:
            if self.is_committed(txn_id):  # another committer published it meanwhile
                return False
            raise NotPrecommittedError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} has no pre-committed data to "
                "commit: it was never pre-committed or it was aborted"
            ) from None
        self._check_matches_precommit(txn, manifest)
        if self.commit_mode == "rename" and not self._files.exists(self._published_path(txn_id)):
            return self._commit_by_rename(txn_id)
        # Copy mode, or a rename-mode table holding a copy commit interrupted by a crash.
        return self._commit_by_copy(txn_id, manifest)

    def commit_replacing(self, txns: Sequence[SinkTransaction]) -> bool:
        """The transactions' files replace the slice's partition directory in one swap."""
        for txn in txns:
            self._check_owned(txn)
            self._require_checkpoint(txn)
        assert self.replace_slice
        ids = [t.txn_id for t in txns]
        staging = {t: self._staging_path(t) for t in ids}
        return self._slices.commit(ids, staging, self.replace_slice)

    def _check_matches_precommit(self, txn: SinkTransaction, manifest: dict[str, Any]) -> None:
        expected = txn.payload.get("files")
        staged = [entry["path"] for entry in manifest["files"]]
        if expected is not None and list(expected) != staged:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn.txn_id!r} stages files {staged} but "
                f"was pre-committed with {list(expected)}; refusing to publish unchecked data"
            )

    def _commit_by_rename(self, txn_id: str) -> bool:
        source, target = self._staging_path(txn_id), self._published_path(txn_id)
        try:
            if self._local:
                os.rename(source, target)  # atomic; fails if target exists and is not empty
            else:
                if self._files.exists(target):
                    return False
                self._fs.mv(source, target, recursive=True)
        except OSError:
            # Lost a race against another committer (source gone or target present)?
            if self.is_committed(txn_id):
                return False
            raise
        if self._local:
            fsync(self._root, directory=True)
            fsync(self._path(STAGING_DIR), directory=True)
        return True

    def _commit_by_copy(self, txn_id: str, manifest: dict[str, Any]) -> bool:
        """Copy the sealed files into ``txn-<id>/``, then write the manifest there (the commit
        point, one PUT), then drop the staging directory. Every step can be replayed.
        """
        staging, published = self._staging_path(txn_id), self._published_path(txn_id)
        relative = [entry["path"] for entry in manifest["files"]]
        try:
            self._files.copy_files(
                [f"{staging}/{path}" for path in relative],
                [f"{published}/{path}" for path in relative],
            )
        except FileNotFoundError:
            if self.is_committed(txn_id):  # a racing committer published it and cleaned up
                return False
            raise
        record = {**manifest, "commit_mode": "copy", "committed_at": time.time()}
        created = self._files.create_exclusively(
            self._published_manifest_path(txn_id), json.dumps(record, sort_keys=True).encode()
        )
        self._drop_committed_staging(txn_id)
        return created

    def _drop_committed_staging(self, txn_id: str) -> None:
        """Delete what a copy commit left in ``_staging`` (a crash may leave it), but never the
        data of a transaction committed by the old manifest mode: its rows live there.
        """
        staging = self._staging_path(txn_id)
        if self._files.exists(self._legacy_record_path(txn_id)) or not self._files.exists(staging):
            return
        if self._files.exists(self._published_manifest_path(txn_id)):
            with contextlib.suppress(FileNotFoundError):  # a racing committer removed it first
                self._fs.rm(staging, recursive=True)

    def migrate_legacy(self) -> list[str]:
        """Move every transaction committed by the old ``manifest`` mode (rows left in
        ``_staging/<id>/``, record in ``_commits/<id>.json``) to ``txn-<id>/``; return their ids.

        Per transaction: copy the files, write ``txn-<id>/_manifest.json``, then delete the old
        record and the staging folder. A transaction is committed throughout (by one record or
        the other), readers of the manifests see its rows once, and a crash is finished by the
        next call. Runs on the first ``commit`` of each sink object.
        """
        migrated = []
        for name in sorted(self._files.list_names(self._path(COMMITS_DIR))):
            txn_id = name[: -len(".json")]
            if name.startswith("_tmp-") or not name.endswith(".json"):
                continue
            if not SAFE_IDENTIFIER.fullmatch(txn_id):
                continue
            record = self._files.read_manifest(self._legacy_record_path(txn_id))
            prefix = f"{STAGING_DIR}/{txn_id}/"
            relative = [path[len(prefix) :] for path in record["files"] if path.startswith(prefix)]
            if len(relative) != len(record["files"]):
                raise SinkError(
                    f"sink {self.sink_id!r}: commit record of {txn_id!r} lists files outside "
                    f"{prefix}; not migrating it"
                )
            published = self._published_path(txn_id)
            if not self._files.exists(self._published_manifest_path(txn_id)):
                staging = self._staging_path(txn_id)
                self._files.copy_files(
                    [f"{staging}/{path}" for path in relative],
                    [f"{published}/{path}" for path in relative],
                )
                files = [
                    {
                        "path": path,
                        "size": int(self._fs.size(f"{published}/{path}")),
                        "rows": self._files.row_count(f"{published}/{path}"),
                    }
                    for path in relative
                ]
                document = {
                    "format": PUBLISHED_FORMAT,
                    "sink_id": record.get("sink_id", self.sink_id),
                    "txn_id": txn_id,
                    "checkpoint_id": record.get("checkpoint_id"),
                    "files": files,
                    "rows": sum(entry["rows"] for entry in files),
                    "commit_mode": "migrated",
                    "committed_at": record.get("committed_at"),
                    "migrated_at": time.time(),
                }
                self._files.create_exclusively(
                    self._published_manifest_path(txn_id),
                    json.dumps(document, sort_keys=True).encode(),
                )
            self._fs.rm(self._legacy_record_path(txn_id))
            self._drop_committed_staging(txn_id)
            migrated.append(txn_id)
        self._legacy_checked = True
        return migrated

    def abort(self, txn: SinkTransaction) -> None:
        """Delete the staged data; the manifest goes first so a half-deleted transaction can
        never be committed. Also deletes files an interrupted copy left in ``txn-<id>/`` (no
        manifest there: never committed).
        """
        txn_id = self._check_owned(txn)
        if self.is_committed(txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "abort")
        staging = self._staging_path(txn_id)
        if self._files.exists(staging):
            manifest_path = f"{staging}/{MANIFEST_NAME}"
            if self._files.exists(manifest_path):
                self._fs.rm(manifest_path)
            self._fs.rm(staging, recursive=True)
        published = self._published_path(txn_id)
        if self._files.exists(published):
            self._fs.rm(published, recursive=True)

    # -- state -------------------------------------------------------------------------------

    def is_committed(self, txn_id: str) -> bool:
        """``txn-<id>/_manifest.json`` exists (rename moves it there with the data; a copy
        commit writes it last), or an old-mode ``_commits/<id>.json`` record does.
        """
        txn_id = self._check_txn_id(txn_id)
        if self._files.exists(self._published_manifest_path(txn_id)):
            return True
        if self._files.exists(self._slices.record_path(txn_id)):
            return True
        return self._files.exists(self._legacy_record_path(txn_id))

    def _published_dirs(self) -> dict[str, bool]:
        """``txn-<id>`` directories -> whether they hold their manifest (are committed)."""
        self._fs.invalidate_cache(self._root)
        found: dict[str, bool] = {}
        if not self._fs.exists(self._root):
            return found
        for path in self._fs.find(self._root, maxdepth=2, withdirs=True, detail=False):
            relative = self._fs._strip_protocol(path)[len(self._root) + 1 :].split("/")
            if not relative[0].startswith(PUBLISHED_PREFIX):
                continue
            txn_id = relative[0][len(PUBLISHED_PREFIX) :]
            if not SAFE_IDENTIFIER.fullmatch(txn_id):
                continue
            found[txn_id] = found.get(txn_id, False) or relative[1:] == [MANIFEST_NAME]
        return found

    def committed_txn_ids(self) -> set[str]:
        """Ids of published transactions and of old-mode commit records."""
        committed = {txn_id for txn_id, done in self._published_dirs().items() if done}
        committed |= {
            name[: -len(".json")]
            for name in self._files.list_names(self._path(COMMITS_DIR))
            if name.endswith(".json") and not name.startswith("_tmp-")
        }
        committed |= self._slices.recorded_txn_ids()
        return {txn_id for txn_id in committed if SAFE_IDENTIFIER.fullmatch(txn_id)}

    def staged_txn_ids(self) -> set[str]:
        """Uncommitted transactions with staging directories, or with files an interrupted
        copy commit (or abort) left in ``txn-<id>/``.
        """
        published = self._published_dirs()
        staged = {
            name
            for name in self._files.list_names(self._path(STAGING_DIR))
            if SAFE_IDENTIFIER.fullmatch(name)
        }
        staged |= {txn_id for txn_id, done in published.items() if not done}
        return staged - self.committed_txn_ids()

    # -- readers -----------------------------------------------------------------------------

    def _committed_relative_files(self) -> Iterator[str]:
        if self.replace_slice:
            yield from self._slices.committed_files(len(self.replace_slice))
        recorded = self._slices.recorded_txn_ids()
        for txn_id in sorted(self.committed_txn_ids() - recorded):
            published = self._published_manifest_path(txn_id)
            if self._files.exists(published):
                manifest = self._files.read_manifest(published)
                for entry in manifest["files"]:
                    yield f"{PUBLISHED_PREFIX}{txn_id}/{entry['path']}"
            else:
                record = self._files.read_manifest(self._legacy_record_path(txn_id))
                yield from record["files"]

    def committed_files(self) -> list[str]:
        """URIs of every committed data file, in transaction-id order (for any reader)."""
        return [self._uri(relative) for relative in self._committed_relative_files()]

    def read_arrow(self) -> pyarrow.Table:
        """Committed data only, as one Arrow table (schemas of transactions are unified)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for relative in self._committed_relative_files():
            with self._fs.open(self._path(relative), "rb") as handle:
                tables.append(pq.read_table(handle))
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default")

    def read_pandas(self) -> pandas.DataFrame:
        """Committed data only, as a pandas frame."""
        return self.read_arrow().to_pandas()

    def read_spark(self, spark: pyspark.sql.SparkSession) -> pyspark.sql.DataFrame:
        """Committed data only, as a Spark DataFrame (empty, without columns, if none)."""
        files = self.committed_files()
        if not files:
            from pyspark.sql.types import StructType

            return spark.createDataFrame([], StructType([]))
        return spark.read.parquet(*files)

    def __repr__(self) -> str:
        return (
            f"ParquetTableSink(sink_id={self.sink_id!r}, table_uri={self.table_uri!r}, "
            f"commit_mode={self.commit_mode!r})"
        )
