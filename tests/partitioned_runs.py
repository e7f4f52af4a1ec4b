"""Partitioned DAG runs under ``dag.test()``, and the partitioned Asset events they emitted.

Airflow 3.3's ``dag.test()`` has no partition argument: ``partitioned()`` gives the DAG run it
creates a partition key and date, as the scheduler does for a ``CronPartitionTimetable`` run or
a run triggered with ``partition_key``; everything after (the task context, the execution API,
the Asset events in the metadata database) is Airflow's own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock


@contextmanager
def partitioned(key: str, date: dt.datetime | None = None) -> Iterator[None]:
    """The DAG run ``dag.test()`` creates is a partitioned one (``partition_key``, ``_date``)."""
    import airflow.models.dagrun as dagrun_module

    create = dagrun_module.get_or_create_dagrun

    def with_partition(**kwargs: Any) -> Any:
        run = create(**kwargs)
        run.partition_key, run.partition_date = key, date
        kwargs["session"].commit()
        return run

    with mock.patch.object(dagrun_module, "get_or_create_dagrun", with_partition):
        yield


def asset_events(name: str) -> list[tuple[str | None, dict[str, Any]]]:
    """The Asset's events in Airflow's metadata database: (partition key, extra), oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == name)
            .order_by(AssetEvent.id)
        ).all()
        return [(e.partition_key, dict(e.extra or {})) for e in events]
