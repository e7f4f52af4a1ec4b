"""The record of which pipeline committed which logical date into which sink: a sink without a
declared slice appends, so a second pipeline committing one date writes it twice; the stage task
warns (``operators.scheduling.warn_repeated_dates``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, insert, select

from airflow_finalckpt.store import schema as t


def record_sink_dates(
    engine: Engine,
    pipeline_key: str,
    stage_id: str,
    logical_date: str,
    sinks: Sequence[str],
    now: float,
) -> dict[str, list[str]]:
    """Record that the pipeline committed ``logical_date`` into ``sinks`` (idempotent); return,
    per sink, the other pipelines that committed the same date into it before.
    """
    table = t.sink_dates
    others: dict[str, list[str]] = {}
    with engine.begin() as conn:
        for sink in sinks:
            same = (table.c.sink == sink) & (table.c.logical_date == logical_date)
            keys = set(conn.execute(select(table.c.pipeline_key).where(same)).scalars())
            if pipeline_key not in keys:
                conn.execute(
                    insert(table).values(
                        sink=sink,
                        logical_date=logical_date,
                        pipeline_key=pipeline_key,
                        stage_id=stage_id,
                        committed_at=now,
                    )
                )
            if keys - {pipeline_key}:
                others[sink] = sorted(keys - {pipeline_key})
    return others
