"""A split-batch boundary in two statements: one read of everything its acknowledgements decide
on, one write of the outcome (``core.transitions_boundary`` decides in between).

The read returns the stage row with the latest stop request, the pending checkpoints that wait
for the stage, the newest checkpoint it acknowledged and its pre-committed transactions (plus
any stored under the batch's ids), the lists as JSON aggregates. The write is one statement of
data-modifying CTEs on PostgreSQL; SQLite, which has none, runs one statement per table. Both
are built once per dialect and shape and executed with bound values (SQLAlchemy caches their
compiled form; building a statement costs more than running it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Connection,
    String,
    any_,
    bindparam,
    func,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect

from airflow_finalckpt.core.model import SinkTransaction, TransactionState
from airflow_finalckpt.core.transitions_boundary import Awaiting, BoundaryAcks, StoredTxn
from airflow_finalckpt.core.views import StopRequest
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.reads_acks import awaiting_select, newest_acked

_PRECOMMITTED = TransactionState.PRECOMMITTED.value


@dataclass(frozen=True)
class BoundaryRead:
    """What the boundary read: the stage row (with ``stop_``-prefixed stop columns) and what
    its acknowledgements decide on.
    """

    row: Mapping[str, Any]
    awaiting: tuple[Awaiting, ...]
    newest_acked: int | None
    stored: tuple[StoredTxn, ...]


def _agg(dialect: str, *values: Any) -> Any:
    """A JSON array of one JSON array per row (NULL or [] for no rows)."""
    if dialect == "postgresql":
        return func.json_agg(func.json_build_array(*values))
    return func.json_group_array(func.json_array(*values))


@cache
def _read_statement(dialect: str) -> Any:
    due, cks, x = t.acks_due.c, t.checkpoints.c, t.transactions.c
    key: Any = bindparam("b_key")
    stage: Any = bindparam("b_stage")
    awaiting = awaiting_select(
        _agg(dialect, due.checkpoint_id, cks.acks_pending, cks.triggered_at)
    ).scalar_subquery()
    payload: Any
    if dialect == "postgresql":
        payload = x.payload
        batch = x.txn_id == any_(bindparam("b_batch", type_=postgresql.ARRAY(String)))
    else:
        payload = func.json(x.payload)
        batch = x.txn_id.in_(bindparam("b_batch", expanding=True))
    # The batch's ids already stored in any state (a superset: matched by id alone, any sink;
    # ``decide_boundary`` matches sink and id).
    txns = (
        select(_agg(dialect, x.sink_id, x.txn_id, x.checkpoint_id, x.state, payload))
        .where(x.pipeline_key == key, x.stage_id == stage, (x.state == _PRECOMMITTED) | batch)
        .scalar_subquery()
    )
    stops = t.stop_requests
    latest = (
        select(func.max(stops.c.request_id)).where(stops.c.pipeline_key == key).scalar_subquery()
    )
    joined = t.stages.outerjoin(
        stops, (stops.c.pipeline_key == t.stages.c.pipeline_key) & (stops.c.request_id == latest)
    )
    return (
        select(
            *t.stages.c,
            *(c.label(f"stop_{c.name}") for c in stops.c),
            type_coerce(awaiting, JSON).label("b_awaiting"),
            newest_acked().label("b_newest"),
            type_coerce(txns, JSON).label("b_txns"),
        )
        .select_from(joined)
        .where(t.stages.c.pipeline_key == key, t.stages.c.stage_id == stage)
    )


def _read_params(key: str, stage_id: str, batch: Sequence[SinkTransaction]) -> dict[str, Any]:
    return {"b_key": key, "b_stage": stage_id, "b_batch": sorted({txn.txn_id for txn in batch})}


def read_boundary(
    conn: Connection, key: str, stage_id: str, batch: Sequence[SinkTransaction]
) -> BoundaryRead | None:
    """The boundary's read, None if the pipeline has no such stage."""
    params = _read_params(key, stage_id, batch)
    row = conn.execute(_read_statement(conn.dialect.name), params).mappings().first()
    return None if row is None else _boundary_read(dict(row))


@cache
def _postgresql_sql(statement: Any) -> tuple[str, dict[str, Any]]:
    """A statement as psycopg runs it (plain scalar and array parameters only) and the values
    of its literal parameters.
    """
    compiled = statement.compile(dialect=psycopg_dialect())  # type: ignore[no-untyped-call]
    return str(compiled), dict(compiled.params)


def _run(driver: Any, statement: Any, params: Mapping[str, Any]) -> tuple[Any, str]:
    sql, literals = _postgresql_sql(statement)
    return driver.execute(sql, {**literals, **params}), sql


def pipelined(conn: Connection) -> bool:
    """Can ``lock_and_read_postgresql`` run here: PostgreSQL through psycopg 3 with a libpq
    that has pipeline mode (14 or newer; the ``psycopg[binary]`` wheels bring one).
    """
    if conn.dialect.name != "postgresql":
        return False
    driver = conn.connection.driver_connection
    return callable(getattr(driver, "pipeline", None)) and _libpq_pipelines()


@cache
def _libpq_pipelines() -> bool:
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


def lock_and_read_postgresql(
    conn: Connection,
    lock: Any,
    key: str,
    stage_id: str,
    batch: Sequence[SinkTransaction],
) -> tuple[Mapping[str, Any] | None, BoundaryRead | None]:
    """The transaction's BEGIN, the pipeline lock (statement ``lock``) and the boundary read
    in one round trip: psycopg's pipeline mode sends them together, the server runs the read
    once the lock is held, as a statement of its own with its own snapshot (READ COMMITTED),
    so it sees every transition committed before. Returns the locked row and the read (each
    None if missing).
    """
    driver = conn.connection.driver_connection
    assert driver is not None
    with driver.pipeline():
        locked = _run(driver, lock, {"b_key": key})
        read = _run(driver, _read_statement("postgresql"), _read_params(key, stage_id, batch))
    return _first(locked), None if (row := _first(read)) is None else _boundary_read(row)


#: Column names by statement text (``cursor.description`` builds an object per column and
#: row: more than the read's own cost).
_NAMES: dict[str, tuple[str, ...]] = {}


def _first(ran: tuple[Any, str]) -> dict[str, Any] | None:
    cursor, sql = ran
    row = cursor.fetchone()
    if row is None:
        return None
    names = _NAMES.get(sql)
    if names is None:
        names = _NAMES[sql] = tuple(d.name for d in cursor.description)
    return dict(zip(names, row, strict=True))


def _boundary_read(row: Mapping[str, Any]) -> BoundaryRead:
    awaiting = tuple(
        Awaiting(int(cid), int(pending), float(at)) for cid, pending, at in row["b_awaiting"] or ()
    )
    stored = tuple(
        StoredTxn(
            SinkTransaction(sink_id=sink, txn_id=txn, checkpoint_id=cid, payload=payload or {}),
            state,
        )
        for sink, txn, cid, state, payload in row["b_txns"] or ()
    )
    newest = row["b_newest"]
    return BoundaryRead(row, awaiting, None if newest is None else int(newest), stored)


# ---------------------------------------------------------------------- the write


def _txn_row() -> dict[str, Any]:
    return {
        "pipeline_key": bindparam("b_key"),
        "stage_id": bindparam("b_stage"),
        "sink_id": bindparam("b_sink"),
        "txn_id": bindparam("b_txn"),
        "epoch": bindparam("b_epoch"),
        "checkpoint_id": bindparam("b_stamp"),
        "state": _PRECOMMITTED,
        "payload": bindparam("b_payload", type_=t.transactions.c.payload.type),
        "updated_at": bindparam("b_now"),
    }


@cache
def _insert_txn(dialect: str) -> Any:
    """One new transaction (ON CONFLICT DO NOTHING: ``decide_boundary`` left out stored ids)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(t.transactions).values(_txn_row()).on_conflict_do_nothing()


#: One acknowledgement (also ``StoreWriter.record_ack``'s).
INSERT_ACK = t.acks.insert().values(
    pipeline_key=bindparam("b_key"),
    checkpoint_id=bindparam("b_cid"),
    stage_id=bindparam("b_stage"),
    epoch=bindparam("b_epoch"),
    by_finish=bindparam("b_by_finish"),
    snapshot=bindparam("b_snapshot", type_=t.acks.c.snapshot.type),
    acked_at=bindparam("b_acked_at"),
)


@cache
def _update_stage(columns: tuple[str, ...]) -> Any:
    s = t.stages.c
    return (
        update(t.stages)
        .where(s.pipeline_key == bindparam("b_key"), s.stage_id == bindparam("b_stage"))
        .values({name: bindparam(f"v_{name}", type_=s[name].type) for name in columns})
    )


def _acked(dialect: str, column: Any) -> Any:
    """``column`` is one of the acknowledged checkpoint ids (an array on PostgreSQL: no
    expansion of the statement's text at every execution).
    """
    if dialect == "postgresql":
        return column == any_(bindparam("b_acked", type_=postgresql.ARRAY(BigInteger)))
    return column.in_(bindparam("b_acked", expanding=True))


_X, _DUE, _CKS = t.transactions.c, t.acks_due.c, t.checkpoints.c
#: The stage's uncovered pre-committed transactions are covered by checkpoint ``b_stamp``
#: (also ``StoreWriter.stamp_transactions``').
STAMP = (
    update(t.transactions)
    .where(
        _X.pipeline_key == bindparam("b_key"),
        _X.stage_id == bindparam("b_stage"),
        _X.state == _PRECOMMITTED,
        _X.checkpoint_id.is_(None),
    )
    .values(checkpoint_id=bindparam("b_stamp"))
)


@cache
def _forget_due(dialect: str) -> Any:
    return t.acks_due.delete().where(
        _DUE.pipeline_key == bindparam("b_key"),
        _DUE.stage_id == bindparam("b_stage"),
        _acked(dialect, _DUE.checkpoint_id),
    )


@cache
def _count_down(dialect: str) -> Any:
    return (
        update(t.checkpoints)
        .where(_CKS.pipeline_key == bindparam("b_key"), _acked(dialect, _CKS.checkpoint_id))
        .values(acks_pending=_CKS.acks_pending - 1)
    )


@cache
def _postgresql_write(columns: tuple[str, ...], new: bool, stamps: bool, acked: bool) -> Any:
    """The write as one statement: the stage update last, the stamp, the first new transaction,
    the first acknowledgement and the counters as CTEs (each runs to completion; none sees what
    another writes, so a new transaction is inserted covered already). Single-row inserts: a
    multi-row VALUES is compiled anew on every execution.
    """
    ctes = []
    if stamps:
        ctes.append(STAMP.cte("b_stamped"))
    if new:
        ctes.append(_insert_txn("postgresql").cte("b_new"))
    if acked:
        ctes.append(INSERT_ACK.cte("b_acks"))
        ctes += [_forget_due("postgresql").cte("b_due"), _count_down("postgresql").cte("b_count")]
    return _update_stage(columns).add_cte(*ctes) if ctes else _update_stage(columns)


def write_boundary(
    conn: Connection,
    key: str,
    stage_id: str,
    epoch: int,
    stage_values: Mapping[str, Any],
    decided: BoundaryAcks,
    snapshot: Mapping[str, Any] | None,
    now: float,
) -> None:
    """Write what ``decide_boundary`` decided, the stage's new columns and ``snapshot``, what
    each acknowledgement records (stored JSON; None: it acknowledges none): one statement on
    PostgreSQL (plus one per table for a second new transaction or acknowledgement), one per
    table on SQLite.
    """
    columns = tuple(sorted(stage_values))
    params: dict[str, Any] = {
        "b_key": key,
        "b_stage": stage_id,
        "b_epoch": epoch,
        "b_now": now,
        "b_acked_at": now,
        "b_by_finish": False,
        "b_stamp": decided.stamp,
        "b_acked": [a.checkpoint_id for a in decided.acked],
        **{f"v_{name}": value for name, value in stage_values.items()},
    }
    if snapshot is not None:
        params["b_snapshot"] = snapshot
    txns = [
        {**params, "b_sink": x.sink_id, "b_txn": x.txn_id, "b_payload": x.payload}
        for x in decided.new
    ]
    acks = [{**params, "b_cid": a.checkpoint_id} for a in decided.acked]
    if conn.dialect.name == "postgresql":
        first = {**params, **(txns[0] if txns else {}), **(acks[0] if acks else {})}
        shape = (columns, bool(txns), decided.stamp is not None, bool(acks))
        conn.execute(_postgresql_write(*shape), first)
        txns, acks = txns[1:], acks[1:]
    else:
        conn.execute(_update_stage(columns), params)
        if decided.stamp is not None:
            conn.execute(STAMP, params)
        if acks:
            conn.execute(_forget_due("sqlite"), params)
            conn.execute(_count_down("sqlite"), params)
    if txns:
        conn.execute(_insert_txn(conn.dialect.name), txns)
    if acks:
        conn.execute(INSERT_ACK, acks)


def stop_of(row: Mapping[str, Any]) -> StopRequest | None:
    """The latest stop request read beside a stage row (``stop_``-prefixed; None: none yet)."""
    if row["stop_request_id"] is None:
        return None
    return r.stop_request({c.name: row[f"stop_{c.name}"] for c in t.stop_requests.c})
