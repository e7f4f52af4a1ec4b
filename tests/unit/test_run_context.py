"""The Airflow run a stage works for, as plain values (``core.run_context``), and the rules a
stage applies to it when it starts (``operators.scheduling``: the splits callable, empty input,
sink slices)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from airflow_finalckpt.core.errors import StageDefinitionError, is_permanent
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.operators.scheduling import (
    call_splits,
    check_empty,
    check_slices,
    own_copies,
    run_context_of,
)
from airflow_finalckpt.runtime.assembly import StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.sinks.base import SinkError, check_slice
from airflow_finalckpt.spark.job import DriverJob

START = dt.datetime(2013, 1, 5, tzinfo=dt.UTC)


def _context() -> dict[str, Any]:
    from types import SimpleNamespace

    return {
        "dag": SimpleNamespace(dag_id="daily"),
        "dag_run": SimpleNamespace(conf={"note": "rerun", "when": dt.date(2013, 1, 5)}),
        "run_id": "scheduled__2013-01-05",
        "logical_date": START,
        "data_interval_start": START,
        "data_interval_end": START + dt.timedelta(days=1),
        "params": {"region": "EWR", "limit": 3},
    }


def test_the_run_context_is_captured_as_json_values_and_read_back_as_datetimes() -> None:
    run = run_context_of(_context())
    assert run.data_interval_start == START
    assert run.data_interval_end == START + dt.timedelta(days=1)
    assert run.ds == "2013-01-05"
    assert (run.dag_id, run.run_id) == ("daily", "scheduled__2013-01-05")
    assert run.params == {"region": "EWR", "limit": 3}
    assert run.conf == {"note": "rerun", "when": "2013-01-05"}  # JSON values only
    assert RunContext.from_json(run.to_json()) == run
    assert RunContext.from_json(None).logical_date is None and RunContext().ds is None


def test_a_submitted_driver_gets_the_same_run_context_through_its_job_spec() -> None:
    run = run_context_of(_context())
    stage = StageJob(spec=StageSpec(pipeline_key="k", stage_id="s", splits=("a",)), run=run)
    job = DriverJob.for_stage(
        stage,
        submission_id="sub",
        storage_uri="/tmp/x",
        store_url_masked="sqlite://",
        code={},
        spark_conf={},
    )
    assert DriverJob.from_json(job.to_json()).stage_job().run == run
    doc = json.loads(job.to_json())
    doc.pop("run_context")  # a spec written before the run context was carried
    assert DriverJob.from_json(json.dumps(doc).encode()).stage_job().run == RunContext()


def test_the_splits_callable_gets_the_run_context_or_nothing() -> None:
    run = run_context_of(_context())
    assert call_splits("s", ["a", "b"], run) == ["a", "b"]
    assert call_splits("s", lambda: ("x",), run) == ["x"]
    assert call_splits("s", lambda r: [f"day={r.ds}"], run) == ["day=2013-01-05"]

    def files(run: RunContext, suffix: str = ".parquet") -> list[str]:
        return [f"{run.ds}{suffix}"]

    assert call_splits("s", files, run) == ["2013-01-05.parquet"]
    with pytest.raises(StageDefinitionError, match="returned one string"):
        call_splits("s", lambda: "abc", run)


class Log:
    def __init__(self) -> None:
        self.warned: list[str] = []

    def warning(self, event: str, *args: Any) -> None:
        self.warned.append(event % args)


def test_empty_input_warns_and_allow_empty_false_fails_naming_the_rule() -> None:
    log = Log()
    check_empty("read_day", ["a"], False, log)
    assert log.warned == []
    check_empty("read_day", [], True, log)
    assert log.warned == [
        "stage read_day has no input: 0 splits for this run (it finishes with empty output; "
        "pass allow_empty=False to make this an error)"
    ]
    with pytest.raises(StageDefinitionError, match="rule empty-input") as refused:
        check_empty("read_day", [], False, log)
    assert is_permanent(refused.value)


def test_a_slice_needs_final_commits(tmp_path: Any) -> None:
    sink = ParquetTableSink("p", str(tmp_path / "t"), replace_slice={"day": "{{ ds }}"})
    check_slices("publish", [sink], "final")
    with pytest.raises(ValueError, match="replace_slice, which needs commit_mode='final'"):
        check_slices("publish", [sink], "progressive")
    check_slices("publish", [ParquetTableSink("q", str(tmp_path / "u"))], "progressive")


def test_a_malformed_slice_is_refused_in_one_line() -> None:
    assert check_slice("s", None) is None
    assert check_slice("s", {"day": "2013-01-05", "n": 3}) == {"day": "2013-01-05", "n": 3}
    for bad in ({}, {"a b": "x"}, {"day": 1.5}, {"day": None}, "day"):
        with pytest.raises(SinkError, match="sink 's': replace_slice"):
            check_slice("s", bad)  # type: ignore[arg-type]


def test_rendering_works_on_copies_the_dag_keeps_its_templates(tmp_path: Any) -> None:
    sink = ParquetTableSink("p", str(tmp_path / "t"), replace_slice={"day": "{{ ds }}"})
    (copy,) = own_copies([sink])
    copy.replace_slice = {"day": "2013-01-05"}  # what Airflow's nested rendering does
    assert sink.replace_slice == {"day": "{{ ds }}"}
    assert copy.table_uri == sink.table_uri
