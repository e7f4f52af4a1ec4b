"""The two-phase-commit sink protocol the stage runtime drives (FLIP-147's TwoPhaseCommitSink).

A stage writes a transaction's output to a sink's staging area, pre-commits it when it answers a
checkpoint, and commits it only once that checkpoint completed. Transaction ids are chosen by the
caller and deterministic, so a commit replayed after a crash must be recognised and be a no-op.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from airflow_finalckpt.core.errors import FinalCheckpointError, UnsafePathError
from airflow_finalckpt.core.model import SinkTransaction

if TYPE_CHECKING:
    import pandas
    import pyspark.sql

#: Sink and transaction ids become path components and database keys: one safe path segment.
SAFE_IDENTIFIER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


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


class TwoPhaseCommitSink(ABC):
    """A sink whose output becomes visible only through an idempotent commit.

    Life of a transaction: ``write_*`` (any number of times) -> ``precommit`` (durable, sealed)
    -> ``commit`` (visible exactly once) or ``abort`` (dropped).
    """

    def __init__(self, sink_id: str) -> None:
        self.sink_id = validate_identifier(sink_id, "sink id")

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
