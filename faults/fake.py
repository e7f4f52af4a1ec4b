"""A small deterministic pipeline for fault campaigns: real runtime, no Spark.

Three stages run through the real ``StageRunner``, the real ``Coordinator``, real checkpoint
storage and real two-phase-commit sinks; only the per-batch work is plain Python:

- ``gen`` (source, one split per "partition"): writes each batch's rows as an output part;
- ``agg`` (stateful, like the example's event-time windows): per-key tumbling windows with a
  watermark; a window fires once the watermark passed its end, every open window fires at finish
  (MAX_WATERMARK); its open windows are keyed state, written per batch and restored on resume;
- ``publish``: stages every fired window in the sinks (the pipeline's external output).

Output parts, output handles and state files follow the layout of the Spark stage logic
(``data/<stage>/<batch key>/``, ``data/<stage>/_parts/<batch key>.json``, ``state/<stage>/...``),
so garbage collection treats them the same way. :func:`reference_windows` computes the result
independently from the generator, so lost, duplicated or wrong rows show.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import MAX_WATERMARK, OUTPUT_PREFIX, EndOfData, StateHandle
from airflow_finalckpt.runtime.runner import (
    Batch,
    BatchOutput,
    CommitMode,
    Log,
    RunResult,
    RunStatus,
    StageRunner,
    StageSpec,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.storage import CheckpointStorage

FAKE_STAGES = ("gen", "agg", "publish")
FAKE_EDGES = (("gen", "agg"), ("agg", "publish"))
#: The sink rows: one per fired window.
KEY_COLUMNS = ("key", "window_start")
VALUE_COLUMNS = ("events", "total", "min_event", "max_event")
COLUMNS = KEY_COLUMNS + VALUE_COLUMNS
PART_FILE = "part-0.json"
WINDOW_STATE = "state:windows"


@dataclass(frozen=True)
class FakeData:
    """The generated input: split ``i`` holds events ``10*i .. 10*i + rows_per_split - 1``."""

    splits: int = 8
    rows_per_split: int = 12
    keys: int = 3
    window: int = 30
    #: Watermark = max event seen - lateness; > rows_per_split - 10 keeps every row on time.
    lateness: int = 5
    #: Index of the first split: a second source continues where the first one's events end.
    first: int = 0

    def split_ids(self) -> tuple[str, ...]:
        return tuple(f"p{i:03d}" for i in range(self.first, self.first + self.splits))

    def rows(self, split_id: str) -> list[dict[str, Any]]:
        i = int(split_id[1:])
        return [
            {
                "key": f"k{(i * 7 + j * 3) % self.keys}",
                "event": 10 * i + j,
                "value": (i * 31 + j * 17) % 101,
            }
            for j in range(self.rows_per_split)
        ]

    def to_dict(self) -> dict[str, int]:
        return {
            "splits": self.splits,
            "rows_per_split": self.rows_per_split,
            "keys": self.keys,
            "window": self.window,
            "lateness": self.lateness,
            "first": self.first,
        }


def reference_windows(data: FakeData) -> list[dict[str, Any]]:
    """What the sinks must hold, computed straight from the generator (no stage code)."""
    windows: dict[tuple[str, int], list[int]] = {}
    for split_id in data.split_ids():
        for row in data.rows(split_id):
            start = row["event"] // data.window * data.window
            acc = windows.setdefault((row["key"], start), [0, 0, row["event"], row["event"]])
            acc[0] += 1
            acc[1] += row["value"]
            acc[2] = min(acc[2], row["event"])
            acc[3] = max(acc[3], row["event"])
    return [
        dict(zip(COLUMNS, (key, start, *acc), strict=True))
        for (key, start), acc in sorted(windows.items())
    ]


def _read_json(storage: CheckpointStorage, pipeline_key: str, relpath: str) -> Any:
    path = storage.resolve_handle(pipeline_key, relpath)
    return json.loads(bytes(storage.fs.cat_file(storage.fs._strip_protocol(path))))


class _FakeLogic:
    """Shared plumbing: parts and output handles in checkpoint storage."""

    def __init__(self, storage: CheckpointStorage, pipeline_key: str, stage_id: str) -> None:
        self.storage = storage
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id
        self.watermark: int | None = None

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        self.watermark = watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        raise NotImplementedError

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        raise NotImplementedError

    def write_part(self, key: str, rows: list[dict[str, Any]]) -> str:
        part = f"data/{self.stage_id}/{key}"
        payload = json.dumps(rows, sort_keys=True).encode()
        self.storage.write_state(self.pipeline_key, f"{part}/{PART_FILE}", payload)
        return part

    def read_parts(self, parts: Sequence[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for part in parts:
            rows.extend(_read_json(self.storage, self.pipeline_key, f"{part}/{PART_FILE}"))
        return rows

    def output_handle(self, batch: Batch, parts: Sequence[str]) -> StateHandle:
        doc = {"stage_id": self.stage_id, "batch": batch.key, "parts": list(parts)}
        return self.storage.write_state(
            self.pipeline_key,
            f"data/{self.stage_id}/_parts/{batch.key}.json",
            json.dumps(doc, sort_keys=True).encode(),
            name=OUTPUT_PREFIX + ",".join(parts),
        )


class GenLogic(_FakeLogic):
    def __init__(
        self, storage: CheckpointStorage, pipeline_key: str, stage_id: str, data: FakeData
    ) -> None:
        super().__init__(storage, pipeline_key, stage_id)
        self.data = data

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        rows = [row for split in batch.splits for row in self.data.rows(split)]
        return BatchOutput(parts=(self.write_part(batch.key, rows),), state=())

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput(state=())


class AggLogic(_FakeLogic):
    """Tumbling event-time windows per key, with keyed state and a watermark."""

    def __init__(
        self, storage: CheckpointStorage, pipeline_key: str, stage_id: str, data: FakeData
    ) -> None:
        super().__init__(storage, pipeline_key, stage_id)
        self.data = data
        self.windows: dict[str, list[int]] = {}

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        super().restore(state, watermark)
        self.windows = {}
        for handle in state:
            if handle.name == WINDOW_STATE:
                raw = self.storage.read_state(self.pipeline_key, handle)
                self.windows = {k: list(v) for k, v in json.loads(raw).items()}

    def _fire(self, until: int) -> list[dict[str, Any]]:
        fired = []
        for name in sorted(self.windows):
            key, start = name.rsplit("|", 1)
            if int(start) + self.data.window <= until:
                acc = self.windows.pop(name)
                fired.append(dict(zip(COLUMNS, (key, int(start), *acc), strict=True)))
        return fired

    def _persist(self) -> StateHandle:
        return self.storage.write_state(
            self.pipeline_key,
            f"state/{self.stage_id}/windows/{uuid.uuid4().hex}.json",
            json.dumps(self.windows, sort_keys=True).encode(),
            name=WINDOW_STATE,
        )

    def _output(
        self, key: str, fired: list[dict[str, Any]], state: tuple[StateHandle, ...]
    ) -> BatchOutput:
        parts = (self.write_part(key, fired),) if fired else ()
        return BatchOutput(parts=parts, state=state, watermark=self.watermark)

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        rows = self.read_parts(batch.splits)
        for row in rows:
            start = row["event"] // self.data.window * self.data.window
            acc = self.windows.setdefault(
                f"{row['key']}|{start}", [0, 0, row["event"], row["event"]]
            )
            acc[0] += 1
            acc[1] += row["value"]
            acc[2] = min(acc[2], row["event"])
            acc[3] = max(acc[3], row["event"])
        if rows:
            seen = max(r["event"] for r in rows) - self.data.lateness
            self.watermark = seen if self.watermark is None else max(self.watermark, seen)
        fired = self._fire(self.watermark if self.watermark is not None else -1)
        return self._output(batch.key, fired, (self._persist(),))

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        self.watermark = MAX_WATERMARK
        fired = self._fire(MAX_WATERMARK)
        return self._output("finish", fired, ())


class PublishLogic(_FakeLogic):
    """Stages every fired window in every sink (the sinks commit them via the runtime)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        pipeline_key: str,
        stage_id: str,
        sinks: Sequence[TwoPhaseCommitSink],
    ) -> None:
        super().__init__(storage, pipeline_key, stage_id)
        self.sinks = list(sinks)

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        import pandas as pd

        rows = self.read_parts(batch.splits)
        if rows:
            frame = pd.DataFrame(rows, columns=list(COLUMNS))
            for sink in self.sinks:
                sink.write_pandas(txn_ids[sink.sink_id], frame)
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


def fake_graph() -> StageGraph:
    return StageGraph.from_edges(FAKE_STAGES, FAKE_EDGES)


@dataclass
class FakeRun:
    results: dict[str, RunResult] = field(default_factory=dict)
    end_of_data: dict[str, EndOfData] = field(default_factory=dict)

    @property
    def suspended(self) -> bool:
        return any(r.status is RunStatus.SUSPENDED for r in self.results.values())


@dataclass
class FakePipeline:
    """Runs the fake stages one after the other in this process (like ``run_example_locally``).

    ``fault(stage_id, point)`` is every runner's fault callback. ``splits_of`` remembers each
    started stage's splits, so a second attempt of a stage can be run (zombie faults).
    """

    coordinator: Coordinator
    storage: CheckpointStorage
    sinks: Sequence[TwoPhaseCommitSink]
    data: FakeData = field(default_factory=FakeData)
    batch_sizes: Mapping[str, int | str] = field(default_factory=dict)
    commit_mode: CommitMode = CommitMode.PROGRESSIVE
    checkpoint_interval_s: float = 60.0
    fault: Callable[[str, str], None] | None = None
    log: Log | None = None
    close_timeout_s: float = 60.0
    splits_of: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def logic(self, stage_id: str) -> _FakeLogic:
        key = self.coordinator.pipeline_key
        if stage_id == "gen":
            return GenLogic(self.storage, key, stage_id, self.data)
        if stage_id == "agg":
            return AggLogic(self.storage, key, stage_id, self.data)
        return PublishLogic(self.storage, key, stage_id, self.sinks)

    def runner(self, stage_id: str, splits: Sequence[str]) -> StageRunner:
        logic = self.logic(stage_id)
        fault = self.fault
        return StageRunner(
            self.coordinator,
            StageSpec(
                pipeline_key=self.coordinator.pipeline_key,
                stage_id=stage_id,
                splits=tuple(splits),
                batch_size=self.batch_sizes.get(stage_id, 2),
                checkpoint_interval_s=self.checkpoint_interval_s,
                commit_mode=self.commit_mode,
            ),
            logic,
            list(self.sinks) if stage_id == "publish" else [],
            output_handle=logic.output_handle if stage_id != "publish" else None,
            log=self.log,
            fault=None if fault is None else (lambda point: fault(stage_id, point)),
        )

    def run_stage(self, stage_id: str, splits: Sequence[str]) -> tuple[RunResult, EndOfData | None]:
        """One attempt of one stage: run it, then wait for its final checkpoint and close."""
        self.splits_of[stage_id] = tuple(splits)
        runner = self.runner(stage_id, splits)
        result = runner.run()
        if result.status is RunStatus.SUSPENDED:
            return result, None
        deadline = time.monotonic() + self.close_timeout_s
        eod = runner.try_close()
        while eod is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage {stage_id} did not reach its final checkpoint")
            self.coordinator.ensure_final_checkpoint(stage_id)
            time.sleep(0.02)
            eod = runner.try_close()
        return result, eod

    def run(self) -> FakeRun:
        """Run every stage to CLOSED (raises whatever a stage raises)."""
        self.coordinator.register(fake_graph())
        run = FakeRun()
        upstream = {"agg": "gen", "publish": "agg"}
        for stage_id in FAKE_STAGES:
            if stage_id in upstream:
                splits: Sequence[str] = run.end_of_data[upstream[stage_id]].manifest
            else:
                splits = self.data.split_ids()
            result, eod = self.run_stage(stage_id, splits)
            run.results[stage_id] = result
            if eod is None:
                return run
            run.end_of_data[stage_id] = eod
        return run
