"""The four stages of the example pipeline as transforms over a BatchContext.

``ingest`` (one split per day) -> ``enrich`` (broadcast join with the dimension tables, kept as
stage-global state) -> ``delay_windows`` (hourly event-time windows per origin, keyed state and a
watermark; every open window fires at finish) -> ``publish`` (Parquet table + SQL table sinks).

The same functions back the Airflow DAG in ``dags/`` and the Airflow-free tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame

from airflow_finalckpt.core.split_bytes import SplitBytes
from airflow_finalckpt.examples.nycflights13.data import (
    DIMENSION_TABLES,
    FLIGHTS_DIR,
    InputLayout,
    open_layout,
    split_file_name,
    split_path,
)
from airflow_finalckpt.examples.nycflights13.transforms import (
    delay_windows,
    enrich,
    flush_delay_windows,
    ingest,
    load_dim,
    verify_dims,
)
from airflow_finalckpt.sizing import SPLIT_FIELD, FileBytes, file_bytes
from airflow_finalckpt.spark.stage import BatchContext, Transform

STAGE_IDS = ("ingest", "enrich", "delay_windows", "publish")
EDGES = (("ingest", "enrich"), ("enrich", "delay_windows"), ("delay_windows", "publish"))
WINDOW_STATE = "open_windows"


@dataclass(frozen=True)
class ExampleStage:
    """One stage of the example: its transform, its finish hook and its primary input."""

    stage_id: str
    transform: Transform
    on_finish: Transform | None = None
    #: The upstream stage whose output parts are this stage's splits (None: a source).
    primary_input: str | None = None
    #: A source's input bytes per split (its first auto batch is sized from them).
    split_bytes: SplitBytes | None = None


def input_layout(ctx: BatchContext, input_dir: str) -> InputLayout:
    """The input layout, read once per stage attempt (reading it checks every input file)."""
    return ctx.attempt_value("input_layout", partial(open_layout, input_dir))


def ingest_split_bytes(input_dir: str) -> FileBytes:
    """Ingest's ``split_bytes``: each day's input file size, so a cold ingest is sized from
    bytes (one batch for the year at x1 and x10) instead of probing one day first.
    """
    return file_bytes(str(Path(input_dir) / FLIGHTS_DIR / split_file_name(SPLIT_FIELD)))


def ingest_transform(input_dir: str) -> Transform:
    """The ingest stage: read the batch's day files of the input directory."""

    def transform(ctx: BatchContext) -> DataFrame:
        layout = input_layout(ctx, input_dir)
        return ingest(ctx.spark, [str(split_path(layout, s)) for s in ctx.splits])

    return transform


def enrich_transform(input_dir: str) -> Transform:
    """The enrich stage: join each batch with the dimension tables, read once per attempt."""

    def transform(ctx: BatchContext) -> DataFrame:
        # The dims are read from immutable input files: key-checked once per stage attempt and,
        # from its second batch on, held on the driver (``broadcast_table``: no state files, no
        # file scan per batch).
        layout = input_layout(ctx, input_dir)
        dims = {
            name: ctx.broadcast_table(name, partial(load_dim, ctx.spark, layout, name))
            for name in DIMENSION_TABLES
        }
        ctx.attempt_value("dims_verified", partial(verify_dims, dims))
        return enrich(ctx.spark, ctx.read_parts(), dims, verify_keys=False)

    return transform


def windows_transform(ctx: BatchContext) -> DataFrame:
    """One batch of windows. The stage's last batch fires every window and drops the state
    (one output, no state files, like a plain job over all the input); ``windows_finish`` then
    has nothing left to fire.
    """
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
    crash fires the same windows again into the same part.
    """
    state = ctx.get_state(WINDOW_STATE)
    return None if state is None else flush_delay_windows(state)


def publish_transform(ctx: BatchContext) -> DataFrame:
    """The publish stage: pass its input parts on to the sinks unchanged."""
    return ctx.read_parts()


def example_stages(input_dir: str) -> list[ExampleStage]:
    """The example's stages in topological order, reading input from ``input_dir``."""
    return [
        ExampleStage(
            "ingest", ingest_transform(input_dir), split_bytes=ingest_split_bytes(input_dir)
        ),
        ExampleStage("enrich", enrich_transform(input_dir), primary_input="ingest"),
        ExampleStage("delay_windows", windows_transform, windows_finish, primary_input="enrich"),
        ExampleStage("publish", publish_transform, primary_input="delay_windows"),
    ]
