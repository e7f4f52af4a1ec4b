"""The demo's injected crash (``run --crash-mid-enrich``): a batch hook that fails a stage's first
attempt mid-way, so that the next DAG run shows a resume. Not part of the DAG files in ``dags/``;
the runner and the tests pass it to the DAG factories as a ``batch_hooks`` entry.

Its markers live beside the pipeline's state (``faults/<stage>.*``), written through the
checkpoint storage, so the crash works on any storage URI, not only a local path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.storage import CheckpointStorage

if TYPE_CHECKING:
    from airflow_finalckpt.spark.stage import BatchContext

#: A crash spec (``"<stage>:N"``), or a callable giving it when the batch runs.
CrashSpec = str | None | Callable[[], str | None]


def crash_batch_sizes(days: int) -> dict[str, int]:
    """Fixed batch sizes under which ``"enrich:1"`` always fires: ingest writes two parts (its
    days in two halves) and enrich reads one per batch. With auto batches a day input that fits
    the target is one ingest part, so enrich would have a single split and no batch 2.
    """
    return {"ingest": max(1, -(-days // 2)), "enrich": 1}


class InjectedCrash(RuntimeError):
    """The demo's injected fault."""


def crash_hook(spec: CrashSpec, *, hard: bool = False) -> Callable[[BatchContext], None]:
    """A batch hook running ``crash_if_requested`` with ``spec`` (read when the batch runs)."""

    def hook(ctx: BatchContext) -> None:
        crash_if_requested(ctx, spec() if callable(spec) else spec, hard=hard)

    return hook


def crash_if_requested(ctx: BatchContext, spec: str | None, *, hard: bool = False) -> None:
    """``"<stage>:N"`` fails that stage's first attempt when it starts batch N+1 (N batches
    recorded before), once. ``hard`` kills the process (like a SIGKILL of the worker) instead of
    raising. When the stage's splits run out before batch N+1 (too few splits, or batches that
    take them all) nothing is injected. Either way the JSON file ``faults/<stage>.crashed``
    beside the state says what happened (see ``crash_outcome``).
    """
    if not spec or ctx.logic is None:
        return
    stage_id, _, count = spec.partition(":")
    if stage_id != ctx.stage_id:
        return
    storage, key = ctx.logic.storage, ctx.logic.pipeline_key
    marker, progress = _marker(stage_id, "crashed"), _marker(stage_id, "batches")
    if _read_json(storage, key, marker) is not None:
        return
    seen = _read_json(storage, key, progress) or {"batches": 0, "splits": 0}
    total = sum(len(m) for m in ctx.logic.upstream_manifests.values()) or None
    wanted = int(count or 1)
    outcome = {"after_batches": seen["batches"], "splits_done": seen["splits"], "total": total}
    if seen["batches"] >= wanted:
        _write_json(storage, key, marker, {"fired": True, **outcome})
        if hard:
            os._exit(137)
        raise InjectedCrash(f"injected crash in stage {ctx.stage_id} after {wanted} batches")
    seen = {"batches": seen["batches"] + 1, "splits": seen["splits"] + len(ctx.splits)}
    if total is not None and seen["splits"] >= total:  # the last batch: there is no N+1
        reason = (
            f"stage {ctx.stage_id} processes its {total} split(s) in {seen['batches']} "
            f"batch(es); the crash needs a batch {wanted + 1}"
        )
        _write_json(storage, key, marker, {"fired": False, **outcome, "reason": reason})
        return
    _write_json(storage, key, progress, seen)


def crash_outcome(storage_root: str, pipeline_key: str, stage_id: str) -> dict[str, Any] | None:
    """What ``crash_if_requested`` did in a pipeline: None if it never ran in that stage."""
    return _read_json(CheckpointStorage(storage_root), pipeline_key, _marker(stage_id, "crashed"))


def _marker(stage_id: str, suffix: str) -> str:
    return f"faults/{stage_id}.{suffix}"


def _read_json(
    storage: CheckpointStorage, pipeline_key: str, relpath: str
) -> dict[str, Any] | None:
    data = storage.read_file(pipeline_key, relpath)
    if data is None:
        return None
    doc = json.loads(data)
    return doc if isinstance(doc, dict) else None


def _write_json(
    storage: CheckpointStorage, pipeline_key: str, relpath: str, doc: dict[str, Any]
) -> None:
    storage.write_state(pipeline_key, relpath, json.dumps(doc).encode())
