"""``finalckpt checkpoints list|show``: the checkpoint history and per-stage status tables."""

from __future__ import annotations

import json
import os
import posixpath
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from airflow_finalckpt.cli._shared import (
    _console,
    _fail,
    _resolve_store_url,
    _user_errors,
    store_url_option,
)
from airflow_finalckpt.config import load_settings
from airflow_finalckpt.coordination import CheckpointInfo, Coordinator
from airflow_finalckpt.core.errors import FinalCheckpointError, UnknownPipelineError
from airflow_finalckpt.core.model import MAX_WATERMARK, CheckpointRecord
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

EXIT_ERROR = 2


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _watermark(value: int | None) -> str | int | None:
    return "+inf" if value == MAX_WATERMARK else value


def record_to_json(
    record: CheckpointRecord, *, path: str | None = None, version: int | None = None
) -> dict[str, Any]:
    """The ``show --json`` document: stable keys, the metadata format version, per-stage
    ``status``, ``finished_count`` and ``finished_splits`` (empty for a fully finished stage
    of metadata version 2, which keeps only the count).
    """
    return {
        "path": path,
        "metadata_version": version,
        "pipeline_key": record.pipeline_key,
        "checkpoint_id": record.checkpoint_id,
        "kind": record.kind.value,
        "reason": record.reason.value,
        "graph_fingerprint": record.graph_fingerprint,
        "triggered_at": record.triggered_at,
        "completed_at": record.completed_at,
        "stages": [
            {
                "stage_id": stage.stage_id,
                "status": stage.status.value,
                "finished_count": stage.done_splits,
                "finished_splits": sorted(stage.finished_splits),
                "state_files": len(stage.state),
                "state_bytes": sum(h.size for h in stage.state),
                "pending_transactions": [t.txn_id for t in stage.pending_transactions],
                "watermark": _watermark(stage.watermark),
                "end_of_data": None
                if stage.end_of_data is None
                else stage.end_of_data.model_dump(mode="json"),
            }
            for stage in (record.stages[s] for s in sorted(record.stages))
        ],
    }


def info_to_json(info: CheckpointInfo) -> dict[str, Any]:
    """One row of ``checkpoints list --json``: what the store knows of a checkpoint."""
    return {
        "checkpoint_id": info.checkpoint_id,
        "kind": info.kind.value,
        "reason": info.reason.value,
        "state": info.state.value,
        "triggered_at": info.triggered_at,
        "completed_at": info.completed_at,
        "duration_s": None
        if info.completed_at is None
        else round(info.completed_at - info.triggered_at, 3),
        "size_bytes": info.size_bytes,
        "failure_reason": info.failure_reason,
        "failure_kind": None if info.failure_kind is None else info.failure_kind.value,
        "metadata_path": info.metadata_path,
        "statuses": {k: v.value for k, v in info.plan.statuses.items()},
    }


@click.group()
def checkpoints() -> None:
    """Inspect checkpoints and savepoints."""


def _coordinator(store_url: str | None, pipeline: str) -> Coordinator:
    url, _ = _resolve_store_url(store_url)
    return Coordinator(make_engine(url), pipeline)


@checkpoints.command("list")
@click.option("--pipeline", "pipeline", required=True, metavar="KEY", help="Pipeline key.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@store_url_option
def list_checkpoints(pipeline: str, as_json: bool, store_url: str | None) -> None:
    """List the checkpoints of a pipeline, newest first."""
    with _user_errors(store_url, EXIT_ERROR):
        try:
            coordinator = _coordinator(store_url, pipeline)
            infos = coordinator.checkpoints()
            if not infos:
                coordinator.graph()  # a key the store does not have: refused like elsewhere
        except UnknownPipelineError as exc:
            _fail(f"{exc} (see `finalckpt pipelines list` for the keys in use)", EXIT_ERROR)
        except FinalCheckpointError as exc:
            _fail(str(exc), EXIT_ERROR)
    if as_json:
        click.echo(json.dumps([info_to_json(i) for i in infos], indent=2))
        return
    table = Table(title=f"checkpoints of {pipeline}")
    for column in ("id", "kind", "reason", "state", "triggered", "duration", "size", "stages"):
        table.add_column(column)
    for info in infos:
        counts: dict[str, int] = {}
        for status in info.plan.statuses.values():
            counts[status.value] = counts.get(status.value, 0) + 1
        doc = info_to_json(info)
        table.add_row(
            str(info.checkpoint_id),
            info.kind.value,
            info.reason.value,
            info.state.value + _failure(info),
            _when(info.triggered_at),
            "-" if doc["duration_s"] is None else f"{doc['duration_s']:.3f}s",
            "-" if info.size_bytes is None else f"{info.size_bytes} B",
            ", ".join(f"{k}={v}" for k, v in sorted(counts.items())),
        )
    _console().print(table)


def _failure(info: CheckpointInfo) -> str:
    """`` (cause: detail)`` of an aborted checkpoint, empty otherwise."""
    cause = "" if info.failure_kind is None else f"{info.failure_kind.value}: "
    return f" ({cause}{info.failure_reason})" if info.failure_reason else ""


def _storage_for_path(path: str) -> CheckpointStorage:
    """A storage rooted two levels above the checkpoint directory (<root>/<key>/chk-<id>)."""
    if "://" not in path:
        path = os.path.abspath(path)
    chk_dir = posixpath.dirname(path) if path.rstrip("/").endswith("_metadata") else path
    root = posixpath.dirname(posixpath.dirname(chk_dir.rstrip("/"))) or "/"
    return CheckpointStorage(root)


@checkpoints.command("show")
@click.argument("target", metavar="(ID|PATH)")
@click.option("--pipeline", "pipeline", default=None, metavar="KEY", help="Needed with an ID.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@store_url_option
def show_checkpoint(
    target: str, pipeline: str | None, as_json: bool, store_url: str | None
) -> None:
    """Show one checkpoint's per-stage status: by id (with --pipeline) or by path."""
    with _user_errors(store_url, EXIT_ERROR):
        try:
            if target.isdigit():
                if pipeline is None:
                    _fail("a checkpoint id needs --pipeline KEY (or pass the checkpoint path)", 2)
                info = _coordinator(store_url, pipeline).checkpoint(int(target))
                if info.metadata_path is None:
                    _fail(
                        f"checkpoint {target} of {pipeline!r} is {info.state.value} and has no "
                        "metadata file",
                        EXIT_ERROR,
                    )
                path = info.metadata_path
                settings = load_settings({"store_url": store_url} if store_url else None)
                storage = CheckpointStorage(settings.storage_uri, settings.storage_options)
            else:
                path = target
                storage = _storage_for_path(target)
            record, version = storage.read_checkpoint_versioned(path)
        except FinalCheckpointError as exc:
            _fail(str(exc), EXIT_ERROR)
    doc = record_to_json(record, path=path, version=version)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    console = _console()
    console.print(
        f"checkpoint {record.checkpoint_id} of {record.pipeline_key} ({record.kind.value}, "
        f"{record.reason.value}), completed {_when(record.completed_at)}, "
        f"metadata format version {version}"
    )
    table = Table()
    for column in ("stage", "status", "finished splits", "state", "pending txns", "watermark"):
        table.add_column(column)
    for stage in doc["stages"]:
        table.add_row(
            stage["stage_id"],
            stage["status"],
            "?" if stage["finished_count"] is None else str(stage["finished_count"]),
            f"{stage['state_files']} files, {stage['state_bytes']} B",
            str(len(stage["pending_transactions"])),
            str(stage["watermark"]),
        )
    console.print(table)
