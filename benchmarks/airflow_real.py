"""The example DAG against the same transforms as plain ``@task.pyspark`` tasks, on one real
Airflow deployment (issue 29 item 2): ``python -m benchmarks.run --only airflow``.

One ``AirflowCluster`` (``tests/e2e/airflow_cluster.py``: api-server, scheduler with the
LocalExecutor, triggerer, dag-processor, PostgreSQL metadata; the coordination store in a
PostgreSQL database of its own, checkpoints on local disk), the DAGs of
``benchmarks/airflow_dags/`` over one input directory (365 days at x1 by default). After an
untimed warm-up DAG run, the DAG runs go one at a time in ABBA order: ``cold`` runs are the
first run of a fresh DAG id (ours: no throughput hints yet, a fresh hints scope), ``warm`` runs
are the second run of the same DAG ids (ours: sized from the hints its cold run left).

Measured per run, from the REST API only: the DAG run's start -> end (``whole``), each task
instance's start -> end (per stage; a deferred stage keeps its start across the deferral) and
the gap from its upstream's end to its start (``sched``: scheduler and executor). Where each
stage task's seconds go comes from the ``FINALCKPT_BENCH_PROFILE`` lines every task logs
(``benchmarks.airflow_profile``), read back from the task logs (``breakdown``).

Environment knobs (for a smoke check by hand, not for judged figures):
``FINALCKPT_BENCH_AIRFLOW_DAYS`` (default 365), ``FINALCKPT_BENCH_AIRFLOW_BLOCKS`` (ABBA
blocks, 2 samples per side and kind each; default 1).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.airflow_profile import MARK
from benchmarks.common import Result, Target, log, median, postgres_available, ratio

NAME = "airflow_real"
REPO = Path(__file__).resolve().parents[1]
DAG_DIR = Path(__file__).resolve().parent / "airflow_dags"
STAGES = ("ingest", "enrich", "delay_windows", "publish")
TASKS = ("prepare_input", *STAGES)
KINDS = ("cold", "warm")
SIDES = ("ours", "plain")
WARM_TARGET = 1.05
COLD_TARGET = 1.15
RUN_TIMEOUT_S = 1800.0
DAYS = int(os.environ.get("FINALCKPT_BENCH_AIRFLOW_DAYS", "365"))
BLOCKS = int(os.environ.get("FINALCKPT_BENCH_AIRFLOW_BLOCKS", "1"))
WARMUP_DAG = "bench_warmup"
#: Categories of ``airflow_profile`` that are Spark's work (both sides do it); the rest of a
#: stage task's seconds are outside Spark.
SPARK_PARTS = ("spark_session", "spark_work", "sink_write", "state_io", "spark_stop")
#: Parts inside others (shown, never added): the DAG parse is in ``task_start``, the split
#: batches in ``spark_work``.
SHOWN_ONLY = ("dag_parse", "batches")


@dataclass(frozen=True)
class Step:
    """One timed DAG run of the plan."""

    kind: str
    side: str
    index: int

    @property
    def dag_id(self) -> str:
        return dag_id(self.side, self.index)


def dag_id(side: str, index: int) -> str:
    return f"bench_{side}_{index}"


def abba_schedule(blocks: int) -> list[Step]:
    """Cold runs, then warm runs; in each, per block ours plain plain ours on fresh DAG ids
    (warm: the same ids again), so a drift over the run weighs both sides alike."""
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    steps = []
    for kind in KINDS:
        for block in range(blocks):
            a, b = 2 * block, 2 * block + 1
            for side, index in (("ours", a), ("plain", a), ("plain", b), ("ours", b)):
                steps.append(Step(kind, side, index))
    return steps


def timestamp(value: str | None) -> float | None:
    """Seconds since the epoch of one of the REST API's ISO-8601 times (None stays None)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _event_of(line: str) -> str:
    """A log file's JSON line -> its event text; a rendered line stays as it is."""
    if not line.startswith("{"):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    event = record.get("event") if isinstance(record, dict) else None
    return event if isinstance(event, str) else line


def parse_profiles(log_text: str) -> list[dict[str, Any]]:
    """The profile documents a task logged (``airflow_profile.MARK`` lines), in log order:
    from a log rendered by ``AirflowCluster.logs`` or from the JSON lines of a log file."""
    decoder = json.JSONDecoder()
    docs = []
    for raw in log_text.splitlines():
        line = _event_of(raw)
        at = line.find(MARK)
        if at < 0:
            continue
        start = line.find("{", at)
        if start < 0:
            continue
        try:
            doc, _ = decoder.raw_decode(line[start:])
        except ValueError:
            continue
        if isinstance(doc, dict) and "phase" in doc:
            docs.append(doc)
    return docs


_BATCH_LINE = re.compile(r"after batch \S+ \(\d+ splits in ([0-9.]+)s")


def batch_seconds(log_text: str) -> float:
    """Seconds of our stage's split batches, from the runtime's "after batch" log lines (the
    rest of its Spark work is building the transform's frame for the plan check, the first
    Spark job's warm-up and finish)."""
    return sum(float(m.group(1)) for m in _BATCH_LINE.finditer(log_text))


def _phase_parts(doc: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """One execute's seconds by category; ``spark_work`` (ours: the batches; plain: the
    callable) or ``close_other`` (``execute_complete``) is what no category took."""
    seconds = {str(k): float(v) for k, v in doc.get("seconds", {}).items()}
    rest = float(doc["exit"]) - float(doc["enter"]) - sum(seconds.values())
    parts = {f"{prefix}{k}": v for k, v in seconds.items()}
    parts[f"{prefix}spark_work" if not prefix else f"{prefix}other"] = max(rest, 0.0)
    return parts


def _add(into: dict[str, float], parts: Mapping[str, float]) -> None:
    for key, value in parts.items():
        into[key] = into.get(key, 0.0) + value


def breakdown(
    ti: Mapping[str, Any], docs: Sequence[Mapping[str, Any]], batches_s: float = 0.0
) -> dict[str, float]:
    """A stage task's wall time (start -> end of its task instance) split into parts that add
    up to it: ``task_start`` (process start, DAG parse, up to ``execute``), the categories of
    ``execute``, and for a task deferred on its final checkpoint ``defer_wait`` (from the
    deferral to the resumed task's process start: the checkpoint, the trigger, the scheduler),
    ``resume_start`` and the ``close_*`` categories of ``execute_complete``; ``task_end`` (after
    the last execute: the return value's XCom, the final state). ``batches`` (ours: the split
    batches' seconds, part of ``spark_work``) and ``dag_parse`` (part of ``task_start``) are
    shown, not added. Empty without profile lines.
    """
    start, end = timestamp(ti.get("start_date")), timestamp(ti.get("end_date"))
    first = next((d for d in docs if d.get("phase") == "execute"), None)
    if start is None or end is None or first is None:
        return {}
    parts: dict[str, float] = {"task_start": max(float(first["enter"]) - start, 0.0)}
    parse = float(first.get("parsed") or 0) - float(first.get("parse_started") or 0)
    if parse > 0:
        parts["dag_parse"] = parse  # inside task_start, not added again to the total
    _add(parts, _phase_parts(first))
    if batches_s > 0:
        parts["batches"] = batches_s
    last = first
    resumed = next((d for d in docs if d.get("phase") == "execute_complete"), None)
    if first.get("outcome") == "deferred" and resumed is not None:
        began = float(resumed.get("process_started") or resumed["enter"])
        parts["defer_wait"] = max(began - float(first["exit"]), 0.0)
        parts["resume_start"] = max(float(resumed["enter"]) - began, 0.0)
        _add(parts, _phase_parts(resumed, "close_"))
        last = resumed
    parts["task_end"] = max(end - float(last["exit"]), 0.0)
    return parts


def outside_spark(parts: Mapping[str, float]) -> float:
    """Seconds of a stage task outside Spark's work (``dag_parse`` is inside ``task_start``)."""
    return sum(v for k, v in parts.items() if k not in (*SPARK_PARTS, *SHOWN_ONLY))


@dataclass
class Sample:
    """One timed DAG run."""

    step: Step
    run_id: str
    whole_s: float
    stage_s: dict[str, float] = field(default_factory=dict)
    sched_s: dict[str, float] = field(default_factory=dict)
    profile: dict[str, dict[str, float]] = field(default_factory=dict)
    load_1m: tuple[float, float] = (0.0, 0.0)
    output_rows: int | None = None


def stage_times(
    tis: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Per task: start -> end, and the gap from its upstream task's end to its start."""
    by_id = {ti["task_id"]: ti for ti in tis}
    durations: dict[str, float] = {}
    gaps: dict[str, float] = {}
    previous_end: float | None = None
    for task_id in TASKS:
        ti = by_id.get(task_id)
        if ti is None:
            continue
        start, end = timestamp(ti.get("start_date")), timestamp(ti.get("end_date"))
        if start is None or end is None:
            continue
        durations[task_id] = end - start
        if previous_end is not None:
            gaps[task_id] = start - previous_end
        previous_end = end
    return durations, gaps


# ---------------------------------------------------------------------------- the run


def _output_rows(side: str, out: Path) -> int:
    if side == "plain":
        import pyarrow.parquet as pq

        return int(pq.read_table(out / "publish").num_rows)
    from airflow_finalckpt.sinks import ParquetTableSink

    return len(ParquetTableSink("delay_windows_parquet", str(out / "delay_windows")).read_pandas())


def measure(cluster: Any, step: Step, work: Path, serial: int) -> Sample:
    """Trigger one DAG run, wait for it, read its times and its tasks' profile lines."""
    out = work / "out" / step.dag_id
    before = _output_rows(step.side, out) if step.kind == "warm" and step.side == "ours" else 0
    load_before = os.getloadavg()[0]
    run_id = cluster.trigger_dag(step.dag_id, run_id=f"bench-{serial:02d}-{step.kind}")
    state = cluster.wait_for_run(step.dag_id, run_id, timeout=RUN_TIMEOUT_S)
    if state != "success":
        raise RuntimeError(f"{step.dag_id} run {run_id} ended {state}:\n{cluster.log_tails(60)}")
    run = cluster.dag_run(step.dag_id, run_id)
    tis = cluster.task_instances(step.dag_id, run_id)
    whole = (timestamp(run["end_date"]) or 0.0) - (timestamp(run["start_date"]) or 0.0)
    sample = Sample(step, run_id, whole, load_1m=(load_before, os.getloadavg()[0]))
    sample.stage_s, sample.sched_s = stage_times(tis)
    for ti in tis:
        if ti["task_id"] in STAGES:
            sample.profile[ti["task_id"]] = _stage_profile(cluster, step, run_id, ti)
    sample.output_rows = _output_rows(step.side, out) - before
    return sample


def _stage_profile(
    cluster: Any, step: Step, run_id: str, ti: Mapping[str, Any]
) -> dict[str, float]:
    """The task's breakdown from its log through the REST API; from its log files when the
    API's log lacks the part after a deferral."""
    task_id, tries = ti["task_id"], ti["try_number"]
    text = cluster.logs(step.dag_id, run_id, task_id, tries)
    docs = parse_profiles(text)
    phases = [d.get("phase") for d in docs]
    if "execute_complete" not in phases and any(d.get("outcome") == "deferred" for d in docs):
        folder = cluster.logs_dir / f"dag_id={step.dag_id}" / f"run_id={run_id}"
        files = sorted((folder / f"task_id={task_id}").glob("attempt=*.log"))
        text = "\n".join(p.read_text(errors="replace") for p in files)
        docs = parse_profiles(text) or docs
    return breakdown(ti, docs, batch_seconds(text))


def _cluster_env(work: Path, store_url: str, dags: Sequence[str]) -> dict[str, str]:
    return {
        "AIRFLOW__FINALCKPT__STORE_URL": store_url,
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
        "FINALCKPT_BENCH_WORK": str(work),
        "FINALCKPT_BENCH_DAYS": str(DAYS),
        "FINALCKPT_BENCH_DAGS": ",".join(dags),
    }


def _run_plan(cluster: Any, plan: Sequence[Step], work: Path) -> list[Sample]:
    log(f"{NAME}: warm-up run (untimed: input files, first imports, first trigger)")
    warm = cluster.trigger_dag(WARMUP_DAG, run_id="bench-warmup")
    if cluster.wait_for_run(WARMUP_DAG, warm, timeout=RUN_TIMEOUT_S) != "success":
        raise RuntimeError(f"warm-up run failed:\n{cluster.log_tails(60)}")
    samples = []
    for serial, step in enumerate(plan, start=1):
        log(f"{NAME}: {serial}/{len(plan)} {step.kind} {step.side} ({step.dag_id})")
        sample = measure(cluster, step, work, serial)
        low, high = sample.load_1m
        log(f"{NAME}:   {sample.whole_s:.1f} s, load {low:.1f} -> {high:.1f}")
        samples.append(sample)
    return samples


def run(quick: bool = False) -> Result:
    result = Result(NAME, repetitions=2 * BLOCKS)
    if quick:
        result.status = "skipped"
        result.notes.append("no quick mode: one real-Airflow DAG run takes minutes")
        return result
    reason = postgres_available()
    if reason is not None:
        result.status = "skipped"
        result.notes.append(reason)
        return result
    from benchmarks.common import postgres_database
    from tests.e2e.airflow_cluster import AirflowCluster

    plan = abba_schedule(BLOCKS)
    dags = [f"warmup:{WARMUP_DAG}", *sorted({f"{s.side}:{s.dag_id}" for s in plan})]
    with (
        tempfile.TemporaryDirectory(prefix="finalckpt-bench-airflow-") as tmp,
        postgres_database("finalckpt_bench_airflow") as store_url,
    ):
        work = Path(tmp)
        _store_schema(store_url)
        cluster = AirflowCluster(
            [DAG_DIR],
            extra_env=_cluster_env(work, store_url, dags),
            expect_dags=[d.partition(":")[2] for d in dags],
            python_path=[REPO],
        )
        with cluster:
            log(f"{NAME}: cluster up in {cluster.startup_seconds:.0f} s")
            samples = _run_plan(cluster, plan, work)
    report(result, samples, startup_s=cluster.startup_seconds or 0.0)
    return result


def _store_schema(url: str) -> None:
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(url)
    try:
        ensure_schema(engine)
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------- the report


def _case_of(result: Result, kind: str, side: str, samples: Sequence[Sample]) -> Any:
    case = result.case(f"{side}/{kind}", side=side, kind=kind, days=DAYS)
    for s in samples:
        case.add("seconds", s.whole_s)
        case.add("load_1m", max(s.load_1m))
        case.add("output_rows", float(s.output_rows or 0))
        for task_id, secs in s.stage_s.items():
            case.add(f"{task_id}_s", secs)
        for task_id, secs in s.sched_s.items():
            case.add(f"sched/{task_id}_s", secs)
        for stage, parts in s.profile.items():
            for part, secs in parts.items():
                case.add(f"profile/{stage}/{part}_s", secs)
            if parts:
                case.add(f"outside_spark/{stage}_s", outside_spark(parts))
        case.params.setdefault("run_ids", []).append(f"{s.step.dag_id}/{s.run_id}")
    return case.finalize()


def _stages_sum(medians: Mapping[str, Any]) -> float:
    return sum(float(medians.get(f"{stage}_s", 0.0)) for stage in STAGES)


def report(result: Result, samples: Sequence[Sample], *, startup_s: float = 0.0) -> None:
    """Cases, medians, ratios and the two targets from the recorded samples (pure: the unit
    test feeds it recorded timings)."""
    result.parameters = {
        "days": DAYS,
        "row_scale": 1,
        "abba_blocks": len({s.step.index for s in samples}) // 2,
        "order": [f"{s.step.kind}:{s.step.side}:{s.step.dag_id}" for s in samples],
        "deployment": "tests/e2e AirflowCluster: api-server, scheduler (LocalExecutor, "
        "parallelism 4), triggerer, dag-processor; Airflow metadata and the coordination "
        "store on PostgreSQL; checkpoints and outputs on local disk",
        "spark": "in the task process, local[*], UI off, both sides (JVM defaults plus the "
        "harness's class-data-sharing archive)",
        "cold": "first run of a fresh DAG id (ours: a fresh throughput-hints scope)",
        "warm": "second run of the same DAG id (ours: sized from its cold run's hints)",
        "cluster_startup_s": round(startup_s, 1),
    }
    loads = [x for s in samples for x in s.load_1m]
    if loads:
        result.medians["load_1m_min"], result.medians["load_1m_max"] = min(loads), max(loads)
        result.notes.append(
            f"1-minute load average {min(loads):.1f} to {max(loads):.1f} at the runs' starts and "
            f"ends ({os.cpu_count()} cores): above ~2 the machine was shared, compare the paired "
            "samples and their loads, not the seconds"
        )
    for kind in KINDS:
        cases = {}
        for side in SIDES:
            mine = [s for s in samples if (s.step.kind, s.step.side) == (kind, side)]
            cases[side] = _case_of(result, kind, side, mine)
        _ratios(result, kind, cases["ours"], cases["plain"])


def _ratios(result: Result, kind: str, ours: Any, plain: Any) -> None:
    if "seconds" not in ours.medians or "seconds" not in plain.medians:
        return
    whole = ratio(ours.medians["seconds"], plain.medians["seconds"])
    result.ratios[f"ours_over_plain/{kind}"] = whole
    result.ratios[f"ours_over_plain/{kind}/stages"] = ratio(
        _stages_sum(ours.medians), _stages_sum(plain.medians)
    )
    for stage in STAGES:
        key = f"{stage}_s"
        if key in ours.medians and key in plain.medians:
            result.ratios[f"ours_over_plain/{kind}/{stage}"] = ratio(
                ours.medians[key], plain.medians[key]
            )
    paired = [
        ratio(o, p) for o, p in zip(ours.samples["seconds"], plain.samples["seconds"], strict=False)
    ]
    result.medians[f"paired_ratio_median/{kind}"] = median(paired)
    target = WARM_TARGET if kind == "warm" else COLD_TARGET
    count = len(ours.samples["seconds"])
    result.targets.append(
        Target(
            name=f"real Airflow, whole DAG ours/plain, {kind}",
            target=f"<= {target:.2f}",
            measured=whole,
            passed=bool(whole <= target),
            note=f"medians of {count}: ours {ours.medians['seconds']:.1f} s, "
            f"plain {plain.medians['seconds']:.1f} s; paired {[round(r, 3) for r in paired]}; "
            f"1-minute load up to {max(ours.medians['load_1m'], plain.medians['load_1m']):.1f}",
        )
    )


# ---------------------------------------------------------------------------- tables


def _median_of(doc: Mapping[str, Any], case: str, metric: str) -> float | None:
    for c in doc.get("cases", []):
        if c["name"] == case:
            value = c["medians"].get(metric)
            return None if value is None else float(value)
    return None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def times_table(doc: Mapping[str, Any]) -> str:
    """Whole DAG and per task: medians per side and kind, and ours/plain."""
    lines = [
        "| median s | cold ours | cold plain | ours/plain | warm ours | warm plain | ours/plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, metric in [("whole DAG run", "seconds")] + [(t, f"{t}_s") for t in TASKS]:
        cells = []
        for kind in KINDS:
            ours = _median_of(doc, f"ours/{kind}", metric)
            plain = _median_of(doc, f"plain/{kind}", metric)
            shown = f"{ours / plain:.3f}" if ours is not None and plain else "-"
            cells += [_cell(ours), _cell(plain), f"**{shown}**"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parts_of(doc: Mapping[str, Any], kind: str) -> list[str]:
    names: set[str] = set()
    for c in doc.get("cases", []):
        if c["name"].endswith(f"/{kind}"):
            for metric in c["medians"]:
                if metric.startswith("profile/"):
                    names.add(metric.split("/")[2].removesuffix("_s"))
    order = ["task_start", "dag_parse", "store_setup", "db_connect", "coordinator", "hints"]
    order += ["xcom", "sink_2pc", *SPARK_PARTS, "batches", "defer_wait", "resume_start"]
    return [n for n in order if n in names] + sorted(n for n in names if n not in order)


def profile_table(doc: Mapping[str, Any], kind: str = "warm") -> str:
    """Per stage task, ``ours / plain`` median seconds of each part of its wall time."""
    lines = ["| part (median s) | " + " | ".join(STAGES) + " |", "|---" * (len(STAGES) + 1) + "|"]
    rows = [(p, f"profile/{{stage}}/{p}_s") for p in _parts_of(doc, kind)]
    rows += [("**outside Spark**", "outside_spark/{stage}_s"), ("**task wall**", "{stage}_s")]
    for label, template in rows:
        cells = []
        for stage in STAGES:
            metric = template.format(stage=stage)
            ours = _median_of(doc, f"ours/{kind}", metric)
            plain = _median_of(doc, f"plain/{kind}", metric)
            cells.append(f"{_cell(ours)} / {_cell(plain)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # the tables of a results file, for docs/benchmarks.md
    import sys

    source = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "benchmarks/results/airflow_real.json"
    )
    results = json.loads(source.read_text())
    print(times_table(results))
    for kind in KINDS:
        print(f"\n{kind}: ours / plain\n")
        print(profile_table(results, kind))
