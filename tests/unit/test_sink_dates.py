"""A sink without a declared slice appends: the task log warns when a second pipeline commits
the same logical date into it (``finalckpt_sink_dates``, migration 0009), never for a sink with
a slice, a re-publication or a run without a logical date."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.operators.scheduling import warn_repeated_dates
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from airflow_finalckpt.store.pipelines import count_pipeline_rows, delete_pipeline_rows


class Log:
    def __init__(self) -> None:
        self.warned: list[str] = []

    def info(self, event: str, *args: Any) -> None:
        pass

    def warning(self, event: str, *args: Any) -> None:
        self.warned.append(event % args)


def _context(day: dt.datetime | None) -> dict[str, Any]:
    return {"logical_date": day, "run_id": "r", "dag_run": SimpleNamespace(conf={})}


def test_a_second_pipeline_committing_a_date_into_an_appending_sink_is_warned(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coordinators = []
    for key in ("daily.run-1", "daily.run-2", "daily.run-3"):
        coordinator = Coordinator(engine, key)
        coordinator.register(StageGraph.from_edges(["publish"], []))
        coordinators.append(coordinator)
    appending = ParquetTableSink("flights", str(tmp_path / "flights"))
    sliced = ParquetTableSink("days", str(tmp_path / "days"), replace_slice={"d": "x"})
    day = dt.datetime(2013, 1, 5, tzinfo=dt.UTC)
    log = Log()
    stage = SimpleNamespace(stage_id="publish", sinks=[appending, sliced], log=log)

    first, second, third = coordinators
    assert warn_repeated_dates(first, stage, _context(day), republish=False) == {}
    assert warn_repeated_dates(first, stage, _context(day), republish=False) == {}  # idempotent
    assert log.warned == []
    assert warn_repeated_dates(second, stage, _context(day), republish=True) == {}
    others = warn_repeated_dates(second, stage, _context(day), republish=False)
    assert others == {appending.asset_uri: ["daily.run-1"]}  # the sliced sink is not named
    [line] = log.warned
    assert line.startswith("sink flights: pipelines ['daily.run-1'] already committed logical")
    assert "2013-01-05T00:00:00+00:00" in line and "replace_slice" in line
    assert warn_repeated_dates(third, stage, _context(None), republish=False) == {}
    other_day = day + dt.timedelta(days=1)
    assert warn_repeated_dates(third, stage, _context(other_day), republish=False) == {}

    # retention removes a pipeline's records with its other rows
    rows = count_pipeline_rows(engine, "daily.run-1")
    assert delete_pipeline_rows(engine, "daily.run-1") == rows
    assert warn_repeated_dates(third, stage, _context(day), republish=False) == {
        appending.asset_uri: ["daily.run-2"]
    }
