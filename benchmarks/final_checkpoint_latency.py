"""Final-checkpoint latency: from a stage's end of input to its close, per checkpoint interval.

A stage runs through the real ``StageRunner`` on a SQLite coordination store and local checkpoint
storage. Its end of input is the moment the runner calls the stage logic's ``finish`` (every
batch done); it is closed when ``try_close`` returns its end_of_data (its final checkpoint
completed and its transactions were committed). Waiting is done the way the stage operator does
it: ``try_close`` at once, then the deferred trigger's poll every ``POLL_S`` seconds
(``ensure_final_checkpoint`` + ``closable_checkpoint``), then ``try_close``. Airflow's own
defer/resume scheduling latency is not part of this measurement.

Scenarios, each at checkpoint intervals 10 s, 60 s and 3600 s:

* ``alone``: the only running stage of its pipeline (fake logic): the eager final checkpoint has
  nobody else to wait for;
* ``busy``: a sibling branch keeps running (fake logic, one batch every ``SIBLING_BATCH_S``), so
  the eager checkpoint must wait for the sibling's next split-batch boundary: the FLIP-147 case;
* ``spark``: the example's ``ingest`` stage on real Spark (a few days, two batches), alone.

The reference column is computed, not measured: without an eager final checkpoint (Flink before
FLIP-147's eager trigger) a stage finishing at a random moment waits for the next periodic
checkpoint, on average half an interval (p95: 95 % of it).
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import Result, Target, log, median, percentile

if TYPE_CHECKING:
    from airflow_finalckpt.runtime.runner import StageRunner

NAME = "final_checkpoint_latency"
INTERVALS_S = (10.0, 60.0, 3600.0)
#: The stage operator's default poll interval of its deferred trigger.
POLL_S = 0.5
SIBLING_BATCH_S = 0.25
FAKE_BATCH_S = 0.02
TARGET_P50_S = 1.0


class _Stopped(Exception):
    """Ends the sibling stage's thread (like a killed task)."""


class FakeLogic:
    """A StageLogic without Spark: every batch takes ``batch_s`` seconds and yields one part."""

    def __init__(self, batch_s: float, stop: threading.Event | None = None) -> None:
        self.batch_s = batch_s
        self.stop = stop
        self.end_of_input: float | None = None
        self.batches = 0

    def restore(self, state: Any, watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Any, txn_ids: Mapping[str, str]) -> Any:
        from airflow_finalckpt.runtime.runner import BatchOutput

        del txn_ids
        if self.stop is not None and self.stop.is_set():
            raise _Stopped()
        time.sleep(self.batch_s)
        self.batches += 1
        return BatchOutput(parts=(f"data/{batch.key}",))

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> Any:
        from airflow_finalckpt.runtime.runner import BatchOutput

        del drain, txn_ids
        self.end_of_input = time.perf_counter()
        return BatchOutput()


def wait_like_the_operator(runner: Any, coordinator: Any, stage_id: str) -> float:
    """try_close at once, else poll like FinalCheckpointTrigger; returns when closed."""
    deadline = time.monotonic() + 120.0
    while runner.try_close() is None:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage {stage_id} never reached its final checkpoint")
            time.sleep(POLL_S)
            coordinator.ensure_final_checkpoint(stage_id)
            if coordinator.closable_checkpoint(stage_id) is not None:
                break
    return time.perf_counter()


class Store:
    """One SQLite coordination store + checkpoint storage for many short pipelines."""

    def __init__(self, root: Path) -> None:
        from airflow_finalckpt.storage import CheckpointStorage
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.migrate import ensure_schema

        self.root = root
        self.engine = make_engine(f"sqlite:///{root}/coordination.db")
        ensure_schema(self.engine)
        self.storage = CheckpointStorage(str(root / "checkpoints"))

    def coordinator(self, stage_ids: tuple[str, ...]) -> Any:
        from airflow_finalckpt.coordination import Coordinator
        from airflow_finalckpt.core.graph import StageGraph

        coordinator = Coordinator(self.engine, f"lat-{uuid.uuid4().hex[:10]}", writer=self.storage)
        coordinator.register(StageGraph.from_edges(stage_ids, ()))
        return coordinator


def _runner(
    coordinator: Any, stage_id: str, splits: int, batch: int, interval: float, logic: Any
) -> StageRunner:
    from airflow_finalckpt.runtime.runner import StageRunner, StageSpec

    spec = StageSpec(
        pipeline_key=coordinator.pipeline_key,
        stage_id=stage_id,
        splits=tuple(f"{stage_id}-s{i:05d}" for i in range(splits)),
        batch_size=batch,
        checkpoint_interval_s=interval,
    )
    return StageRunner(coordinator, spec, logic)


def sample_fake(store: Store, interval: float, busy: bool) -> dict[str, float]:
    """One pipeline: stage ``a`` (3 quick batches) finishes; ``b`` keeps running if busy."""
    coordinator = store.coordinator(("a", "b") if busy else ("a",))
    stop = threading.Event()
    sibling: threading.Thread | None = None
    errors: list[BaseException] = []
    if busy:
        sib_logic = FakeLogic(SIBLING_BATCH_S, stop)
        sib = _runner(coordinator, "b", 100_000, 1, interval, sib_logic)

        def run_sibling() -> None:
            try:
                sib.run()
            except _Stopped:
                pass
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

        sibling = threading.Thread(target=run_sibling, name="sibling-stage", daemon=True)
        sibling.start()
        while sib_logic.batches < 1 and sibling.is_alive():
            time.sleep(0.01)
    try:
        logic = FakeLogic(FAKE_BATCH_S)
        runner = _runner(coordinator, "a", 6, 2, interval, logic)
        finished_at: list[float] = []
        runner.fault = lambda point: (
            finished_at.append(time.perf_counter()) if point == "after-finish" else None
        )
        runner.run()
        closed = wait_like_the_operator(runner, coordinator, "a")
    finally:
        stop.set()
        if sibling is not None:
            sibling.join(timeout=30)
    if errors:
        raise errors[0]
    assert logic.end_of_input is not None
    return {
        "end_of_input_to_closed_s": closed - logic.end_of_input,
        "finish_recorded_to_closed_s": closed - finished_at[0],
    }


def sample_spark(store: Store, input_dir: str, interval: float) -> dict[str, float]:
    """The example's ingest stage on real Spark (two batches) through the same runtime."""
    from airflow_finalckpt.examples.nycflights13.data import open_layout
    from airflow_finalckpt.examples.nycflights13.stages import ingest_transform
    from airflow_finalckpt.runtime.runner import StageRunner, StageSpec
    from airflow_finalckpt.spark.stage import SparkStageLogic
    from benchmarks.common import spark_session

    coordinator = store.coordinator(("ingest",))
    logic = SparkStageLogic(
        spark_session(),
        store.storage,
        coordinator.pipeline_key,
        "ingest",
        ingest_transform(input_dir),
    )
    end_of_input: list[float] = []
    original_finish = logic.finish

    def finish(drain: bool, txn_ids: Mapping[str, str]) -> Any:
        end_of_input.append(time.perf_counter())
        return original_finish(drain, txn_ids)

    logic.finish = finish  # type: ignore[method-assign]
    splits = open_layout(input_dir).split_ids
    runner = StageRunner(
        coordinator,
        StageSpec(
            pipeline_key=coordinator.pipeline_key,
            stage_id="ingest",
            splits=splits,
            batch_size=max(1, -(-len(splits) // 2)),
            checkpoint_interval_s=interval,
        ),
        logic,
        output_handle=logic.output_handle,
    )
    finished_at: list[float] = []
    runner.fault = lambda point: (
        finished_at.append(time.perf_counter()) if point == "after-finish" else None
    )
    runner.run()
    closed = wait_like_the_operator(runner, coordinator, "ingest")
    return {
        "end_of_input_to_closed_s": closed - end_of_input[0],
        "finish_recorded_to_closed_s": closed - finished_at[0],
    }


def run(quick: bool = False) -> Result:
    from benchmarks.pipelines import prepare_inputs

    fake_samples = 1 if quick else 12
    spark_samples = 1 if quick else 2
    intervals = INTERVALS_S
    result = Result(NAME, repetitions=fake_samples)
    result.parameters = {
        "intervals_s": list(intervals),
        "samples_fake": fake_samples,
        "samples_spark": spark_samples,
        "poll_s": POLL_S,
        "sibling_batch_s": SIBLING_BATCH_S,
        "fake_batch_s": FAKE_BATCH_S,
        "store": "SQLite (WAL, synchronous=FULL), local checkpoint storage",
        "start": "the runner calls the stage logic's finish() (end of input)",
        "end": "try_close() returned end_of_data (final checkpoint completed, committed)",
    }
    p50s: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-latency-") as tmp:
        store = Store(Path(tmp))
        input_dir = prepare_inputs(Path(tmp) / "input", days=4)
        for scenario in ("alone", "busy", "spark"):
            for interval in intervals:
                log(f"{NAME}: {scenario}, interval {interval:g} s")
                case = result.case(
                    f"{scenario}/{interval:g}s", scenario=scenario, interval_s=interval
                )
                count = spark_samples if scenario == "spark" else fake_samples
                for _ in range(count):
                    if scenario == "spark":
                        sample = sample_spark(store, input_dir, interval)
                    else:
                        sample = sample_fake(store, interval, busy=scenario == "busy")
                    for metric, value in sample.items():
                        case.add(metric, value)
                values = case.samples["end_of_input_to_closed_s"]
                case.medians["p50_s"] = percentile(values, 50)
                case.medians["p95_s"] = percentile(values, 95)
                case.medians["reference_p50_s"] = interval / 2
                case.medians["reference_p95_s"] = 0.95 * interval
                case.finalize()
                p50s.setdefault(scenario, []).append(case.medians["p50_s"])
        store.engine.dispose()
    for scenario, values in p50s.items():
        worst = max(values)
        spread = worst - min(values)
        result.medians[f"p50_s/{scenario}"] = median(values)
        result.medians[f"p50_spread_across_intervals_s/{scenario}"] = spread
        result.targets.append(
            Target(
                name=f"p50 end of input -> closed, {scenario}",
                target=f"< {TARGET_P50_S:g} s at every interval",
                measured=worst,
                unit="s",
                passed=bool(worst < TARGET_P50_S),
                note="worst p50 over intervals " + ", ".join(f"{i:g}s" for i in intervals),
            )
        )
        result.targets.append(
            Target(
                name=f"independent of the interval, {scenario}",
                target="p50 spread across intervals < 0.5 s",
                measured=spread,
                unit="s",
                passed=bool(spread < 0.5),
                note="max p50 - min p50 over the intervals",
            )
        )
    for interval in intervals:
        result.ratios[f"reference_over_measured_p50/busy/{interval:g}s"] = (interval / 2) / max(
            next(c.medians["p50_s"] for c in result.cases if c.name == f"busy/{interval:g}s"),
            1e-9,
        )
    return result
