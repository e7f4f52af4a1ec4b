"""The partitioned example (``dags/nycflights13_partitioned.py``) through real ``dag.test()``,
real Spark and the four real sinks: the producer's run for a day partition publishes exactly
that day's flights (an independent pandas computation) to every sink, each owning the
partition, with one partitioned Asset event; the consumer's run for the partition counts the
committed day per carrier. Partitioned runs under ``dag.test()``: ``tests/partitioned_runs.py``.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from airflow.sdk import Asset

from airflow_finalckpt.examples.nycflights13.daily import daily_sinks
from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR, prepare_inputs
from airflow_finalckpt.examples.nycflights13.partitioned import (
    DAY_SLICE,
    build_consumer_dag,
    build_producer_dag,
)
from airflow_finalckpt.sinks import ParquetTableSink
from tests.partitioned_runs import asset_events, partitioned

pytestmark = pytest.mark.slow

DAY = dt.date(2013, 1, 2)


def _expected(input_dir: Path) -> pd.DataFrame:
    frame = pd.read_parquet(input_dir / FLIGHTS_DIR / f"day={DAY.isoformat()}.parquet")
    return frame[(frame.month == DAY.month) & (frame.day == DAY.day)]


def test_a_day_partition_is_published_announced_and_consumed(
    airflow_home: Any, local_store: Path, spark: Any, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    input_dir, output = tmp_path / "input", tmp_path / "output"
    prepare_inputs(input_dir, days=[DAY])
    output.mkdir()
    asset = Asset(f"nycflights13_partitioned_{suffix}")
    kw = {"input_dir": str(input_dir), "output_dir": str(output), "prepare": False}
    source = (
        "from airflow.sdk import Asset\n"
        "from airflow_finalckpt.examples.nycflights13.partitioned import build_consumer_dag\n"
        "from airflow_finalckpt.examples.nycflights13.partitioned import build_producer_dag\n"
        f"asset = Asset({asset.name!r})\n"
        f"dag = build_producer_dag('producer_{suffix}', retries=0, asset=asset, **{kw!r})\n"
        f"consumer = build_consumer_dag('consumer_{suffix}', output_dir={str(output)!r}, "
        "retries=0, asset=asset)\n"
    )
    dag_file = airflow_home.dags_folder / f"partitioned_{suffix}.py"
    dag_file.write_text(source)
    try:
        producer = build_producer_dag(f"producer_{suffix}", retries=0, asset=asset, **kw)
        consumer = build_consumer_dag(
            f"consumer_{suffix}", output_dir=str(output), retries=0, asset=asset
        )
        start = dt.datetime(2013, 1, 2, tzinfo=dt.UTC)
        with partitioned(DAY.isoformat(), start):
            run = producer.test(logical_date=start)
        assert str(run.state).endswith("success")
        expected = _expected(input_dir)
        for sink in daily_sinks(str(output), f"sqlite:///{output}/partitioned_flights.db"):
            got = sink.read_pandas()
            assert set(got["event_date"].astype(str)) == {DAY.isoformat()}, sink.sink_id
            assert len(got) == len(expected), sink.sink_id
            assert sorted(got["flight"].astype(int)) == sorted(expected["flight"]), sink.sink_id
        [(key, extra)] = asset_events(asset.name)
        assert key == DAY.isoformat() and extra["rows"] == 4 * len(expected)

        with partitioned(DAY.isoformat(), start):
            done = consumer.test(logical_date=start)
        assert str(done.state).endswith("success")
        counts = ParquetTableSink(
            "c", str(output / "parquet" / "carrier_day"), replace_slice=DAY_SLICE
        ).read_pandas()
        got_counts = {str(r.carrier): int(r.flights) for r in counts.itertuples()}
        assert got_counts == {str(k): int(v) for k, v in expected.groupby("carrier").size().items()}
        assert set(counts["event_date"]) == {DAY.isoformat()}
    finally:
        dag_file.unlink(missing_ok=True)


def test_the_dag_file_has_a_producer_per_day_partition_and_a_partition_consumer(
    airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk import CronPartitionTimetable, PartitionedAssetTimetable

    monkeypatch.setenv("FINALCKPT_EXAMPLE_PARTITIONED_OUTPUT", str(tmp_path))
    path = Path(__file__).resolve().parents[2] / "dags" / "nycflights13_partitioned.py"
    spec = importlib.util.spec_from_file_location("nycflights13_partitioned_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    producer, consumer = module.dag, module.consumer
    assert isinstance(producer.timetable, CronPartitionTimetable)
    assert isinstance(consumer.timetable, PartitionedAssetTimetable)
    assert [t.task_id for t in producer.topological_sort()] == [
        "prepare_day",
        "read_day",
        "publish",
    ]
    sinks = producer.get_task("publish").sinks
    assert len(sinks) == 4 and all(s.replace_slice == DAY_SLICE for s in sinks)
    assert [o.name for o in producer.get_task("publish").outlets] == [
        "nycflights13_partitioned_flights"
    ]
