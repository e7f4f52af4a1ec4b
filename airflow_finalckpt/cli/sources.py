"""``finalckpt sources list | show``: the incremental sources' cursors and the ranges pipeline
runs read (docs/sources.md). Read-only: a cursor moves only with a run's committed outputs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from airflow_finalckpt.cli._shared import (
    EXIT_ERROR,
    _console,
    _engine,
    _fail,
    _resolve_store_url,
    _user_errors,
    json_option,
    store_url_option,
)
from airflow_finalckpt.config import mask_url


def _docs(store_url: str | None, cursor_id: str | None, history: bool) -> list[dict[str, Any]]:
    from airflow_finalckpt.store.cursors import describe_cursors
    from airflow_finalckpt.store.migrate import require_schema

    with _user_errors(None, EXIT_ERROR):
        url, _ = _resolve_store_url(store_url)
    with _user_errors(url, EXIT_ERROR):
        engine = _engine(url)
        try:
            require_schema(engine)
            docs = describe_cursors(engine, cursor_id, history=history)
        finally:
            engine.dispose()
    if cursor_id is not None and not docs:
        _fail(
            f"no source cursor {cursor_id!r} in {mask_url(url)} (no run has read through it "
            "yet; `finalckpt sources list` shows the cursors)",
            EXIT_ERROR,
        )
    return docs


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _position(doc: dict[str, Any]) -> str:
    if doc["kind"] == "landing":
        return "-"
    return "start" if doc["position"] is None else str(doc["position"])


def _start(doc: dict[str, Any]) -> str:
    return "start" if doc["start"] is None else str(doc["start"])


def _range(doc: dict[str, Any]) -> str:
    run = f"{doc['dag_id']}/{doc['run_id']}" if doc["run_id"] else doc["pipeline_key"]
    span = "" if doc["end"] is None else f", {_start(doc)} -> {doc['end']}"
    return f"{run} ({doc['files']} files{span})"


def _read(doc: dict[str, Any]) -> str:
    """How many of a range's files the cursor advanced over (a drained run: fewer)."""
    if doc["state"] != "COMMITTED":
        return "-"
    return "all" if doc["read"] is None else str(doc["read"])


@click.group()
def sources() -> None:
    """Inspect the read positions of incremental sources (read-only)."""


@sources.command("list")
@json_option
@store_url_option
def sources_list(as_json: bool, store_url: str | None) -> None:
    """Every cursor: its position, the files read beyond it, its advances, open ranges."""
    docs = _docs(store_url, None, history=False)
    if as_json:
        click.echo(json.dumps({"cursors": docs, "total_entries": len(docs)}, indent=2))
        return
    table = Table(title=f"{len(docs)} source cursors")
    columns = ("cursor", "kind", "position", "files read", "advances", "last advanced by")
    for column in (*columns, "updated (UTC)", "open range"):
        table.add_column(column)
    for doc in docs:
        table.add_row(
            doc["cursor_id"],
            doc["kind"],
            _position(doc),
            str(doc["consumed_files"]),
            str(doc["version"]),
            doc["advanced_by"] or "-",
            _when(doc["updated_at"]),
            "; ".join(_range(r) for r in doc["open_ranges"]) or "-",
        )
    _console().print(table)


@sources.command("show")
@click.argument("cursor_id")
@json_option
@store_url_option
def sources_show(cursor_id: str, as_json: bool, store_url: str | None) -> None:
    """One cursor and every range recorded on it, oldest first (with --json: their splits)."""
    (doc,) = _docs(store_url, cursor_id, history=True)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    console = _console()
    console.print(
        f"source cursor {doc['cursor_id']} ({doc['kind']}): position {_position(doc)}, "
        f"{doc['consumed_files']} files read beyond it, {doc['version']} advances, last by "
        f"{doc['advanced_by'] or '-'} at {_when(doc['updated_at'])} UTC"
    )
    table = Table(title=f"{len(doc['history'])} ranges")
    for column in ("pipeline", "DAG run", "logical date", "state", "files", "read", "range"):
        table.add_column(column)
    for r in doc["history"]:
        table.add_row(
            r["pipeline_key"],
            f"{r['dag_id']}/{r['run_id']}" if r["run_id"] else "-",
            r["logical_date"] or "-",
            r["state"],
            str(r["files"]),
            _read(r),
            "-" if r["end"] is None else f"{_start(r)} -> {r['end']}",
        )
    console.print(table)
