"""The SQL sink's own records of its transactions: commit records, pre-commit seals, Spark writes.

Each method runs inside a database transaction the sink opened (``conn``), so the sink composes
them into its one-transaction steps (write, pre-commit, commit, abort); the rows are keyed by
sink id, so sinks sharing a database never see each other's transactions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, func, insert, select, update

from airflow_finalckpt.sinks.base import AlreadyCommittedError, SinkTransactionError
from airflow_finalckpt.sinks.sql_tables import (
    COMMITS_TABLE,
    COUNT_ROWS,
    PRECOMMITS_TABLE,
    WRITE_DONE,
    WRITE_OPEN,
    WRITES_TABLE,
    bookkeeping_metadata,
    create_tables,
    insert_or_nothing,
)

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection


class SinkBookkeeping:
    """One sink's rows in the bookkeeping tables (created on first use)."""

    def __init__(self, sink_id: str, engine: Engine) -> None:
        self.sink_id = sink_id
        self.engine = engine
        metadata = bookkeeping_metadata()
        self.commits = metadata.tables[COMMITS_TABLE]
        self.precommits = metadata.tables[PRECOMMITS_TABLE]
        self.writes = metadata.tables[WRITES_TABLE]
        self._ready = False

    def ensure(self) -> None:
        """Create the bookkeeping tables once per sink object (idempotent across processes)."""
        if not self._ready:
            create_tables(self.engine, self.commits.metadata)
            self._ready = True

    def _of_commit(self, txn_id: str) -> tuple[ColumnElement[bool], ...]:
        return (self.commits.c.sink_id == self.sink_id, self.commits.c.txn_id == txn_id)

    def _of_precommit(self, txn_id: str) -> tuple[ColumnElement[bool], ...]:
        return (self.precommits.c.sink_id == self.sink_id, self.precommits.c.txn_id == txn_id)

    # -- commit records ----------------------------------------------------------------------

    def commit_record_exists(self, conn: Connection, txn_id: str) -> bool:
        """Whether the transaction is committed (its commit record is the proof)."""
        query = select(self.commits.c.rows).where(*self._of_commit(txn_id))
        return conn.execute(query).first() is not None

    def committed_txn_ids(self, conn: Connection) -> set[str]:
        """Every transaction of this sink with a commit record."""
        query = select(self.commits.c.txn_id).where(self.commits.c.sink_id == self.sink_id)
        return set(conn.execute(query).scalars())

    def insert_commit_record(self, conn: Connection, txn_id: str, rows: int, ckpt: int) -> bool:
        """INSERT ... ON CONFLICT DO NOTHING: the one serialization point between committers."""
        values = {
            "sink_id": self.sink_id,
            "txn_id": txn_id,
            "committed_at": time.time(),
            "rows": rows,
            "checkpoint_id": ckpt,
        }
        statement = insert_or_nothing(
            self.engine.dialect.name, self.commits, values, ["sink_id", "txn_id"]
        )
        return bool(conn.execute(statement, execution_options=COUNT_ROWS).rowcount == 1)

    def set_committed_rows(self, conn: Connection, txn_id: str, rows: int) -> None:
        """Record how many rows the commit actually moved."""
        conn.execute(update(self.commits).where(*self._of_commit(txn_id)).values(rows=rows))

    # -- pre-commit seals --------------------------------------------------------------------

    def precommit_row(self, conn: Connection, txn_id: str, *, lock: bool = False) -> Any:
        """The transaction's pre-commit seal (rows, checkpoint id) or None; ``lock`` holds it
        until ``conn`` ends, so a racing commit or abort waits.
        """
        query = select(self.precommits).where(*self._of_precommit(txn_id))
        return conn.execute(query.with_for_update() if lock else query).first()

    def precommitted_txn_ids(self, conn: Connection) -> set[str]:
        """Every sealed, uncommitted transaction of this sink."""
        query = select(self.precommits.c.txn_id).where(self.precommits.c.sink_id == self.sink_id)
        return set(conn.execute(query).scalars())

    def seal(self, conn: Connection, txn_id: str, checkpoint_id: int, rows: int) -> None:
        """Write (or replace) the transaction's pre-commit seal."""
        self.unseal(conn, txn_id)
        conn.execute(
            insert(self.precommits).values(
                sink_id=self.sink_id,
                txn_id=txn_id,
                checkpoint_id=checkpoint_id,
                rows=rows,
                precommitted_at=time.time(),
            )
        )

    def unseal(self, conn: Connection, txn_id: str) -> None:
        """Delete the transaction's pre-commit seal (after commit or abort)."""
        conn.execute(delete(self.precommits).where(*self._of_precommit(txn_id)))

    def check_open(self, conn: Connection, txn_id: str) -> None:
        """Refuse writes to a committed or sealed transaction."""
        if self.commit_record_exists(conn, txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "write to")
        if self.precommit_row(conn, txn_id) is not None:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} is pre-committed and sealed; "
                "rows written now would not be covered by its checkpoint (open a new transaction)"
            )

    # -- Spark writes ------------------------------------------------------------------------

    def written_txn_ids(self, conn: Connection) -> set[str]:
        """Transactions with a Spark write recorded (complete or not)."""
        query = select(self.writes.c.txn_id).where(self.writes.c.sink_id == self.sink_id)
        return set(conn.execute(query.distinct()).scalars())

    def open_write(self, conn: Connection, txn_id: str, write_id: str) -> None:
        """Record a Spark write before its job runs: its partitions stage only while it is open."""
        conn.execute(
            insert(self.writes).values(
                sink_id=self.sink_id, txn_id=txn_id, write_id=write_id, part=WRITE_OPEN, rows=0
            )
        )

    def wait_for_writing_partitions(self, conn: Connection, txn_id: str) -> None:
        """Lock the transaction's open writes until ``conn`` ends: partitions still staging
        (they hold the open row FOR SHARE) finish first, later ones wait and then find it gone.
        """
        writes = self.writes
        query = select(writes.c.write_id).where(
            writes.c.sink_id == self.sink_id, writes.c.txn_id == txn_id, writes.c.part == WRITE_OPEN
        )
        conn.execute(query.with_for_update()).all()

    def complete_write(self, conn: Connection, txn_id: str, write_id: str, rows: int) -> None:
        """Mark a Spark write complete once its job succeeded, if its partitions staged exactly
        the rows the tasks reported (pre-commit checks the marks).
        """
        writes = self.writes
        of_write = (
            (writes.c.sink_id == self.sink_id)
            & (writes.c.txn_id == txn_id)
            & (writes.c.write_id == write_id)
        )
        staged = conn.execute(
            select(func.coalesce(func.sum(writes.c.rows), 0)).where(of_write, writes.c.part >= 0)
        ).scalar_one()
        if int(staged) != rows:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r}: the Spark tasks reported "
                f"{rows} rows but their partitions staged {staged}; abort the transaction"
            )
        conn.execute(
            insert(writes).values(
                sink_id=self.sink_id, txn_id=txn_id, write_id=write_id, part=WRITE_DONE, rows=rows
            )
        )

    def check_writes_complete(self, conn: Connection, txn_id: str) -> None:
        """Refuse to seal a transaction with a Spark write whose job failed part-way."""
        writes = self.writes
        of_txn = (writes.c.sink_id == self.sink_id) & (writes.c.txn_id == txn_id)
        started = set(conn.execute(select(writes.c.write_id).where(of_txn).distinct()).scalars())
        done = set(
            conn.execute(
                select(writes.c.write_id).where(of_txn, writes.c.part == WRITE_DONE)
            ).scalars()
        )
        if started - done:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} has a Spark write that did not "
                "complete (its job failed after staging some partitions); abort the transaction "
                "and write the data again under a new transaction id"
            )

    def forget_writes(self, conn: Connection, txn_id: str) -> None:
        """Drop the transaction's Spark write records (after commit or abort)."""
        conn.execute(
            delete(self.writes).where(
                self.writes.c.sink_id == self.sink_id, self.writes.c.txn_id == txn_id
            )
        )
