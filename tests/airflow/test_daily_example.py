"""Issue 26's findings replayed on the scheduled example (``dags/nycflights13_daily.py``) through
real ``dag.test(logical_date=...)``, real Spark and the four real sinks (Parquet, SQLite,
Iceberg, Delta), each declaring the day as its ``replace_slice``:

- a stage sees the run's data interval (the splits callable and ``ctx``), and the sinks' slice
  is rendered per run;
- a rerun of a day in a new pipeline run leaves one copy of the day in every sink, the other
  days untouched;
- a late file added to a finished day, or a key reused for another day, is never skipped
  silently: processed, or refused naming the rule;
- an empty day is warned about (``allow_empty=False`` makes it an error).
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.core.split_list import FINISHED_SPLIT_LIST_RULE
from airflow_finalckpt.examples.nycflights13.daily import build_daily_dag, daily_sinks
from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR, prepare_inputs

pytestmark = pytest.mark.slow

DAYS = [dt.date(2013, 1, 1), dt.date(2013, 1, 2), dt.date(2013, 1, 3)]


@pytest.fixture(scope="module")
def daily_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("daily_input")
    prepare_inputs(root, days=DAYS)
    return root


@pytest.fixture
def work(
    airflow_home: Any, local_store: Path, tmp_path: Path, daily_input: Path
) -> Iterator[dict[str, Any]]:
    input_dir = tmp_path / "input"
    shutil.copytree(daily_input, input_dir)
    dag_id = f"daily_{uuid.uuid4().hex[:8]}"
    dag_file = airflow_home.dags_folder / f"{dag_id}.py"
    output = tmp_path / "output"
    output.mkdir()
    dag_file.write_text(
        "from airflow_finalckpt.examples.nycflights13.daily import build_daily_dag\n"
        f"dag = build_daily_dag({dag_id!r}, input_dir={str(input_dir)!r}, "
        f"output_dir={str(output)!r}, prepare=False, retries=0)\n"
    )
    dag = build_daily_dag(
        dag_id, input_dir=str(input_dir), output_dir=str(output), prepare=False, retries=0
    )
    try:
        yield {"dag": dag, "input": input_dir, "output": output}
    finally:
        dag_file.unlink(missing_ok=True)


def _day(date: dt.date) -> dt.datetime:
    """The logical date of a manual run whose data interval is ``date``: Airflow infers a
    manual run's interval as the one ending at its logical date (a scheduled run's logical
    date is its interval's start).
    """
    return dt.datetime(date.year, date.month, date.day, tzinfo=dt.UTC) + dt.timedelta(days=1)


def _expected(input_dir: Path, date: dt.date) -> pd.DataFrame:
    """The day's flights from its input files, independently of the pipeline (pandas)."""
    files = sorted((input_dir / FLIGHTS_DIR).glob(f"day={date.isoformat()}*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    frame = frame[(frame.month == date.month) & (frame.day == date.day)]
    return frame


def _sink_rows(output: Path) -> dict[str, pd.DataFrame]:
    """Every sink's committed rows (the sink objects read their own tables)."""
    sinks = daily_sinks(str(output), f"sqlite:///{output}/daily_flights.db")
    return {sink.sink_id: sink.read_pandas() for sink in sinks}


def _counts(frame: pd.DataFrame) -> dict[str, int]:
    if frame.empty:
        return {}
    return {str(k): int(v) for k, v in frame.groupby("event_date").size().items()}


def _state(dag_run: Any) -> str:
    return str(dag_run.state).rsplit(".", 1)[-1].lower()


def test_a_rerun_of_a_day_in_a_new_pipeline_replaces_it_in_every_sink(
    work: dict[str, Any],
) -> None:
    dag, input_dir, output = work["dag"], work["input"], work["output"]
    first, second = DAYS[0], DAYS[1]
    assert _state(dag.test(logical_date=_day(first))) == "success"
    assert _state(dag.test(logical_date=_day(second))) == "success"
    # a new pipeline run of the first day (after a fix; a backfill of a day with no run left)
    rerun = dag.test(logical_date=_day(first), run_conf={"pipeline_key": "rerun-of-day-1"})
    assert _state(rerun) == "success"
    want = {
        first.isoformat(): len(_expected(input_dir, first)),
        second.isoformat(): len(_expected(input_dir, second)),
    }
    assert all(want.values())
    for sink_id, rows in _sink_rows(output).items():
        assert _counts(rows) == want, sink_id
        key = ["event_date", "carrier", "flight", "origin", "sched_dep_time"]
        assert not rows.duplicated(subset=key).any(), sink_id


def _key(dag_run: Any) -> str:
    from airflow_finalckpt.operators.stage import default_pipeline_key

    return default_pipeline_key(dag_run.dag_id, dag_run.run_id)


def test_a_late_file_or_a_reused_key_is_never_skipped_silently(
    work: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    dag, input_dir, output = work["dag"], work["input"], work["output"]
    day, other = DAYS[2], DAYS[0]
    first = dag.test(logical_date=_day(day))
    assert _state(first) == "success"
    before = {sink_id: _counts(rows) for sink_id, rows in _sink_rows(output).items()}
    # a late file for the finished day, then the same pipeline again (a clear, a retry)
    flights = input_dir / FLIGHTS_DIR
    late = pd.read_parquet(flights / f"day={day.isoformat()}.parquet").head(7)
    late["flight"] = late["flight"] + 100_000
    late.to_parquet(flights / f"day={day.isoformat()}.late.parquet", index=False)
    capfd.readouterr()
    again = dag.test(logical_date=_day(day), run_conf={"pipeline_key": _key(first)})
    log = "".join(capfd.readouterr())
    want = len(_expected(input_dir, day))
    # refused, naming the rule (docs/scheduling.md); nothing changed in any sink
    assert _state(again) == "failed", log[-4000:]
    assert FINISHED_SPLIT_LIST_RULE in log
    after = {sink_id: _counts(rows) for sink_id, rows in _sink_rows(output).items()}
    assert after == before
    assert all(counts == {day.isoformat(): want - len(late)} for counts in before.values())
    # a new pipeline run of the day processes the late file: the day, once, with it
    assert _state(dag.test(logical_date=_day(day))) == "success"
    for sink_id, rows in _sink_rows(output).items():
        assert _counts(rows) == {day.isoformat(): want}, sink_id
    # the key of that day reused for another day: its splits differ, refused by the rule
    capfd.readouterr()
    reused = dag.test(logical_date=_day(other), run_conf={"pipeline_key": _key(first)})
    assert _state(reused) == "failed"
    assert FINISHED_SPLIT_LIST_RULE in "".join(capfd.readouterr())
    for sink_id, rows in _sink_rows(output).items():
        assert other.isoformat() not in _counts(rows), sink_id


def test_an_empty_day_is_warned_about(
    work: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    dag, output = work["dag"], work["output"]
    capfd.readouterr()
    empty = dag.test(logical_date=_day(dt.date(2013, 2, 1)))  # no input files for that day
    log = "".join(capfd.readouterr())
    assert _state(empty) == "success", log[-4000:]
    assert "stage read_day has no input: 0 splits for this run" in log
    assert all(rows.empty for rows in _sink_rows(output).values())


def test_the_dag_file_schedules_one_run_per_day_with_a_slice_in_every_sink(
    airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from airflow.sdk import CronDataIntervalTimetable

    monkeypatch.setenv("FINALCKPT_EXAMPLE_DAILY_OUTPUT", str(tmp_path))
    path = Path(__file__).resolve().parents[2] / "dags" / "nycflights13_daily.py"
    spec = importlib.util.spec_from_file_location("nycflights13_daily_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == "nycflights13_daily"
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert (dag.start_date.date(), dag.catchup) == (dt.date(2013, 1, 1), False)
    assert [t.task_id for t in dag.topological_sort()] == ["prepare_day", "read_day", "publish"]
    sinks = dag.get_task("publish").sinks
    assert sorted(type(s).__name__ for s in sinks) == [
        "DeltaTableSink",
        "IcebergTableSink",
        "ParquetTableSink",
        "SqlTableSink",
    ]
    assert {str(s.replace_slice) for s in sinks} == {
        "{'event_date': '{{ data_interval_start | ds }}'}"
    }
