"""The pure parts of the real-Airflow benchmark (benchmarks/airflow_real.py): its ABBA plan, the
profile lines read back from task logs, a stage task's breakdown and the ratios and targets
computed from recorded timings. The benchmark itself needs a whole Airflow deployment and is
run by hand (docs/benchmarks.md); nothing here starts one."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from benchmarks.airflow_profile import MARK, PhaseTimer
from benchmarks.airflow_real import (
    STAGES,
    Sample,
    Step,
    abba_schedule,
    batch_seconds,
    breakdown,
    outside_spark,
    parse_profiles,
    profile_table,
    report,
    stage_times,
    times_table,
)
from benchmarks.common import Result

T0 = dt.datetime(2026, 11, 27, 21, 0, tzinfo=dt.UTC).timestamp()


def iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(T0 + seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def test_abba_plan_alternates_sides_and_reuses_ids_when_warm() -> None:
    plan = abba_schedule(1)
    assert [(s.kind, s.side, s.dag_id) for s in plan] == [
        ("cold", "ours", "bench_ours_0"),
        ("cold", "plain", "bench_plain_0"),
        ("cold", "plain", "bench_plain_1"),
        ("cold", "ours", "bench_ours_1"),
        ("warm", "ours", "bench_ours_0"),
        ("warm", "plain", "bench_plain_0"),
        ("warm", "plain", "bench_plain_1"),
        ("warm", "ours", "bench_ours_1"),
    ]
    two = abba_schedule(2)
    cold_ids = [s.dag_id for s in two if s.kind == "cold"]
    assert len(cold_ids) == len(set(cold_ids)) == 8  # every cold run is a fresh DAG id
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        abba_schedule(0)


def doc(phase: str, enter: float, leave: float, outcome: str, **seconds: float) -> dict:
    return {
        "phase": phase,
        "process_started": T0 + enter - 3.0,
        "parse_started": T0 + enter - 2.0,
        "parsed": T0 + enter - 0.5,
        "enter": T0 + enter,
        "exit": T0 + leave,
        "outcome": outcome,
        "seconds": seconds,
        "calls": {},
    }


def rendered_log(*docs: dict) -> str:
    """A task log as ``AirflowCluster.logs`` renders it (one event a line, extras after)."""
    lines = ["2026-11-27T21:00:00Z [info] stage ingest runs Spark in-process on local[*]"]
    for d in docs:
        lines.append(f"2026-11-27T21:00:05Z [info] {MARK} {json.dumps(d)} logger=task.operators")
    lines.append(f"2026-11-27T21:00:06Z [info] {MARK} not json")
    return "\n".join(lines)


def test_breakdown_of_a_deferred_stage_adds_up_to_its_task_instance() -> None:
    first = doc("execute", 4.0, 24.0, "deferred", coordinator=1.5, spark_session=6.0, xcom=0.1)
    resumed = doc("execute_complete", 31.0, 32.0, "returned", coordinator=0.4, sink_2pc=0.2)
    ti = {"task_id": "publish", "start_date": iso(0.0), "end_date": iso(33.0)}
    docs = parse_profiles(rendered_log(first, resumed))
    assert [d["phase"] for d in docs] == ["execute", "execute_complete"]
    parts = breakdown(ti, docs)
    assert parts["task_start"] == pytest.approx(4.0)
    assert parts["dag_parse"] == pytest.approx(1.5)
    assert parts["spark_work"] == pytest.approx(20.0 - 7.6)
    assert parts["defer_wait"] == pytest.approx(31.0 - 3.0 - 24.0)
    assert parts["resume_start"] == pytest.approx(3.0)
    assert parts["close_coordinator"] == pytest.approx(0.4)
    assert parts["close_other"] == pytest.approx(1.0 - 0.6)
    assert parts["task_end"] == pytest.approx(1.0)
    total = sum(v for k, v in parts.items() if k != "dag_parse")
    assert total == pytest.approx(33.0)
    # outside Spark: everything but the session, the batches (and sink writes, state files)
    assert outside_spark(parts) == pytest.approx(33.0 - 6.0 - 12.4)
    line = "2026-11-27T21:00:20Z [info] stage publish: 1/1 splits (100%) after batch 2013-01-01-n1"
    text = f"{line} (1 splits in 8.25s; 0.3 MB/s + 0.00s per batch)\n{line} (2 splits in 1.5s)"
    assert batch_seconds(text) == pytest.approx(9.75)
    with_batches = breakdown(ti, docs, batch_seconds(text))
    assert with_batches["batches"] == pytest.approx(9.75)  # inside spark_work: not added
    assert outside_spark(with_batches) == pytest.approx(outside_spark(parts))


def test_breakdown_of_a_plain_task_and_of_a_log_without_profile_lines() -> None:
    plain = doc("execute", 2.0, 12.0, "returned", spark_session=5.0, spark_stop=0.5)
    ti = {"task_id": "ingest", "start_date": iso(0.0), "end_date": iso(13.0)}
    parts = breakdown(ti, parse_profiles(rendered_log(plain)))
    assert set(parts) == {
        "task_start",
        "dag_parse",
        "spark_session",
        "spark_stop",
        "spark_work",
        "task_end",
    }
    assert parts["spark_work"] == pytest.approx(4.5)
    assert outside_spark(parts) == pytest.approx(2.0 + 1.0)
    assert breakdown(ti, parse_profiles("no profile here")) == {}
    # a task's log file: one JSON object a line, the profile inside its event text
    record = {"timestamp": iso(12.0), "level": "info", "event": f"{MARK} {json.dumps(plain)}"}
    from_file = parse_profiles(json.dumps(record) + "\n{not json\n")
    assert breakdown(ti, from_file) == parts


def test_stage_times_and_gaps_follow_the_task_order() -> None:
    tis = [
        {"task_id": "enrich", "start_date": iso(12.0), "end_date": iso(20.0)},
        {"task_id": "prepare_input", "start_date": iso(0.0), "end_date": iso(5.0)},
        {"task_id": "ingest", "start_date": iso(6.5), "end_date": iso(10.0)},
    ]
    durations, gaps = stage_times(tis)
    assert durations == pytest.approx({"prepare_input": 5.0, "ingest": 3.5, "enrich": 8.0})
    assert gaps == pytest.approx({"ingest": 1.5, "enrich": 2.0})


def sample(kind: str, side: str, index: int, whole: float, stage: float) -> Sample:
    s = Sample(Step(kind, side, index), f"run-{kind}-{side}-{index}", whole, load_1m=(3.0, 5.0))
    s.stage_s = {name: stage for name in STAGES}
    s.profile = {"ingest": {"task_start": 1.0, "spark_work": stage - 1.0}}
    s.output_rows = 100
    return s


def test_report_judges_the_medians_of_the_abba_samples() -> None:
    samples = [
        sample("cold", "ours", 0, 120.0, 25.0),
        sample("cold", "plain", 0, 100.0, 20.0),
        sample("cold", "plain", 1, 100.0, 20.0),
        sample("cold", "ours", 1, 110.0, 25.0),
        sample("warm", "ours", 0, 104.0, 21.0),
        sample("warm", "plain", 0, 100.0, 20.0),
        sample("warm", "plain", 1, 100.0, 20.0),
        sample("warm", "ours", 1, 104.0, 21.0),
    ]
    result = Result("airflow_real")
    report(result, samples)
    assert result.ratios["ours_over_plain/cold"] == pytest.approx(1.15)
    assert result.ratios["ours_over_plain/warm"] == pytest.approx(1.04)
    assert result.ratios["ours_over_plain/warm/enrich"] == pytest.approx(1.05)
    assert result.medians["paired_ratio_median/cold"] == pytest.approx(1.15)
    assert result.medians["load_1m_max"] == 5.0
    verdicts = {t.name: t.passed for t in result.targets}
    assert verdicts == {
        "real Airflow, whole DAG ours/plain, cold": True,  # 1.15 <= 1.15
        "real Airflow, whole DAG ours/plain, warm": True,
    }
    case = next(c for c in result.cases if c.name == "ours/warm")
    assert case.medians["profile/ingest/task_start_s"] == 1.0
    assert case.medians["outside_spark/ingest_s"] == 1.0
    doc = {"cases": [c.to_json() for c in result.cases]}
    assert "| whole DAG run | 115.0 | 100.0 | **1.150** | 104.0 | 100.0 | **1.040** |" in (
        times_table(doc)
    )
    assert "| task_start | 1.0 / 1.0 | - / - | - / - | - / - |" in profile_table(doc, "warm")
    samples[0].whole_s = 130.0  # cold ours median 120: 1.20 misses, and says so
    missed = Result("airflow_real")
    report(missed, samples)
    assert {t.name: t.passed for t in missed.targets}[
        "real Airflow, whole DAG ours/plain, cold"
    ] is False
    assert missed.overall_status() == "miss"


def test_phase_timer_counts_nested_categories_once() -> None:
    clock = iter([0.0, 1.0, 3.0, 10.0]).__next__  # outer enters, inner 1..3, outer leaves
    timer = PhaseTimer(clock)
    inner = timer.wrap(lambda: None, "db_connect")
    outer = timer.wrap(inner, "coordinator")
    timer.begin()
    outer()
    seconds, calls = timer.end()
    outer()  # after end(): not timed (the clock has no more values: it would raise)
    assert seconds == {"db_connect": 2.0, "coordinator": 8.0}
    assert calls == {"db_connect": 1, "coordinator": 1}
