"""The coordination store of one pipeline: the locked transition (one database transaction that
first locks the pipeline row) and plain reads, over the readers and writers of ``reads`` and
``writes``. Transitions of one pipeline are serialized across processes: SQLite by its
``BEGIN IMMEDIATE`` write lock, PostgreSQL by ``SELECT ... FOR UPDATE`` on the pipeline row.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from airflow_finalckpt.core.errors import IllegalTransitionError, UnknownPipelineError
from airflow_finalckpt.core.model import SinkTransaction, StageLifecycle
from airflow_finalckpt.core.rerun import Publication
from airflow_finalckpt.core.run_instance import RunInstance, RunLink, moves_record_forward
from airflow_finalckpt.store import boundary as b
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.reads import StoreReader
from airflow_finalckpt.store.writes import LOCK_PIPELINE, StoreWriter, lock_pipeline, write_lease


class CoordinationStore:
    """Where one pipeline's coordination rows live."""

    def __init__(self, engine: Engine, pipeline_key: str) -> None:
        self.engine = engine
        self.pipeline_key = pipeline_key

    @contextmanager
    def transition(
        self,
        *,
        create: Mapping[str, Any] | None = None,
        boundary: tuple[str, Sequence[SinkTransaction]] | None = None,
    ) -> Iterator[StoreWriter]:
        """One write transaction holding the pipeline lock, committed when the block ends
        (rolled back if it raises). ``create``: the pipeline row to insert first if there is
        none (rolled back with the rest). ``boundary``: (stage id, the batch's transactions) of
        a split-batch boundary, read with the lock (one round trip on PostgreSQL): what
        ``StoreWriter.boundary`` returns.
        """
        with self.engine.begin() as conn:
            read = None
            if create is not None:
                r.insert_ignore(conn, t.pipelines, create)
            if boundary is not None and create is None and b.pipelined(conn):
                row, read = b.lock_and_read_postgresql(
                    conn, LOCK_PIPELINE, self.pipeline_key, *boundary
                )
            else:
                row = lock_pipeline(conn, self.pipeline_key)
            if row is None:
                raise UnknownPipelineError(
                    f"pipeline {self.pipeline_key!r} is not registered in the coordination store"
                )
            writer = StoreWriter(conn, self.pipeline_key, row)
            if read is not None and boundary is not None:
                writer.prefetched = (boundary[0], read)
            yield writer

    @contextmanager
    def read(self, *, repeatable: bool = False) -> Iterator[StoreReader]:
        """A read-only connection; ``repeatable``: one consistent snapshot on PostgreSQL
        (REPEATABLE READ; SQLite's read transaction already is one).
        """
        with self.engine.connect() as conn:
            if repeatable and conn.dialect.name == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")
            yield StoreReader(conn, self.pipeline_key)

    # ------------------------------------------------------------------ DAG runs

    def link_dag_run(
        self,
        dag_id: str,
        run_id: str,
        now: float,
        *,
        instance: RunInstance | None = None,
        generation: int = 1,
        replaces: str | None = None,
    ) -> None:
        """Record that a DAG run works on this pipeline (idempotent); refused if it already
        works on another one. ``instance``: its DAG run instance, recorded (and moved forward
        as the run is cleared, ``core.run_instance``). ``replaces``: the pipeline of the
        deleted run this one was re-created from: the link moves here, that one is superseded.
        """
        with self.engine.begin() as conn:
            if replaces is not None and replaces != self.pipeline_key:
                self._move_link(conn, dag_id, run_id, now, instance, generation, replaces)
            r.insert_ignore(
                conn,
                t.dag_runs,
                {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "pipeline_key": self.pipeline_key,
                    "created_at": now,
                    "run_instance": None if instance is None else instance.to_dict(),
                    "generation": generation,
                },
            )
            mine = (t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id)
            owner, recorded = conn.execute(
                select(t.dag_runs.c.pipeline_key, t.dag_runs.c.run_instance).where(*mine)
            ).one()
            if instance is not None and owner == self.pipeline_key:
                self._record_instance(conn, dag_id, run_id, recorded, instance)
        if owner != self.pipeline_key:
            raise IllegalTransitionError(
                f"DAG run {run_id!r} of DAG {dag_id!r} already works on pipeline {owner!r}, "
                f"not {self.pipeline_key!r} (a pipeline_key or restore_from in the conf of a "
                "running DAG run cannot change)"
            )

    @staticmethod
    def _record_instance(
        conn: Connection, dag_id: str, run_id: str, recorded: Any, instance: RunInstance
    ) -> None:
        """Move the run's recorded instance forward (``core.run_instance``)."""
        if moves_record_forward(RunInstance.from_dict(recorded), instance):
            conn.execute(
                update(t.dag_runs)
                .where(t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id)
                .values(run_instance=instance.to_dict())
            )

    def _move_link(
        self,
        conn: Connection,
        dag_id: str,
        run_id: str,
        now: float,
        instance: RunInstance | None,
        generation: int,
        replaces: str,
    ) -> None:
        """A re-created DAG run: its link leaves the deleted run's pipeline (if no task of
        this run moved it already), which is marked superseded by this one.
        """
        moved = conn.execute(
            update(t.dag_runs)
            .where(
                t.dag_runs.c.dag_id == dag_id,
                t.dag_runs.c.run_id == run_id,
                t.dag_runs.c.pipeline_key == replaces,
            )
            .values(
                pipeline_key=self.pipeline_key,
                created_at=now,
                run_instance=None if instance is None else instance.to_dict(),
                generation=generation,
            )
        )
        if moved.rowcount:
            conn.execute(
                update(t.pipelines)
                .where(t.pipelines.c.pipeline_key == replaces)
                .values(superseded_by=self.pipeline_key)
            )

    def closed_before_dag_run(self, stage_id: str, dag_id: str, run_id: str) -> bool:
        """Is the stage CLOSED with its row last changed before this DAG run joined?"""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.stages.c.lifecycle, t.stages.c.updated_at).where(
                    t.stages.c.pipeline_key == self.pipeline_key,
                    t.stages.c.stage_id == stage_id,
                )
            ).first()
            linked = conn.execute(
                select(t.dag_runs.c.created_at).where(
                    t.dag_runs.c.dag_id == dag_id,
                    t.dag_runs.c.run_id == run_id,
                    t.dag_runs.c.pipeline_key == self.pipeline_key,
                )
            ).scalar()
        if row is None or linked is None:
            return False
        return row.lifecycle == StageLifecycle.CLOSED.value and float(row.updated_at) < float(
            linked
        )

    def publish(self, stage_id: str, published_by: Mapping[str, Any]) -> Publication:
        """Record the try that returned the CLOSED stage to Airflow. FIRST when no try had
        since the stage closed (a compare-and-set: of two DAG runs returning one close at once,
        one wins), AGAIN otherwise, NOT_CLOSED (nothing written) if a reset came first.
        """
        closed = (
            t.stages.c.pipeline_key == self.pipeline_key,
            t.stages.c.stage_id == stage_id,
            t.stages.c.lifecycle == StageLifecycle.CLOSED.value,
        )
        record = {"published_by": dict(published_by)}
        with self.engine.begin() as conn:
            first = conn.execute(
                update(t.stages).where(*closed, t.stages.c.published_by.is_(None)).values(record)
            )
            if first.rowcount:
                return Publication.FIRST
            again = conn.execute(update(t.stages).where(*closed).values(record))
        return Publication.AGAIN if again.rowcount else Publication.NOT_CLOSED

    def published_by(self, stage_id: str) -> Mapping[str, Any] | None:
        """The stored publishing try of the stage (None: none recorded)."""
        with self.engine.connect() as conn:
            value = conn.execute(
                select(t.stages.c.published_by).where(
                    t.stages.c.pipeline_key == self.pipeline_key,
                    t.stages.c.stage_id == stage_id,
                )
            ).scalar()
        return value if isinstance(value, Mapping) else None

    def renew_lease(self, stage_id: str, epoch: int, until: float) -> bool:
        """Renew a running attempt's lease in its own short transaction, without the pipeline
        lock (``writes.write_lease``); False if the attempt is not the running one any more.
        """
        if self.engine.url.database in (None, "", ":memory:"):
            return True  # one process, one shared connection: no lease (and no other thread)
        with self.engine.begin() as conn:
            return write_lease(conn, self.pipeline_key, stage_id, epoch, until)

    def driver(self) -> tuple[str, str] | None:
        """(dag_id, run_id) of the DAG run driving the pipeline, None if none is recorded."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.pipelines.c.driver_dag_id, t.pipelines.c.driver_run_id).where(
                    t.pipelines.c.pipeline_key == self.pipeline_key
                )
            ).first()
        if row is None or row[0] is None or row[1] is None:
            return None
        return str(row[0]), str(row[1])

    def dag_runs(self) -> list[tuple[str, str]]:
        """The (dag_id, run_id) pairs of this pipeline, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.dag_runs.c.dag_id, t.dag_runs.c.run_id)
                .where(t.dag_runs.c.pipeline_key == self.pipeline_key)
                .order_by(t.dag_runs.c.created_at)
            ).all()
        return [(str(d), str(run)) for d, run in rows]


# ---------------------------------------------------------------------- across pipelines


def dag_run_link(engine: Engine, dag_id: str, run_id: str) -> RunLink | None:
    """What the store recorded of a DAG run id (None if none of its stage tasks ran yet)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(
                t.dag_runs.c.pipeline_key, t.dag_runs.c.generation, t.dag_runs.c.run_instance
            ).where(t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id)
        ).first()
    if row is None:
        return None
    return RunLink(
        pipeline_key=str(row.pipeline_key),
        generation=int(row.generation or 1),
        instance=RunInstance.from_dict(row.run_instance),
    )


def pipeline_of_dag_run(engine: Engine, dag_id: str, run_id: str) -> str | None:
    """The pipeline key a DAG run works on, None if none of its stage tasks ran yet."""
    with engine.connect() as conn:
        key = conn.execute(
            select(t.dag_runs.c.pipeline_key).where(
                t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id
            )
        ).scalar()
    return None if key is None else str(key)


def dag_ids_of(engine: Engine, pipeline_key: str) -> set[str]:
    """The DAGs whose runs worked on a pipeline."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.dag_runs.c.dag_id).where(t.dag_runs.c.pipeline_key == pipeline_key)
        ).scalars()
        return {str(row) for row in rows}


def pipeline_keys_newest_first(engine: Engine, dag_id: str | None = None) -> list[str]:
    """Pipeline keys by their newest DAG run link, newest first (of ``dag_id`` if given)."""
    query = select(t.dag_runs.c.pipeline_key, t.dag_runs.c.created_at)
    if dag_id is not None:
        query = query.where(t.dag_runs.c.dag_id == dag_id)
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(t.dag_runs.c.created_at.desc())).all()
    keys: list[str] = []
    for key, _ in rows:
        if key not in keys:
            keys.append(str(key))
    return keys
