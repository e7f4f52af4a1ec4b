"""A Delta Lake table: Spark stages Parquet files in the table directory, deltalake adds them in
one Delta transaction carrying an application transaction (``txn``) record.

- write: a batch whose schema differs from the table's is refused before any file is written;
  Spark writes under ``<table>/finalckpt/<sink_id>/<txn_id>/``, which no log entry references.
- precommit: the files are listed and sealed in a manifest beside them (see ``staged``).
- commit: ONE Delta commit of ``add`` actions (metadata only), with
  ``txn(appId=<app_id>, version=<previous + 1>)`` and ``finalckpt.txn-id`` in its commitInfo.
  Before the first attempt the table version is written into the manifest: a replay reads the
  log after that version only, and finds its own commit (the ``txn`` version it carries is a
  monotonic count of this sink's commits); the commit also carries one ``txn`` record per
  transaction (``appId=finalckpt-<sink_id>/<txn_id>``), which the log's checkpoints keep when
  log cleanup removes the JSON entry, so a replay after a cleanup finds it too. The log entry
  is created exclusively (no automatic
  retry), so two committers of one transaction cannot both succeed; the loser re-checks the log.
  A commit lost to another writer (concurrent runs) is retried on the new version, bounded
  (``commit_retry``).
  The first commit creates the table (version 0), so versions equal commits.
- commit with ``replace_slice``: all the stage's transactions in ONE Delta commit that removes
  the slice's files (by their min / max statistics; our files carry them for the slice
  columns) and adds the new ones, see ``staged_replace``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.connections.fields import ConnectionFields
from airflow_finalckpt.connections.storage import storage_options as connection_storage_options
from airflow_finalckpt.sinks.base import SinkError, check_slice
from airflow_finalckpt.sinks.commit_retry import CommitConflict, commit_retrying
from airflow_finalckpt.sinks.staged import (
    CHECKPOINT_ID_KEY,
    SINK_ID_KEY,
    STAGING_DIR,
    TXN_ID_KEY,
    StagedTableSink,
    first_line,
    micros_timestamps,
    optional_schema,
)
from airflow_finalckpt.sinks.staged_replace import SLICE_KEY, TXN_IDS_KEY, file_in_slice, txn_ids_of

if TYPE_CHECKING:
    import pyarrow
    import pyspark.sql
    from deltalake import DeltaTable

#: Manifest field: the table version before this transaction's first commit attempt.
VERSION_BEFORE_KEY = "delta_version_before_commit"


def _strip_metadata(schema: dict[str, Any]) -> Any:
    """A Spark / Delta schema JSON without field metadata and top-level nullability."""
    if isinstance(schema, dict):
        return {k: _strip_metadata(v) for k, v in schema.items() if k != "metadata"}
    if isinstance(schema, list):
        return [_strip_metadata(item) for item in schema]
    return schema


def delta_schema_mismatch(table: dict[str, Any], batch: dict[str, Any]) -> str | None:
    """Why a batch (Spark schema JSON) cannot go into a Delta table (same JSON format)."""
    have = {f["name"]: f for f in table["fields"]}
    got = {f["name"]: f for f in batch["fields"]}
    problems = []
    if missing := [name for name in have if name not in got]:
        problems.append(f"batch lacks columns {missing}")
    if extra := [name for name in got if name not in have]:
        problems.append(f"table has no columns {extra}")
    changed = sorted(
        f"{name} {json.dumps(_strip_metadata(have[name]['type']))} vs "
        f"{json.dumps(_strip_metadata(got[name]['type']))}"
        for name in have.keys() & got.keys()
        if _strip_metadata(have[name]["type"]) != _strip_metadata(got[name]["type"])
    )
    if changed:
        problems.append(f"types differ (table vs batch): {changed}")
    nullable = sorted(
        n for n in have.keys() & got.keys() if not have[n]["nullable"] and got[n]["nullable"]
    )
    if nullable:
        problems.append(f"columns {nullable} are not nullable in the table, nullable here")
    return "; ".join(problems) or None


class DeltaTableSink(StagedTableSink):
    """Two-phase-commit sink appending to the Delta table at ``table_uri``.

    ``app_id`` names this writer in the table's ``txn`` records (default
    ``finalckpt-<sink_id>``); give each pipeline writing the table its own, e.g.
    ``f"{pipeline_key}-{sink_id}"``.

    :param sink_id: the sink's id, unique in the pipeline (it names its transactions).
    :param table_uri: the Delta table's location: a local path or an object store URI.
    :param storage_options: the object store's options (deltalake's and fsspec's keys).
    :param app_id: this writer's application id in the table's ``txn`` records (default
        ``finalckpt-<sink_id>``).
    :param replace_slice: ``{column: value}``, the slice of the table one pipeline run owns
        (templated, e.g. ``{"event_date": "{{ ds }}"}``): the stage's commit replaces its rows
        atomically (needs ``commit_mode="final"``); None appends.
    :param storage_conn_id: an Airflow connection (``aws``, ``google_cloud_platform``,
        ``wasb``, or any type whose extra holds fsspec ``storage_options``) giving the object
        store's credentials, resolved when the task runs: deltalake's keys and fsspec's, under
        ``storage_options``.
    """

    def __init__(
        self,
        sink_id: str,
        table_uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        app_id: str | None = None,
        replace_slice: Mapping[str, Any] | None = None,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__(sink_id, storage_options, storage_conn_id)
        self._delta_options: dict[str, str] = {}
        self.replace_slice = check_slice(sink_id, replace_slice)
        local = "://" not in table_uri or table_uri.startswith("file://")
        path = table_uri.removeprefix("file://")
        self.table_uri = os.path.abspath(path).rstrip("/") if local else table_uri.rstrip("/")
        self.app_id = app_id or f"finalckpt-{sink_id}"

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (shipped to a submitted Spark driver): rebuilt from its arguments."""
        return (
            _rebuild,
            (
                self.sink_id,
                self.table_uri,
                self._declared_storage_options or None,
                self.app_id,
                self.replace_slice,
                self.storage_conn_id,
            ),
        )

    @property
    def asset_uri(self) -> str:
        """The table directory: ``file:///<path>`` locally, ``s3://``... elsewhere."""
        return self.table_uri if "://" in self.table_uri else f"file://{self.table_uri}"

    def _data_root(self) -> str:
        return self.table_uri

    def _open(self) -> DeltaTable | None:
        """The table at its latest version; None if there is none yet."""
        from deltalake import DeltaTable

        options = self._string_options()
        try:
            if not DeltaTable.is_deltatable(self.table_uri, storage_options=options):
                return None
            return DeltaTable(self.table_uri, storage_options=options)
        except Exception as exc:
            raise SinkError(
                f"sink {self.sink_id!r}: cannot open Delta table {self.table_uri}: "
                f"{first_line(exc)}"
            ) from exc

    # -- schema ------------------------------------------------------------------------------

    def _check_schema(self, batch: dict[str, Any]) -> None:
        table = self._open()
        if table is None:
            return  # the first commit creates the table from the staged files
        problem = delta_schema_mismatch(json.loads(table.schema().to_json()), batch)
        if problem is not None:
            raise SinkError(
                f"sink {self.sink_id!r}: Delta table {self.table_uri} has another schema: "
                f"{problem}; nothing was written"
            )

    def _prepare_spark(self, df: pyspark.sql.DataFrame) -> pyspark.sql.DataFrame:
        self._check_schema(df.schema.jsonValue())
        return df

    def _prepare_arrow(self, table: pyarrow.Table) -> pyarrow.Table:
        from deltalake import Schema

        table = micros_timestamps(table)
        self._check_schema(json.loads(Schema.from_arrow(table.schema).to_json()))
        return table

    # -- commit ------------------------------------------------------------------------------

    def _commits_after(self, table: DeltaTable, version: int) -> list[dict[str, Any]]:
        """CommitInfo of the versions after ``version`` (newest first)."""
        newer = table.version() - version
        return [] if newer <= 0 else list(table.history(limit=newer))

    def _mine(self, info: dict[str, Any]) -> str | None:
        if info.get(SINK_ID_KEY) == self.sink_id and info.get(TXN_ID_KEY) is not None:
            return str(info[TXN_ID_KEY])
        return None

    def _all_mine(self, info: dict[str, Any]) -> set[str]:
        """Every transaction id a commit of this sink records (a slice replace records all)."""
        return txn_ids_of(info, TXN_ID_KEY) if info.get(SINK_ID_KEY) == self.sink_id else set()

    def _table_committed(self, candidates: dict[str, dict[str, Any] | None]) -> set[str]:
        """Only transactions whose commit was attempted (version noted in the manifest) can be
        in the log; it is read from the earliest such version on.
        """
        attempted = {
            txn_id: int(manifest[VERSION_BEFORE_KEY])
            for txn_id, manifest in candidates.items()
            if manifest is not None and VERSION_BEFORE_KEY in manifest
        }
        if not attempted:
            return set()
        table = self._open()
        if table is None:
            return set()
        found = {t for t in attempted if table.transaction_version(self._txn_app_id(t))}
        for info in self._commits_after(table, min(attempted.values())):
            found |= self._all_mine(info)
        return set(attempted) & found

    def _txn_app_id(self, txn_id: str) -> str:
        """The ``txn`` application id recording one transaction's commit (log cleanup keeps
        ``txn`` records in the checkpoints; it drops the commit info).
        """
        return f"finalckpt-{self.sink_id}/{txn_id}"

    def _table_txn_ids(self) -> set[str]:
        table = self._open()
        if table is None:
            return set()
        return {t for info in self._commits_after(table, -1) for t in self._all_mine(info)}

    def table_commits(self) -> list[str | None]:
        """The Delta log's versions, oldest first: this sink's transaction id or None for others."""
        table = self._open()
        if table is None:
            return []
        history = sorted(self._commits_after(table, -1), key=lambda info: int(info["version"]))
        return [self._mine(info) for info in history]

    def table_files(self) -> set[str]:
        """Paths of the Parquet files the current Delta version references."""
        table = self._open()
        return (
            set() if table is None else {str(u).removeprefix("file://") for u in table.file_uris()}
        )

    def _add_actions(self, txn_id: str, manifest: dict[str, Any]) -> list[Any]:
        from deltalake.transaction import AddAction

        now = int(time.time() * 1000)
        prefix = f"{STAGING_DIR}/{self.sink_id}/{txn_id}"
        return [
            AddAction(
                path=f"{prefix}/{entry['path']}",
                size=int(entry["size"]),
                partition_values={},
                modification_time=now,
                data_change=True,
                stats=json.dumps(self._stats(int(entry["rows"]))),
            )
            for entry in manifest["files"]
        ]

    def _stats(self, rows: int) -> dict[str, Any]:
        """``numRecords``; with a slice also its columns' min / max (every row of a file in
        a slice has the slice's values: ``write_spark`` checks it), so the next rerun's
        replace finds the file.
        """
        stats: dict[str, Any] = {"numRecords": rows}
        if self.replace_slice and rows:
            stats["minValues"] = dict(self.replace_slice)
            stats["maxValues"] = dict(self.replace_slice)
            stats["nullCount"] = dict.fromkeys(self.replace_slice, 0)
        return stats

    def _remove_actions(self, table: DeltaTable) -> list[Any]:
        """The files of the slice, from their statistics; a file that may hold rows of the
        slice and others cannot be replaced by file: refused, nothing committed.
        """
        import pyarrow as pa
        from deltalake.transaction import RemoveAction

        assert self.replace_slice
        now = int(time.time() * 1000)
        removes = []
        for row in pa.table(table.get_add_actions(flatten=True)).to_pylist():
            verdicts = {
                file_in_slice(row.get(f"min.{c}"), row.get(f"max.{c}"), v)
                for c, v in self.replace_slice.items()
            }
            if False in verdicts:
                continue
            if None in verdicts:
                raise SinkError(
                    f"sink {self.sink_id!r}: Delta file {row['path']} may hold rows of slice "
                    f"{self.replace_slice} and others (no min/max statistics, or a range "
                    "around it); cannot replace the slice by file; nothing was committed"
                )
            removes.append(
                RemoveAction(
                    path=str(row["path"]),
                    data_change=True,
                    deletion_timestamp=now,
                    size=int(row["size_bytes"]),
                    partition_values={},
                )
            )
        return removes

    def _publish_replacing(self, manifests: dict[str, dict[str, Any]]) -> bool:
        return self._commit_files(manifests, replace=True)

    def _files_schema(self, uris: list[str]) -> Any:
        """The Delta schema of the staged files, every column nullable (from the first footer;
        the writes checked them all against the table).
        """
        import pyarrow.parquet as pq
        from deltalake import Schema

        fs, path = self._fs(uris[0])
        with fs.open(path, "rb") as handle:
            arrow_schema = pq.read_schema(handle)
        return Schema.from_arrow(optional_schema(arrow_schema))

    def _publish(self, txn_id: str, manifest: dict[str, Any]) -> bool:
        return self._commit_files({txn_id: manifest})

    def _note_version(self, manifests: dict[str, dict[str, Any]], version: int) -> bool:
        """Before the first commit attempt, the table version goes into every manifest (durable
        before the commit can happen; a replay reads the log after it); True if written now.
        """
        if all(VERSION_BEFORE_KEY in m for m in manifests.values()):
            return False
        for txn_id, manifest in list(manifests.items()):
            manifests[txn_id] = {**manifest, VERSION_BEFORE_KEY: version}
            self._save_manifest(txn_id, manifests[txn_id])
        return True

    def _commit_files(self, manifests: dict[str, dict[str, Any]], replace: bool = False) -> bool:
        """ONE Delta commit adding every manifest's files (and, replacing, removing the
        slice's), recording the transaction ids; False if the log already has them. A commit
        lost to another writer is retried on the new version (``commit_retry``).
        """
        txn_id = next(iter(manifests))
        uris = [u for t, m in manifests.items() for u in self._require_files(t, m)]
        added = [a for t, m in manifests.items() for a in self._add_actions(t, m)]
        schema = self._files_schema(uris) if uris else None
        metadata = {SINK_ID_KEY: self.sink_id, TXN_ID_KEY: txn_id}
        if replace:
            metadata[TXN_IDS_KEY] = ",".join(manifests)
            metadata[SLICE_KEY] = json.dumps(self.replace_slice, sort_keys=True)
        checkpoints = {str(m.get("checkpoint_id")) for m in manifests.values()}
        metadata[CHECKPOINT_ID_KEY] = max(checkpoints)
        return commit_retrying(
            self.sink_id,
            txn_id,
            self.table_uri,
            lambda: self._try_commit(manifests, added, schema, metadata, replace),
        )

    def _try_commit(
        self,
        manifests: dict[str, dict[str, Any]],
        added: list[Any],
        files_schema: Any,
        metadata: dict[str, str],
        replace: bool,
    ) -> bool:
        """One attempt on the table's latest version; ``CommitConflict`` if another writer
        took the version first.
        """
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import create_table_with_add_actions

        table = self._open()
        version = -1 if table is None else table.version()
        if not self._note_version(manifests, version) and self._table_committed({**manifests}):
            return False
        schema = files_schema or (table.schema() if table is not None else None)
        if schema is None:
            return True  # nothing staged and no table: nothing to replace or add
        if table is not None:
            self._check_schema(json.loads(schema.to_json()))
        actions = [*(self._remove_actions(table) if replace and table else []), *added]
        app_version = 1 if table is None else (table.transaction_version(self.app_id) or 0) + 1
        properties = CommitProperties(
            custom_metadata=metadata,
            max_commit_retries=0,  # the log entry is created exclusively; we re-check
            app_transactions=[
                Transaction(app_id=self.app_id, version=app_version),
                *(Transaction(app_id=self._txn_app_id(t), version=1) for t in manifests),
            ],
        )
        try:
            if table is None:
                create_table_with_add_actions(
                    self.table_uri,
                    schema,
                    actions,
                    mode="error",
                    storage_options=self._string_options(),
                    commit_properties=properties,
                )
            else:
                table.create_write_transaction(
                    actions, mode="append", schema=table.schema(), commit_properties=properties
                )
        except CommitFailedError as exc:  # another writer took this version
            raise CommitConflict(first_line(exc)) from exc
        except Exception as exc:
            if table is None and self._open() is not None:
                raise CommitConflict("another writer created the table") from exc
            raise SinkError(
                f"sink {self.sink_id!r}: Delta commit of {next(iter(manifests))!r} to "
                f"{self.table_uri} failed: {first_line(exc)} (nothing was committed; retry "
                "when fixed)"
            ) from exc
        return True

    def _bind_storage_flavor(self, fields: ConnectionFields, who: str) -> None:
        """The deltalake (object_store) spelling of the connection's credentials."""
        options = connection_storage_options(fields, "delta", who)
        self._delta_options = {str(k): str(v) for k, v in options.items()}

    def _string_options(self) -> dict[str, str] | None:
        """The options deltalake gets: the connection's keys, then the sink's (nested fsspec options
        such as ``client_kwargs`` are not deltalake's).
        """
        self._check_storage_bound()
        given = {
            str(k): str(v)
            for k, v in self.storage_options.items()
            if not isinstance(v, Mapping) and k not in self._connection_storage_options
        }
        return {**self._delta_options, **given} or None

    # -- readers -----------------------------------------------------------------------------

    def table(self) -> DeltaTable | None:
        """The deltalake table at its latest version, for readers; None if absent."""
        return self._open()

    def read_arrow(self) -> pyarrow.Table:
        """The table's latest version, as Arrow (small tables)."""
        import pyarrow as pa

        table = self._open()
        return pa.table({}) if table is None else pa.table(table.to_pyarrow_table())

    def __repr__(self) -> str:
        return f"DeltaTableSink(sink_id={self.sink_id!r}, table_uri={self.table_uri!r})"


def _rebuild(
    sink_id: str,
    table_uri: str,
    storage_options: dict[str, Any] | None,
    app_id: str,
    replace_slice: dict[str, Any] | None = None,
    storage_conn_id: str | None = None,
) -> DeltaTableSink:
    return DeltaTableSink(
        sink_id,
        table_uri,
        storage_options,
        app_id=app_id,
        replace_slice=replace_slice,
        storage_conn_id=storage_conn_id,
    )
