"""The four stages of the example pipeline as transforms over a BatchContext.

``ingest`` (one split per day) -> ``enrich`` (broadcast join with the dimension tables, kept as
stage-global state) -> ``delay_windows`` (hourly event-time windows per origin, keyed state and a
watermark; every open window fires at finish) -> ``publish`` (Parquet table + SQL table sinks).

The same functions back the Airflow DAG in ``dags/`` and the Airflow-free tests.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from airflow_finalckpt.examples.nycflights13.data import open_layout, split_path
from airflow_finalckpt.examples.nycflights13.transforms import (
    delay_windows,
    enrich,
    flush_delay_windows,
    ingest,
    load_dims,
    verify_dims,
)
from airflow_finalckpt.spark.stage import BatchContext, Transform

STAGE_IDS = ("ingest", "enrich", "delay_windows", "publish")
EDGES = (("ingest", "enrich"), ("enrich", "delay_windows"), ("delay_windows", "publish"))
WINDOW_STATE = "open_windows"


@dataclass(frozen=True)
class ExampleStage:
    stage_id: str
    transform: Transform
    on_finish: Transform | None = None
    #: The upstream stage whose output parts are this stage's splits (None: a source).
    primary_input: str | None = None


def ingest_transform(input_dir: str) -> Transform:
    def transform(ctx: BatchContext) -> DataFrame:
        layout = open_layout(input_dir)
        return ingest(ctx.spark, [str(split_path(layout, s)) for s in ctx.splits])

    return transform


def enrich_transform(input_dir: str) -> Transform:
    def transform(ctx: BatchContext) -> DataFrame:
        # The dims are read from immutable input files: built and key-checked once per stage
        # attempt and reused by every batch (no state files, no Spark job per batch for them).
        def dims() -> dict[str, DataFrame]:
            loaded = load_dims(ctx.spark, open_layout(input_dir))
            verify_dims(loaded)
            return loaded

        if ctx.logic is None:
            return enrich(ctx.spark, ctx.read_parts(), dims(), verify_keys=False)
        return enrich(
            ctx.spark, ctx.read_parts(), ctx.attempt_value("dims", dims), verify_keys=False
        )

    return transform


def windows_transform(ctx: BatchContext) -> DataFrame:
    """One batch of windows. The stage's last batch fires every window and drops the state
    (one output, no state files, like a plain job over all the input); ``windows_finish`` then
    has nothing left to fire."""
    final = ctx.last_batch
    step = delay_windows(ctx.read_parts(), ctx.get_state(WINDOW_STATE), ctx.watermark, final=final)
    if final:
        ctx.drop_state(WINDOW_STATE)
    else:
        ctx.set_state(WINDOW_STATE, step.state)
    ctx.set_watermark(step.watermark)
    return step.fired


def windows_finish(ctx: BatchContext) -> DataFrame | None:
    """MAX_WATERMARK: every open window fires (a drain, or a restored attempt whose splits were
    all finished before its last batch could fire them). The state is left as it is: a finished
    stage is restored from its end_of_data, never from its state, and a finish redone after a
    crash fires the same windows again into the same part."""
    state = ctx.get_state(WINDOW_STATE)
    return None if state is None else flush_delay_windows(state)


def publish_transform(ctx: BatchContext) -> DataFrame:
    return ctx.read_parts()


def example_stages(input_dir: str) -> list[ExampleStage]:
    return [
        ExampleStage("ingest", ingest_transform(input_dir)),
        ExampleStage("enrich", enrich_transform(input_dir), primary_input="ingest"),
        ExampleStage("delay_windows", windows_transform, windows_finish, primary_input="enrich"),
        ExampleStage("publish", publish_transform, primary_input="delay_windows"),
    ]


class InjectedCrash(RuntimeError):
    """The demo's injected fault (``FINALCKPT_EXAMPLE_CRASH``)."""


def crash_if_requested(ctx: BatchContext, spec: str | None, *, hard: bool = False) -> None:
    """Fault injection for the demo: ``"enrich:N"`` fails enrich's first attempt when it starts
    batch N+1 (N batches recorded before), once. ``hard`` kills the process (like a SIGKILL of
    the worker) instead of raising. When the stage's splits run out before batch N+1 (too few
    splits, or batches that take them all) nothing is injected. Either way the JSON file
    ``faults/<stage>.crashed`` beside the state says what happened (see ``crash_outcome``)."""
    if not spec or ctx.logic is None:
        return
    stage_id, _, count = spec.partition(":")
    if stage_id != ctx.stage_id:
        return
    marker = _fault_file(ctx, "crashed")
    if os.path.exists(marker):
        return
    progress = _fault_file(ctx, "batches")
    seen = _read_json(progress) or {"batches": 0, "splits": 0}
    total = sum(len(m) for m in ctx.logic.upstream_manifests.values()) or None
    wanted = int(count or 1)
    outcome = {"after_batches": seen["batches"], "splits_done": seen["splits"], "total": total}
    if seen["batches"] >= wanted:
        _write_json(marker, {"fired": True, **outcome})
        if hard:
            os._exit(137)
        raise InjectedCrash(f"injected crash in stage {ctx.stage_id} after {wanted} batches")
    seen = {"batches": seen["batches"] + 1, "splits": seen["splits"] + len(ctx.splits)}
    if total is not None and seen["splits"] >= total:  # the last batch: there is no N+1
        reason = (
            f"stage {ctx.stage_id} processes its {total} split(s) in {seen['batches']} "
            f"batch(es); the crash needs a batch {wanted + 1}"
        )
        _write_json(marker, {"fired": False, **outcome, "reason": reason})
        return
    _write_json(progress, seen)


def _fault_file(ctx: BatchContext, suffix: str) -> str:
    assert ctx.logic is not None
    path = ctx.logic.storage.resolve_handle(
        ctx.logic.pipeline_key, f"faults/{ctx.stage_id}.{suffix}"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return str(path)


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    return doc if isinstance(doc, dict) else None


def _write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def crash_outcome(storage_root: str, pipeline_key: str, stage_id: str) -> dict[str, Any] | None:
    """What ``crash_if_requested`` did in a pipeline: None if it never ran in that stage."""
    from airflow_finalckpt.storage import CheckpointStorage

    path = CheckpointStorage(storage_root).resolve_handle(
        pipeline_key, f"faults/{stage_id}.crashed"
    )
    return _read_json(str(path))
