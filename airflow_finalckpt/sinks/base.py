"""The two-phase-commit sink protocol the stage runtime drives (FLIP-147's TwoPhaseCommitSink).

A stage writes a transaction's output to a sink's staging area, pre-commits it when it answers a
checkpoint, and commits it only once that checkpoint completed. Transaction ids are chosen by the
caller and deterministic, so a commit replayed after a crash must be recognised and be a no-op.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_finalckpt.core.errors import FinalCheckpointError, UnsafePathError
from airflow_finalckpt.core.model import SinkTransaction

if TYPE_CHECKING:
    import pandas
    import pyspark.sql

#: Sink and transaction ids become path components and database keys: one safe path segment.
SAFE_IDENTIFIER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
#: A slice column: a plain identifier (it becomes a SQL column, a filter, a directory name).
SLICE_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


#: URI schemes that name one store: a table under either is the same table.
_SAME_SCHEME = {"s3a": "s3", "s3n": "s3"}


class SinkError(FinalCheckpointError):
    """A sink refused an operation."""


class InvalidIdentifierError(UnsafePathError, ValueError):
    """A sink or transaction id is not one safe path segment (both a StorageError and a
    ValueError, so callers validating input can catch either).
    """


class SinkTransactionError(SinkError):
    """A transaction is not in a state that allows the requested operation."""


class AlreadyCommittedError(SinkTransactionError):
    """The transaction is committed: it can no longer be written, pre-committed or aborted."""

    def __init__(self, sink_id: str, txn_id: str, operation: str) -> None:
        self.sink_id = sink_id
        self.txn_id = txn_id
        super().__init__(
            f"sink {sink_id!r}: cannot {operation} transaction {txn_id!r}, it is already "
            "committed; committed output is final (use a new transaction id for new data)"
        )


class NotPrecommittedError(SinkTransactionError):
    """Commit was asked for a transaction that was never pre-committed or was aborted."""


class ForeignTransactionError(SinkTransactionError):
    """The transaction belongs to another sink."""


def validate_identifier(value: object, kind: str) -> str:
    """Return ``value`` if it is a safe id, else raise: ids end up in paths and table keys."""
    if not isinstance(value, str) or SAFE_IDENTIFIER.fullmatch(value) is None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidIdentifierError(
            f"invalid {kind} {shown}: it must be 1-200 ASCII letters, digits, '_', '.' or '-', "
            "starting with a letter, digit or '_' (no '/', '..' prefix, spaces or control chars)"
        )
    return value


def check_slice(sink_id: str, replace_slice: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The slice a pipeline run owns, ``{column: value}`` (values may be Jinja templates,
    rendered per run); None: commits append. Refused with one line if malformed.
    """
    if replace_slice is None:
        return None
    if not isinstance(replace_slice, Mapping) or not replace_slice:
        raise SinkError(
            f"sink {sink_id!r}: replace_slice must be a non-empty mapping of column to value, "
            f"e.g. {{'event_date': '{{{{ ds }}}}'}}, not {replace_slice!r}"
        )
    for column, value in replace_slice.items():
        if not isinstance(column, str) or SLICE_COLUMN.fullmatch(column) is None:
            raise SinkError(f"sink {sink_id!r}: replace_slice column {column!r} is not a name")
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise SinkError(
                f"sink {sink_id!r}: replace_slice value of {column!r} must be a string or an "
                f"int, not {type(value).__name__}"
            )
    return dict(replace_slice)


def partition_slice(*columns: str, separator: str = "|") -> dict[str, str]:
    """``replace_slice`` owning a partitioned run's partition: one column per part of its key,
    as templates Airflow renders per run: ``partition_slice("day")`` owns the whole key,
    ``partition_slice("region", "day")`` takes ``us|2026-03-10`` apart.
    A key with fewer parts (or a run without one) fails the render; with more, the last
    column gets the rest (``2026-03-10|x``), so the stage's rows lie outside the slice and are
    refused before anything is staged.
    """
    if not columns:
        raise SinkError("partition_slice needs at least one column")
    last = len(columns) - 1
    return {
        column: f"{{{{ partition_key.split({separator!r}, {last})[{index}] }}}}"
        for index, column in enumerate(columns)
    }


def rows_outside_slice(df: pyspark.sql.DataFrame, replace_slice: Mapping[str, Any]) -> int:
    """How many rows of ``df`` (at most 1: it stops at the first) lie outside the slice: such
    a row would survive the next rerun's replace and be doubled.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    inside = reduce(lambda a, b: a & b, (F.col(c) == F.lit(v) for c, v in replace_slice.items()))
    return len(df.where(~F.coalesce(inside, F.lit(False))).limit(1).collect())


class TwoPhaseCommitSink(ABC):
    """A sink whose output becomes visible only through an idempotent commit.

    Life of a transaction: ``write_*`` (any number of times) -> ``precommit`` (durable, sealed)
    -> ``commit`` (visible exactly once) or ``abort`` (dropped).

    A sink with ``replace_slice`` (``{column: value}``, rendered per run like a template field)
    owns that slice of its table per pipeline run: ``commit_replacing`` commits all of a
    stage's transactions at once, in place of the slice's rows.
    """

    #: Rendered by Airflow per task run (the stage operator renders its sinks' fields).
    template_fields: ClassVar[Sequence[str]] = ("replace_slice",)
    replace_slice: dict[str, Any] | None = None

    def __init__(self, sink_id: str) -> None:
        self.sink_id = validate_identifier(sink_id, "sink id")

    def target(self) -> str | None:
        """What the sink writes, comparable between sinks: its Asset URI (a table directory,
        a database table), ``s3a://``/``s3n://`` read as ``s3://``. Two sinks of one pipeline
        on one target would each commit every row (``core.definition``). None: not known
        before the task runs. Shown in errors, so it never holds a secret.
        """
        uri = self.asset_uri
        if uri is None:
            return None
        scheme, sep, rest = uri.partition("://")
        return f"{_SAME_SCHEME.get(scheme, scheme)}{sep}{rest.rstrip('/')}"

    def commit_replacing(self, txns: Sequence[SinkTransaction]) -> bool:
        """Replace the ``replace_slice`` rows with every transaction's rows, atomically and
        once: True if committed now, False if they already were (a replay).
        """
        raise SinkError(f"sink {self.sink_id!r}: {type(self).__name__} cannot replace a slice")

    def _check_rows_in_slice(self, df: pyspark.sql.DataFrame) -> None:
        """Refuse a batch with rows outside the declared slice (before anything is staged)."""
        missing = [c for c in self.replace_slice or () if c not in df.columns]
        if missing:
            raise SinkError(
                f"sink {self.sink_id!r}: replace_slice column {missing[0]!r} "
                f"is not a column of the batch (it has {df.columns}); select it in the "
                "transform; nothing was written"
            )
        if self.replace_slice and rows_outside_slice(df, self.replace_slice):
            raise SinkError(
                f"sink {self.sink_id!r}: the batch has rows outside replace_slice "
                f"{self.replace_slice} (e.g. another day); filter them in the transform or "
                "widen the slice; nothing was written"
            )

    @abstractmethod
    def staging_location(self, txn_id: str) -> str:
        """Where this transaction's data is staged before commit (never visible to readers)."""

    @abstractmethod
    def write_pandas(self, txn_id: str, frame: pandas.DataFrame) -> None:
        """Stage a pandas frame in the transaction (small outputs)."""

    @abstractmethod
    def write_spark(self, txn_id: str, df: pyspark.sql.DataFrame) -> None:
        """Stage a Spark DataFrame in the transaction."""

    @abstractmethod
    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        """Make the staged data durable and seal it; the result describes it for the checkpoint."""

    @abstractmethod
    def commit(self, txn: SinkTransaction) -> bool:
        """Publish the transaction: True if committed now, False if it already was."""

    @abstractmethod
    def abort(self, txn: SinkTransaction) -> None:
        """Drop the transaction's staged data; a no-op if there is none; refused if committed."""

    @abstractmethod
    def is_committed(self, txn_id: str) -> bool:
        """Whether the transaction's commit record exists."""

    @abstractmethod
    def committed_txn_ids(self) -> set[str]:
        """Every committed transaction of this sink."""

    @abstractmethod
    def staged_txn_ids(self) -> set[str]:
        """Transactions with staged, uncommitted data: on restore, the ones no checkpoint
        references are lingering and must be aborted.
        """

    @property
    def asset_uri(self) -> str | None:
        """The Airflow Asset URI of the sink's table, in the scheme Airflow's providers use
        (``file``, ``s3``, ``postgres``, ``iceberg``...), for the stage's ``outlets``; None if
        the sink names none.
        """
        return None

    def _check_txn_id(self, txn_id: str) -> str:
        return validate_identifier(txn_id, "transaction id")

    def _check_owned(self, txn: SinkTransaction) -> str:
        """Validate a transaction handed back by the runtime; return its id."""
        if txn.sink_id != self.sink_id:
            raise ForeignTransactionError(
                f"transaction {txn.txn_id!r} belongs to sink {txn.sink_id!r}, "
                f"not to sink {self.sink_id!r}"
            )
        return self._check_txn_id(txn.txn_id)

    def _require_checkpoint(self, txn: SinkTransaction) -> None:
        """A transaction may only be committed once a checkpoint covered it."""
        if txn.checkpoint_id is None:
            raise NotPrecommittedError(
                f"sink {self.sink_id!r}: transaction {txn.txn_id!r} carries no checkpoint id; "
                "only transactions returned by precommit() may be committed"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sink_id={self.sink_id!r})"
