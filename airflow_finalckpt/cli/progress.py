"""``finalckpt progress``: per-stage progress bars (``finalckpt gc`` is in ``cli/retention``).

``progress --pipeline KEY`` shows one bar per stage: finished/total splits, lifecycle
(NOT_STARTED / RUNNING / FINISHED / SUSPENDED / CLOSED) and where the stage stands in the latest
checkpoint. ``--watch`` refreshes every ``--interval`` seconds until every stage is CLOSED or
SUSPENDED (or Ctrl-C); ``--json`` prints one JSON document (with ``--watch``: once, when done).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
from fsspec.core import url_to_fs
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from airflow_finalckpt.cli._shared import (
    _console,
    _fail,
    _resolve_store_url,
    _user_errors,
    store_url_option,
)
from airflow_finalckpt.cli.checkpoints import info_to_json
from airflow_finalckpt.coordination import (
    CheckpointInfo,
    Coordinator,
    StageView,
    StopRequest,
)
from airflow_finalckpt.core.batching import Throughput
from airflow_finalckpt.core.errors import FinalCheckpointError, UnknownPipelineError
from airflow_finalckpt.core.metadata import load_metadata
from airflow_finalckpt.core.metadata.registry import MAX_METADATA_BYTES
from airflow_finalckpt.core.model import (
    MAX_WATERMARK,
    CheckpointState,
    StageLifecycle,
    StopMode,
    StopState,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import read_capped
from airflow_finalckpt.storage.hints import read_batch_plan, read_batch_throughput

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

#: Lifecycles in which a stage will not move without outside help: ``--watch`` stops there.
SETTLED = frozenset({StageLifecycle.CLOSED, StageLifecycle.SUSPENDED})

_LIFECYCLE_STYLE = {
    StageLifecycle.NOT_STARTED: "dim",
    StageLifecycle.RUNNING: "cyan",
    StageLifecycle.FINISHED: "yellow",
    StageLifecycle.SUSPENDED: "magenta",
    StageLifecycle.CLOSED: "green",
}

pipeline_option = click.option(
    "--pipeline", "pipeline", required=True, metavar="KEY", help="Pipeline key."
)


def _when(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _coordinator(store_url: str | None, pipeline: str) -> Coordinator:
    from airflow_finalckpt.store.engine import make_engine

    url, _ = _resolve_store_url(store_url)
    return Coordinator(make_engine(url), pipeline)


@contextmanager
def _errors(store_url: str | None) -> Iterator[None]:
    """User errors (unknown pipeline, bad configuration, database down) end in one line."""
    with _user_errors(store_url, EXIT_ERROR):
        try:
            yield
        except UnknownPipelineError as exc:
            _fail(f"{exc} (see `finalckpt checkpoints list` for the keys in use)", EXIT_ERROR)
        except FinalCheckpointError as exc:
            _fail(str(exc), EXIT_ERROR)


# ---------------------------------------------------------------------------- progress model


_RECORD_CACHE: dict[str, dict[str, str]] = {}


def recorded_statuses(info: CheckpointInfo) -> dict[str, str]:
    """Every stage's status as the checkpoint recorded it: from its ``_metadata`` (where the
    acknowledgements refined RUNNING into PARTIALLY_FINISHED), else from its plan.
    """
    path = info.metadata_path
    if path is not None:
        if path not in _RECORD_CACHE:
            try:
                fs, fs_path = url_to_fs(path)
                data = read_capped(fs, fs_path, MAX_METADATA_BYTES, what="checkpoint metadata")
                record = load_metadata(data, source=path)
                _RECORD_CACHE[path] = {s: r.status.value for s, r in record.stages.items()}
            except Exception:  # unreadable here (credentials, discarded): the plan will do
                return {s: v.value for s, v in info.plan.statuses.items()}
        return _RECORD_CACHE[path]
    return {s: v.value for s, v in info.plan.statuses.items()}


def _stage_checkpoint(
    view: StageView, latest: CheckpointInfo | None, statuses: Mapping[str, str]
) -> dict[str, Any] | None:
    """Where the stage stands in the checkpoints: closed on one, waiting for its final one, or
    its status in the latest completed checkpoint.
    """
    if view.lifecycle is StageLifecycle.CLOSED and view.closed_checkpoint_id is not None:
        return {"checkpoint_id": view.closed_checkpoint_id, "status": "CLOSED_ON"}
    if view.lifecycle is StageLifecycle.FINISHED and view.finish_threshold is not None:
        return {"checkpoint_id": view.finish_threshold, "status": "WAITING_FOR_FINAL"}
    if latest is None:
        return None
    return {"checkpoint_id": latest.checkpoint_id, "status": statuses.get(view.stage_id)}


def _settled(views: Mapping[str, StageView], stop: StopRequest | None) -> bool:
    """Every stage CLOSED or SUSPENDED; after a completed stop with savepoint, stages that never
    started stay NOT_STARTED until a resume, so they count as settled too.
    """
    settled = set(SETTLED)
    if stop is not None and stop.mode is StopMode.SAVEPOINT and stop.state is StopState.COMPLETED:
        settled.add(StageLifecycle.NOT_STARTED)
    return all(v.lifecycle in settled for v in views.values())


def batch_document(throughput: Throughput | None) -> dict[str, Any] | None:
    """A stage's latest split batch and measured throughput (auto batches), for people."""
    if throughput is None or not throughput.samples:
        return None
    last = throughput.samples[-1]
    unit = "bytes" if throughput.by_bytes else "splits"
    return {
        "last_batch_splits": last.splits,
        "last_batch_s": round(last.seconds, 3),
        "recent_batch_splits": [s.splits for s in throughput.samples],
        f"{unit}_per_s": round(throughput.units_per_s(), 3),
        "fixed_s_per_batch": round(throughput.fixed_s, 3),
        "summary": throughput.describe(),
    }


def _batch_text(stage: Mapping[str, Any]) -> str:
    doc = stage.get("batches")
    texts = [stage.get("plan"), doc["summary"] if doc else None]
    return "; ".join(str(t) for t in texts if t)


def _storage_or_none() -> CheckpointStorage | None:
    """The checkpoint storage from the two settings it needs (not every setting: the command
    stays quick); None when they cannot be read (progress still shows splits, without batch
    throughput).
    """
    from airflow_finalckpt.config import resolve_setting, storage_options_with_connection

    try:
        uri, _ = resolve_setting("storage_uri")
        return CheckpointStorage(str(uri), storage_options_with_connection())
    except Exception:
        return None


def progress_document(
    coordinator: Coordinator, storage: CheckpointStorage | None = None
) -> dict[str, Any]:
    """The ``progress --json`` document; raises UnknownPipelineError for an unknown key.
    With ``storage``, each stage also shows its latest split batch and throughput.
    """
    graph = coordinator.graph()
    views = coordinator.stages()
    history = coordinator.checkpoints(limit=50)
    latest = history[0] if history else None
    completed = next((c for c in history if c.state is CheckpointState.COMPLETED), None)
    if completed is None and latest is not None:
        completed = coordinator.latest_completed()
    stop = coordinator.stop_request()
    statuses = recorded_statuses(completed) if completed is not None else {}
    stages: list[dict[str, Any]] = []
    order = [s for s in graph.topological_order() if s in views]
    for sid in order + sorted(set(views) - set(order)):
        view = views[sid]
        done = len(view.progress.finished_splits)
        total = view.total_splits
        watermark = view.progress.watermark
        stages.append(
            {
                "stage_id": sid,
                "lifecycle": view.lifecycle.value,
                "epoch": view.epoch,
                "finished_splits": done,
                "total_splits": total,
                "percent": round(100.0 * done / total, 1) if total else None,
                "watermark": "+inf" if watermark == MAX_WATERMARK else watermark,
                "finish_threshold": view.finish_threshold,
                "closed_checkpoint_id": view.closed_checkpoint_id,
                "checkpoint": _stage_checkpoint(view, completed, statuses),
                "batches": None
                if storage is None
                else batch_document(read_batch_throughput(storage, coordinator.pipeline_key, sid)),
                # how the plan check batches it (one batch per attempt, split keys, ...)
                "plan": None
                if storage is None
                else read_batch_plan(storage, coordinator.pipeline_key, sid),
            }
        )
    return {
        "pipeline_key": coordinator.pipeline_key,
        "done": _settled(views, stop),
        "stages": stages,
        "latest_checkpoint": None if latest is None else info_to_json(latest),
        "latest_completed": None if completed is None else info_to_json(completed),
        "stop": None
        if stop is None
        else {
            "mode": stop.mode.value,
            "state": stop.state.value,
            "savepoint_id": stop.savepoint_id,
            "requested_by": stop.requested_by,
            "failure_reason": stop.failure_reason,
        },
    }


# ---------------------------------------------------------------------------- rendering


def _checkpoint_text(stage: Mapping[str, Any]) -> str:
    ck = stage["checkpoint"]
    if ck is None:
        return "no checkpoint yet"
    if ck["status"] == "CLOSED_ON":
        return f"closed on chk {ck['checkpoint_id']}"
    if ck["status"] == "WAITING_FOR_FINAL":
        return f"waiting for final chk >= {ck['checkpoint_id']}"
    return f"chk {ck['checkpoint_id']}: {ck['status'] or 'not in it'}"


def _header(doc: Mapping[str, Any]) -> Text:
    text = Text(f"pipeline {doc['pipeline_key']}", style="bold")
    latest = doc["latest_checkpoint"]
    if latest is None:
        text.append("  no checkpoint yet")
    else:
        text.append(
            f"  latest checkpoint {latest['checkpoint_id']} ({latest['kind']}, "
            f"{latest['state']}, triggered {_when(latest['triggered_at'])})"
        )
        completed = doc["latest_completed"]
        if completed is not None and completed["checkpoint_id"] != latest["checkpoint_id"]:
            text.append(f"; latest completed {completed['checkpoint_id']}")
    stop = doc["stop"]
    if stop is not None:
        text.append(f"  stop: {stop['mode']} {stop['state']}")
        if stop["savepoint_id"] is not None:
            text.append(f" (savepoint {stop['savepoint_id']})")
    return text


class _SplitsColumn(ProgressColumn):
    """finished/total splits; ``?`` while the total is unknown (the stage has not started)."""

    def render(self, task: Task) -> Text:
        total = task.fields["total_splits"]
        width = len(str(total)) if total is not None else 1
        shown = "?" if total is None else str(total)
        return Text(f"{task.fields['done']:>{width}}/{shown}", style="progress.download")


def render(doc: Mapping[str, Any]) -> RenderableType:
    """A header line and one progress bar per stage."""
    width = max([len(s["stage_id"]) for s in doc["stages"]] + [5])
    bars = Progress(
        TextColumn(f"{{task.fields[stage]:<{width}}}"),
        BarColumn(bar_width=30),
        _SplitsColumn(),
        TextColumn("{task.fields[pct]:>6}"),
        TextColumn("{task.fields[lifecycle]}"),
        TextColumn("{task.fields[checkpoint]}"),
        TextColumn("{task.fields[batch]}", style="dim"),
        auto_refresh=False,
        expand=False,
    )
    for stage in doc["stages"]:
        lifecycle = StageLifecycle(stage["lifecycle"])
        style = _LIFECYCLE_STYLE[lifecycle]
        total = stage["total_splits"]
        bars.add_task(
            stage["stage_id"],
            total=total if total else 1,  # unknown total: an empty bar, not a pulsing one
            completed=stage["finished_splits"] if total else 0,
            done=stage["finished_splits"],
            total_splits=total,
            stage=stage["stage_id"],
            pct="" if stage["percent"] is None else f"{stage['percent']:.0f}%",
            lifecycle=f"[{style}]{lifecycle.value:<11}[/{style}]",
            checkpoint=_checkpoint_text(stage),
            batch=_batch_text(stage),
        )
    if not doc["stages"]:
        return Group(_header(doc), Text("no stages registered"))
    return Group(_header(doc), bars.get_renderable())


def _fingerprint(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, default=str)


# ---------------------------------------------------------------------------- commands


@click.command("progress")
@pipeline_option
@click.option("--watch", is_flag=True, help="Refresh until every stage is CLOSED or SUSPENDED.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    metavar="S",
    help="Seconds between refreshes with --watch.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_url_option
def progress(
    pipeline: str, watch: bool, interval: float, as_json: bool, store_url: str | None
) -> None:
    """Show every stage's progress: splits, lifecycle and latest checkpoint."""
    with _errors(store_url):
        coordinator = _coordinator(store_url, pipeline)
        storage = _storage_or_none()
        doc = progress_document(coordinator, storage)
    if not watch:
        _emit(doc, as_json)
        return
    try:
        doc = _watch(coordinator, doc, interval, as_json, store_url, storage)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        click.echo(json.dumps(doc, indent=2))


def _emit(doc: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        _console().print(render(doc))


def _watch(
    coordinator: Coordinator,
    doc: dict[str, Any],
    interval: float,
    as_json: bool,
    store_url: str | None,
    storage: CheckpointStorage | None = None,
) -> dict[str, Any]:
    """Poll until done. On a terminal: one live display; piped: a snapshot per change; with
    --json: silent (the caller prints the final document).
    """
    console = _console()

    def poll() -> dict[str, Any]:
        time.sleep(interval)
        with _errors(store_url):
            return progress_document(coordinator, storage)

    if as_json:
        while not doc["done"]:
            doc = poll()
        return doc
    if console.is_terminal:
        with Live(render(doc), console=console, auto_refresh=False) as live:
            while not doc["done"]:
                doc = poll()
                live.update(render(doc), refresh=True)
        return doc
    console.print(render(doc))
    last = _fingerprint(doc)
    while not doc["done"]:
        doc = poll()
        if _fingerprint(doc) != last:
            last = _fingerprint(doc)
            console.print(render(doc))
    return doc
