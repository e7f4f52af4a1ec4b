"""``finalckpt gc`` (garbage collection and retention) and ``finalckpt pipelines list | show |
delete``.

``gc`` without ``--pipeline`` first removes the pipelines retention expires (closed longer than
``[finalckpt] retention_days``; with ``--check-dag-runs`` also those whose DAG runs were all
deleted from Airflow, asked over its REST API), then collects the garbage of every pipeline
kept. ``gc --pipeline KEY`` does the same for that pipeline only (its ``--json`` document is
the collection report, with a ``retention`` member).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from airflow_finalckpt.cli._shared import (
    EXIT_ERROR,
    EXIT_FAILURE,
    _console,
    _engine,
    _fail,
    _resolve_store_url,
    _user_errors,
    json_option,
    store_url_option,
)
from airflow_finalckpt.core.errors import FinalCheckpointError, UnknownPipelineError


def _when(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@contextmanager
def _store(store_url: str | None, retention_days: float | None = None) -> Iterator[Any]:
    """(settings, engine, storage) of the resolved store; user errors: one line, exit 2."""
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.migrate import require_schema

    with _user_errors(None, EXIT_ERROR):
        url, _ = _resolve_store_url(store_url)
    with _user_errors(url, EXIT_ERROR):
        overrides: dict[str, Any] = {"store_url": url}
        if retention_days is not None:
            overrides["retention_days"] = retention_days
        settings = load_settings(overrides)
        engine = _engine(url)
        try:
            require_schema(engine)
            storage = CheckpointStorage(settings.storage_uri, settings.storage_options)
            try:
                yield settings, engine, storage
            except UnknownPipelineError as exc:
                _fail(f"{exc} (see `finalckpt pipelines list` for the keys in use)", EXIT_ERROR)
            except FinalCheckpointError as exc:
                _fail(str(exc), EXIT_ERROR)
        finally:
            engine.dispose()


def _known(engine: Any, keys: tuple[str, ...]) -> None:
    """UnknownPipelineError (nothing done yet) for a key the store does not have."""
    from airflow_finalckpt.store.pipelines import pipeline_rows

    found = {row.pipeline_key for row in pipeline_rows(engine, keys)}
    for key in keys:
        if key not in found:
            raise UnknownPipelineError(
                f"pipeline {key!r} is not registered in the coordination store"
            )


@contextmanager
def _run_exists(check: bool) -> Iterator[Any]:
    """The DAG-run question for retention: Airflow's REST API, or None (not asked)."""
    if not check:
        yield None
        return
    from airflow_finalckpt.cli.airflow_api import AirflowApi, api_settings

    with AirflowApi(api_settings()) as api:
        yield api.dag_run_exists


# ---------------------------------------------------------------------------- gc


@click.command("gc")
@click.option(
    "--pipeline",
    "pipelines",
    multiple=True,
    metavar="KEY",
    help="Only this pipeline (repeatable); default: every pipeline in the store.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="Never delete files younger than this many seconds (default: 600).",
)
@click.option(
    "--retention-days",
    type=click.FloatRange(min=0),
    default=None,
    metavar="D",
    help="Remove pipelines closed longer than this (default: [finalckpt] retention_days, 7).",
)
@click.option(
    "--savepoints", is_flag=True, help="Also delete the savepoints of the pipelines removed."
)
@click.option(
    "--check-dag-runs",
    is_flag=True,
    help="Ask Airflow's REST API which DAG runs still exist; remove pipelines whose DAG runs "
    "were all deleted.",
)
@json_option
@store_url_option
def gc(
    pipelines: tuple[str, ...],
    dry_run: bool,
    grace_s: float | None,
    retention_days: float | None,
    savepoints: bool,
    check_dag_runs: bool,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Remove expired pipelines, then delete intermediate outputs and superseded state that no
    stage or checkpoint of the remaining pipelines needs.

    Output parts are kept while a downstream stage is not CLOSED or a retained checkpoint would
    re-read them; state while the live pipeline or a retained checkpoint references it. The
    checkpoint storage comes from the finalckpt settings (AIRFLOW__FINALCKPT__STORAGE_URI).
    """
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.runtime.gc import DEFAULT_GRACE_S, collect_garbage

    grace = DEFAULT_GRACE_S if grace_s is None else grace_s
    docs: list[dict[str, Any]] = []
    failed: list[str] = []
    with _store(store_url, retention_days) as (settings, engine, storage):
        from airflow_finalckpt.control.retention import apply_retention, preview_expiry

        keys = tuple(dict.fromkeys(pipelines))
        _known(engine, keys)
        with _run_exists(check_dag_runs) as run_exists:
            retention = apply_retention(
                engine,
                storage,
                retention_days=float(settings.retention_days),
                dry_run=dry_run,
                savepoints=savepoints,
                run_exists=run_exists,
                keys=keys or None,
            )
        removed = {r.pipeline_key: r for r in retention.removed}
        failed.extend(retention.errors)
        for kept in retention.kept:
            key = kept["pipeline_key"]
            try:
                report = collect_garbage(
                    Coordinator(engine, key, writer=storage),
                    storage,
                    dry_run=dry_run,
                    grace_s=grace,
                )
            except FinalCheckpointError as exc:
                if len(keys) == 1:
                    raise
                failed.append(f"gc of pipeline {key!r}: {exc}")
                continue
            doc = report.to_dict()
            doc["retention"] = dict(kept)
            if kept["closed"] and keys:
                doc["retention"]["on_expiry"] = preview_expiry(engine, storage, key, savepoints)
            docs.append(doc)
            failed.extend(report.errors)
    if as_json:
        if len(keys) == 1 and docs:
            click.echo(json.dumps(docs[0], indent=2))
        else:
            click.echo(json.dumps({"retention": retention.to_dict(), "pipelines": docs}, indent=2))
    else:
        _print_retention(retention, removed)
        for doc in docs:
            _print_gc_doc(doc, dry_run=dry_run)
    for error in failed:
        click.echo(f"error: {error}", err=True)
    if failed:
        raise click.exceptions.Exit(EXIT_FAILURE)


def _print_retention(retention: Any, removed: dict[str, Any]) -> None:
    console = _console()
    console.print(retention.summary())
    for key, removal in removed.items():
        kept = f", kept savepoints {', '.join(removal.kept_savepoints)}"
        console.print(
            f"  {key}: {removal.reason}: {removal.files} files, {removal.bytes} bytes, "
            f"{removal.store_rows} store rows" + (kept if removal.kept_savepoints else "")
        )
    for note in retention.notes:
        console.print(f"note: {note}")


def _print_gc_doc(doc: dict[str, Any], *, dry_run: bool) -> None:
    """The gc report of one pipeline for a terminal: summary, tables, retention, notes."""
    console = _console()
    verb = "would delete" if dry_run else "deleted"
    console.print(
        f"gc of {doc['pipeline_key']}: {verb} {len(doc['deleted'])} entries "
        f"({doc['files_deleted']} files, {doc['bytes_freed']} bytes), kept {len(doc['kept'])}"
    )
    console.print(f"pipeline directory: {doc['pipeline_dir']}")
    if doc["deleted"]:
        table = Table(title=verb)
        for column in ("path", "files", "bytes"):
            table.add_column(column)
        for entry in doc["deleted"]:
            path = entry["path"] + ("/" if entry["is_dir"] else "")
            table.add_row(path, str(entry["files"]), str(entry["bytes"]))
        console.print(table)
    if doc["kept"]:
        table = Table(title="kept")
        for column in ("path", "because", "detail"):
            table.add_column(column)
        for kept in doc["kept"]:
            table.add_row(kept["path"], kept["reason"], kept["detail"])
        console.print(table)
    retention = doc.get("retention") or {}
    line = f"retention: {retention.get('why')}"
    if retention.get("expires_at") is not None:
        line += f", expires at {_when(retention['expires_at'])} UTC"
    console.print(line)
    on_expiry = retention.get("on_expiry")
    if on_expiry:
        console.print(
            f"on expiry gc removes {on_expiry['files']} files ({on_expiry['bytes']} bytes: "
            f"{', '.join(on_expiry['paths']) or 'nothing'}) and {on_expiry['store_rows']} "
            "store rows"
        )
    for note in doc["notes"]:
        console.print(f"note: {note}")


# ---------------------------------------------------------------------------- pipelines


@click.group()
def pipelines() -> None:
    """List, show and delete the pipelines of the coordination store."""


def _row_doc(row: Any, retention_days: float) -> dict[str, Any]:
    from airflow_finalckpt.control.retention import age_of
    from airflow_finalckpt.core.retention import expires_at

    return {
        "pipeline_key": row.pipeline_key,
        "closed": row.closed,
        "stages_total": row.stages_total,
        "stages_closed": row.stages_closed,
        "checkpoints": row.checkpoints,
        "savepoints": row.savepoints,
        "dag_runs": [list(r) for r in row.dag_runs],
        "created_at": row.created_at,
        "last_change": row.last_change,
        "expires_at": expires_at(age_of(row, None), retention_days),
    }


@pipelines.command("list")
@click.option("--dag", "dag_id", default=None, help="Only pipelines with a run of this DAG.")
@json_option
@store_url_option
def pipelines_list(dag_id: str | None, as_json: bool, store_url: str | None) -> None:
    """Every pipeline: closed or open, stages, checkpoints, DAG runs, when it expires."""
    from airflow_finalckpt.store.pipelines import pipeline_rows

    with _store(store_url) as (settings, engine, _storage):
        rows = pipeline_rows(engine)
        docs = [
            _row_doc(row, float(settings.retention_days))
            for row in rows
            if dag_id is None or any(d == dag_id for d, _ in row.dag_runs)
        ]
    if as_json:
        click.echo(json.dumps({"pipelines": docs, "total_entries": len(docs)}, indent=2))
        return
    table = Table(title=f"{len(docs)} pipelines")
    for column in ("pipeline", "state", "stages closed", "checkpoints", "DAG runs", "expires"):
        table.add_column(column)
    for doc in docs:
        table.add_row(
            doc["pipeline_key"],
            "closed" if doc["closed"] else "open",
            f"{doc['stages_closed']}/{doc['stages_total']}",
            f"{doc['checkpoints']} ({doc['savepoints']} savepoints)",
            ", ".join(f"{d}/{r}" for d, r in doc["dag_runs"]) or "-",
            (_when(doc["expires_at"]) or "-") + (" UTC" if doc["expires_at"] else ""),
        )
    _console().print(table)


@pipelines.command("show")
@click.argument("pipeline_key")
@json_option
@store_url_option
def pipelines_show(pipeline_key: str, as_json: bool, store_url: str | None) -> None:
    """One pipeline: its summary, stages and latest checkpoints."""
    from airflow_finalckpt.control import PipelineControl
    from airflow_finalckpt.store.pipelines import pipeline_rows

    with _store(store_url) as (settings, engine, storage):
        _known(engine, (pipeline_key,))
        (row,) = pipeline_rows(engine, [pipeline_key])
        doc = _row_doc(row, float(settings.retention_days))
        detail = PipelineControl(engine, storage).describe_pipeline(pipeline_key, checkpoints=20)
        doc["detail"] = detail.model_dump(mode="json")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    console = _console()
    console.print(
        f"pipeline {pipeline_key}: {'closed' if doc['closed'] else 'open'}, "
        f"{doc['stages_closed']}/{doc['stages_total']} stages closed, {doc['checkpoints']} "
        f"checkpoints ({doc['savepoints']} savepoints), last change "
        f"{_when(doc['last_change'])} UTC, expires {_when(doc['expires_at']) or 'never (open)'}"
    )
    for dag, run in doc["dag_runs"]:
        console.print(f"DAG run {dag} / {run}")
    for stage in doc["detail"]["stages"]:
        console.print(
            f"  {stage['stage_id']}: {stage['lifecycle']} "
            f"({stage['done_splits']}/{stage['total_splits']} splits)"
        )


@pipelines.command("delete")
@click.argument("pipeline_key")
@click.option("--savepoints", is_flag=True, help="Also delete the pipeline's savepoints.")
@click.option(
    "--force",
    is_flag=True,
    help="Delete an open pipeline (one not every stage of "
    "which is closed): a retry or resume of it then starts from nothing.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@json_option
@store_url_option
def pipelines_delete(
    pipeline_key: str,
    savepoints: bool,
    force: bool,
    dry_run: bool,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Delete one pipeline: its files (savepoints only with --savepoints) and store rows."""
    from airflow_finalckpt.control.retention import remove_pipeline
    from airflow_finalckpt.store.pipelines import pipeline_rows

    with _store(store_url) as (_settings, engine, storage):
        _known(engine, (pipeline_key,))
        (row,) = pipeline_rows(engine, [pipeline_key])
        if not row.closed and not force:
            _fail(
                f"pipeline {pipeline_key!r} is open ({row.stages_closed}/{row.stages_total} "
                "stages closed): a retry, clear or resume may still continue it; pass --force "
                "to delete it anyway",
                EXIT_ERROR,
            )
        removal = remove_pipeline(
            engine, storage, pipeline_key, "deleted", dry_run=dry_run, savepoints=savepoints
        )
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **removal.to_dict()}, indent=2))
    else:
        verb = "would delete" if dry_run else "deleted"
        click.echo(
            f"{pipeline_key}: {verb} {removal.files} files ({removal.bytes} bytes) and "
            f"{removal.store_rows} store rows"
            + (
                f"; kept savepoints {', '.join(removal.kept_savepoints)}"
                if removal.kept_savepoints
                else ""
            )
        )
    for error in removal.errors:
        click.echo(f"error: {error}", err=True)
    if removal.errors:
        raise click.exceptions.Exit(EXIT_FAILURE)
