"""Which Airflow run a stage works for, as plain JSON values: its logical date, data interval,
partition key and date (a partitioned run, AIP-76), params, run id and conf. The Airflow task
captures them from its context; they travel in a submitted driver's job spec, so a stage sees
the same values wherever Spark runs, and nothing on the Spark side imports Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


def _plain(value: Any) -> Any:
    """``value`` as JSON values (dates become ISO strings, anything else its ``str``)."""
    return json.loads(json.dumps(value, default=_iso))


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _instant(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True)
class RunContext:
    """The Airflow run of a stage attempt; ISO strings inside, datetimes through properties.

    A manual run without a logical date has ``logical_date`` None (Airflow 3), and so has a
    stage run outside Airflow (tests, the benchmarks).
    """

    dag_id: str | None = None
    run_id: str | None = None
    logical_date_iso: str | None = None
    data_interval_start_iso: str | None = None
    data_interval_end_iso: str | None = None
    #: A partitioned DAG run's partition key (``CronPartitionTimetable``, an asset-triggered
    #: run of a ``PartitionedAssetTimetable``, a run triggered with one); None otherwise.
    partition_key: str | None = None
    partition_date_iso: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    conf: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        dag_id: str | None = None,
        run_id: str | None = None,
        logical_date: Any = None,
        data_interval_start: Any = None,
        data_interval_end: Any = None,
        partition_key: str | None = None,
        partition_date: Any = None,
        params: Mapping[str, Any] | None = None,
        conf: Mapping[str, Any] | None = None,
    ) -> RunContext:
        """From Airflow's values (pendulum or stdlib datetimes, any params): JSON-able copies."""
        return cls(
            dag_id=dag_id,
            run_id=run_id,
            logical_date_iso=None if logical_date is None else _iso(logical_date),
            data_interval_start_iso=(
                None if data_interval_start is None else _iso(data_interval_start)
            ),
            data_interval_end_iso=None if data_interval_end is None else _iso(data_interval_end),
            partition_key=None if partition_key is None else str(partition_key),
            partition_date_iso=None if partition_date is None else _iso(partition_date),
            params=_plain(dict(params or {})),
            conf=_plain(dict(conf or {})),
        )

    @property
    def logical_date(self) -> datetime | None:
        """The DAG run's logical date (timezone-aware), None for a run without one."""
        return _instant(self.logical_date_iso)

    @property
    def data_interval_start(self) -> datetime | None:
        """Start of the run's data interval (inclusive)."""
        return _instant(self.data_interval_start_iso)

    @property
    def data_interval_end(self) -> datetime | None:
        """End of the run's data interval (exclusive)."""
        return _instant(self.data_interval_end_iso)

    @property
    def partition_date(self) -> datetime | None:
        """The partition's date where Airflow gives one (a ``CronPartitionTimetable`` run, a
        temporal mapper's downstream run); None for a run without a partition or a key that
        is no date (``us``, ``us|2026-03-10``).
        """
        return _instant(self.partition_date_iso)

    def partition_parts(self, separator: str = "|") -> list[str]:
        """The partition key split at ``separator`` (``us|2026-03-10`` -> ``["us",
        "2026-03-10"]``, the composite keys of ``ProductMapper``); [] without a key.
        """
        return [] if self.partition_key is None else self.partition_key.split(separator)

    @property
    def ds(self) -> str | None:
        """The logical date as ``YYYY-MM-DD`` (Airflow's ``{{ ds }}``)."""
        date = self.logical_date
        return None if date is None else date.strftime("%Y-%m-%d")

    def to_json(self) -> dict[str, Any]:
        """The plain values a driver's job spec carries."""
        doc = asdict(self)
        doc["params"], doc["conf"] = dict(self.params), dict(self.conf)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> RunContext:
        """Back from ``to_json`` (None or an empty document: no Airflow run)."""
        doc = dict(doc or {})
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)
