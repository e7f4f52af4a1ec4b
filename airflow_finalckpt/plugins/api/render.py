"""Server-side HTML for the UI pages: the pipeline page (state, stage graph as inline SVG,
checkpoint history, stop/resume buttons) and the list of pipeline runs. Everything user- or
data-controlled goes through ``html.escape``; no template engine, no build step."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from urllib.parse import quote

from airflow_finalckpt.control import (
    CheckpointSummary,
    PipelineDetail,
    PipelineRunState,
    PipelineRunSummary,
    StageSummary,
)
from airflow_finalckpt.core.model import StageStatus

STATUS_COLOURS: dict[str, tuple[str, str]] = {
    # status: (fill, stroke)
    StageStatus.FULLY_FINISHED.value: ("#c8e6c9", "#2e7d32"),
    StageStatus.PARTIALLY_FINISHED.value: ("#ffe0b2", "#ef6c00"),
    StageStatus.RUNNING.value: ("#bbdefb", "#1565c0"),
    StageStatus.NOT_STARTED.value: ("#eeeeee", "#757575"),
}
STATUS_LABELS = {
    StageStatus.FULLY_FINISHED.value: "fully finished",
    StageStatus.PARTIALLY_FINISHED.value: "partially finished",
    StageStatus.RUNNING.value: "running",
    StageStatus.NOT_STARTED.value: "not started",
}
#: run state -> which buttons are enabled
ACTIONS: dict[PipelineRunState, frozenset[str]] = {
    PipelineRunState.NOT_STARTED: frozenset({"drain", "savepoint"}),
    PipelineRunState.RUNNING: frozenset({"drain", "savepoint"}),
    PipelineRunState.STOPPING: frozenset(),
    PipelineRunState.SUSPENDED: frozenset({"resume"}),
    PipelineRunState.DRAINING: frozenset(),
    PipelineRunState.DRAINED: frozenset(),
    PipelineRunState.FINISHED: frozenset(),
}

e = html.escape


def ts(value: float | None) -> str:
    if value is None:
        return "—"
    moment = datetime.fromtimestamp(value, tz=UTC)
    return f'<time datetime="{moment.isoformat()}">{moment.strftime("%Y-%m-%d %H:%M:%S")}Z</time>'


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def size(num: int | None) -> str:
    if num is None:
        return "—"
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{num} B"  # pragma: no cover


def state_badge(state: PipelineRunState | str) -> str:
    value = str(getattr(state, "value", state))
    return f'<span class="badge state-{e(value)}" data-run-state="{e(value)}">{e(value)}</span>'


def run_page_url(base: str, dag_id: str, run_id: str) -> str:
    return f"{base}/ui/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


# ----------------------------------------------------------------------------------- graph


def _layers(stages: Sequence[StageSummary]) -> dict[str, int]:
    """Longest-path depth of each stage (stages come in topological order)."""
    depth: dict[str, int] = {}
    known = {s.stage_id for s in stages}
    for stage in stages:
        ups = [u for u in stage.upstream if u in known]
        depth[stage.stage_id] = 1 + max((depth.get(u, 0) for u in ups), default=-1)
    return depth


def stage_graph_svg(stages: Sequence[StageSummary]) -> str:
    """The stage graph: left to right by depth, boxes coloured by checkpoint status."""
    if not stages:
        return '<p class="muted">No stages registered yet.</p>'
    box_w, box_h, gap_x, gap_y, pad = 190, 64, 60, 24, 12
    depth = _layers(stages)
    columns: dict[int, list[str]] = {}
    for stage in stages:
        columns.setdefault(depth[stage.stage_id], []).append(stage.stage_id)
    pos: dict[str, tuple[int, int]] = {}
    for col, ids in columns.items():
        for row, sid in enumerate(ids):
            pos[sid] = (pad + col * (box_w + gap_x), pad + row * (box_h + gap_y))
    width = pad * 2 + (max(columns) + 1) * box_w + max(columns) * gap_x
    height = pad * 2 + max(len(ids) for ids in columns.values()) * (box_h + gap_y) - gap_y
    parts = [
        f'<svg class="stage-graph" role="img" aria-label="stage graph" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#616161"/></marker></defs>',
    ]
    for stage in stages:
        x2, y2 = pos[stage.stage_id]
        for up in stage.upstream:
            if up not in pos:
                continue
            x1, y1 = pos[up]
            sx, sy, ex, ey = x1 + box_w, y1 + box_h // 2, x2, y2 + box_h // 2
            mid = (sx + ex) // 2
            parts.append(
                f'<path class="edge" d="M{sx},{sy} C{mid},{sy} {mid},{ey} {ex - 2},{ey}" '
                'fill="none" stroke="#616161" stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
    for stage in stages:
        x, y = pos[stage.stage_id]
        status = stage.status.value
        fill, stroke = STATUS_COLOURS.get(status, ("#ffffff", "#000000"))
        total = "?" if stage.total_splits is None else str(stage.total_splits)
        progress = f"{stage.done_splits}/{total}"
        lifecycle = stage.lifecycle.value.lower().replace("_", " ")
        pct = 0.0
        if stage.total_splits:
            pct = min(1.0, stage.done_splits / stage.total_splits)
        parts.append(
            f'<g class="stage" data-stage-id="{e(stage.stage_id)}" data-status="{e(status)}" '
            f'data-progress="{e(progress)}" data-lifecycle="{e(stage.lifecycle.value)}">'
            f"<title>{e(stage.stage_id)}: {e(STATUS_LABELS.get(status, status))}, "
            f"{e(progress)} splits, {e(lifecycle)}, epoch {stage.epoch}"
            f"{e('; ' + stage.batches) if stage.batches else ''}</title>"
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="2"/>'
            f'<rect x="{x + 10}" y="{y + box_h - 12}" width="{box_w - 20}" height="5" rx="2" '
            'fill="#ffffff" opacity="0.8"/>'
            f'<rect x="{x + 10}" y="{y + box_h - 12}" width="{(box_w - 20) * pct:.1f}" '
            f'height="5" rx="2" fill="{stroke}"/>'
            f'<text x="{x + 10}" y="{y + 20}" class="stage-name">{e(stage.stage_id[:24])}</text>'
            f'<text x="{x + box_w - 10}" y="{y + 20}" text-anchor="end" class="stage-progress">'
            f"{e(progress)}</text>"
            f'<text x="{x + 10}" y="{y + 39}" class="stage-status">'
            f"{e(STATUS_LABELS.get(status, status))} · {e(lifecycle)}</text>"
            "</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    items = "".join(
        f'<span class="legend-item"><span class="swatch" style="background:{fill};'
        f'border-color:{stroke}"></span>{e(STATUS_LABELS[status])}</span>'
        for status, (fill, stroke) in STATUS_COLOURS.items()
    )
    return f'<div class="legend">{items}</div>'


# ----------------------------------------------------------------------------------- tables


def status_chip(stage_id: str, status: str) -> str:
    fill, stroke = STATUS_COLOURS.get(status, ("#fff", "#000"))
    return (
        f'<span class="chip" style="background:{fill};border-color:{stroke}" '
        f'title="{e(stage_id)}: {e(STATUS_LABELS.get(status, status))}">{e(stage_id)}</span>'
    )


def checkpoint_table(checkpoints: Sequence[CheckpointSummary], stage_order: Iterable[str]) -> str:
    if not checkpoints:
        return '<p class="muted">No checkpoint has been triggered yet.</p>'
    order = list(stage_order)
    rows = []
    for ck in checkpoints:
        statuses = dict(ck.stage_statuses)
        ordered = [s for s in order if s in statuses] + sorted(set(statuses) - set(order))
        chips = " ".join(status_chip(s, str(statuses[s].value)) for s in ordered)
        failure = f'<div class="failure">{e(ck.failure_reason)}</div>' if ck.failure_reason else ""
        rows.append(
            f'<tr data-checkpoint-id="{ck.checkpoint_id}" data-kind="{e(ck.kind.value)}" '
            f'data-state="{e(ck.state)}">'
            f"<td>{ck.checkpoint_id}</td>"
            f'<td><span class="kind kind-{e(ck.kind.value)}">'
            f"{e(ck.kind.value.replace('_', ' '))}</span></td>"
            f"<td>{e(ck.reason)}</td>"
            f'<td><span class="ckstate ckstate-{e(ck.state.lower())}">{e(ck.state)}</span>'
            f"{failure}</td>"
            f"<td>{ts(ck.triggered_at)}</td><td>{ts(ck.completed_at)}</td>"
            f"<td>{duration(ck.duration_s)}</td><td>{size(ck.size_bytes)}</td>"
            f'<td class="chips">{chips}</td></tr>'
        )
    return (
        '<table class="checkpoints"><thead><tr><th>id</th><th>kind</th><th>reason</th>'
        "<th>state</th><th>triggered</th><th>completed</th><th>duration</th><th>size</th>"
        "<th>stage status</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def stop_info(detail: PipelineDetail) -> str:
    stop = detail.summary.stop
    if stop is None:
        return '<p class="muted">No stop has been requested.</p>'
    bits = [
        f"<dt>last stop</dt><dd>{e(stop.mode.value)} · {e(stop.state.value)}"
        f"{' by ' + e(stop.requested_by) if stop.requested_by else ''}"
        f" at {ts(stop.requested_at)}</dd>"
    ]
    if stop.savepoint_id is not None:
        path = f" · <code>{e(stop.savepoint_path)}</code>" if stop.savepoint_path else ""
        bits.append(f"<dt>savepoint</dt><dd>{stop.savepoint_id}{path}</dd>")
    if stop.finished_at is not None:
        took = duration(stop.finished_at - stop.requested_at)
        bits.append(f"<dt>savepoint done</dt><dd>{ts(stop.finished_at)} ({took})</dd>")
    if stop.failure_reason:
        bits.append(f'<dt>failed</dt><dd class="failure">{e(stop.failure_reason)}</dd>')
    return '<dl class="facts">' + "".join(bits) + "</dl>"


def buttons(state: PipelineRunState) -> str:
    enabled = ACTIONS.get(state, frozenset())
    specs = [
        ("drain", "stop", "Stop with drain", "danger"),
        ("savepoint", "stop", "Stop with savepoint", "warn"),
        ("resume", "resume", "Resume", "primary"),
    ]
    out = []
    for mode, action, label, style in specs:
        disabled = "" if mode in enabled else " disabled"
        out.append(
            f'<button type="button" class="action {style}" data-action="{action}" '
            f'data-mode="{mode}" data-label="{e(label)}"{disabled}>{e(label)}</button>'
        )
    return '<div class="actions">' + "".join(out) + "</div>"


def pipeline_live(detail: PipelineDetail, dag_id: str, run_id: str) -> str:
    """The part of the pipeline page that refreshes every 2 s."""
    summary = detail.summary
    dag_runs = ", ".join(f"{e(d)} / {e(r)}" for d, r in summary.dag_runs)
    restored = (
        f"<dt>restored from</dt><dd><code>{e(summary.restored_from)}</code></dd>"
        if summary.restored_from
        else ""
    )
    unread = (
        f"<dt>unread input</dt><dd>{summary.unread_splits} split(s)</dd>"
        if summary.unread_splits
        else ""
    )
    return (
        f'<section class="header" data-run-state="{e(summary.state.value)}">'
        f"<h1>Pipeline {e(summary.pipeline_key)} {state_badge(summary.state)}</h1>"
        '<dl class="facts">'
        f"<dt>DAG run</dt><dd>{e(dag_id)} / {e(run_id)}</dd>"
        f"<dt>DAG runs of this pipeline</dt><dd>{dag_runs or '—'}</dd>"
        f"<dt>stages</dt><dd>{summary.stages_closed}/{summary.stages_total} closed</dd>"
        f"<dt>splits</dt><dd>{summary.done_splits}/{summary.total_splits} done</dd>"
        f"<dt>latest completed checkpoint</dt><dd>{summary.latest_checkpoint_id or '—'}</dd>"
        f"{restored}{unread}</dl>"
        f"{buttons(summary.state)}"
        f"{stop_info(detail)}</section>"
        f'<section><h2>Stages</h2>{legend()}<div class="graph">'
        f"{stage_graph_svg(detail.stages)}</div></section>"
        f"<section><h2>Checkpoint history</h2>"
        f"{checkpoint_table(detail.checkpoints, [s.stage_id for s in detail.stages])}</section>"
    )


def runs_live(runs: Sequence[PipelineRunSummary], base: str) -> str:
    if not runs:
        return '<p class="muted">No pipeline runs yet (or none you may see).</p>'
    rows = []
    for run in runs:
        links = ", ".join(
            f'<a href="{e(run_page_url(base, d, r))}">{e(d)} / {e(r)}</a>' for d, r in run.dag_runs
        )
        stop = f"{run.stop.mode.value} · {run.stop.state.value}" if run.stop else "—"
        rows.append(
            f'<tr data-pipeline-key="{e(run.pipeline_key)}" data-run-state="{e(run.state.value)}">'
            f"<td>{e(run.pipeline_key)}</td><td>{state_badge(run.state)}</td>"
            f"<td>{links}</td><td>{run.stages_closed}/{run.stages_total}</td>"
            f"<td>{run.done_splits}/{run.total_splits}</td>"
            f"<td>{run.latest_checkpoint_id or '—'}</td><td>{e(stop)}</td></tr>"
        )
    return (
        '<table class="runs"><thead><tr><th>pipeline</th><th>state</th><th>DAG runs</th>'
        "<th>stages closed</th><th>splits done</th><th>latest checkpoint</th><th>last stop</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def page(
    title: str, base: str, body: str, *, live_url: str, page_kind: str, extra: str = ""
) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="stylesheet" href="{e(base)}/static/finalckpt.css">'
        f'<script defer src="{e(base)}/static/finalckpt.js"></script>'
        f'</head><body data-page="{e(page_kind)}">'
        f'<div id="message" role="alert" hidden></div>'
        f'<main id="live" data-live-url="{e(live_url)}" data-refresh-ms="2000">{body}</main>'
        f"{extra}</body></html>"
    )


def confirm_dialog() -> str:
    return (
        '<dialog id="confirm"><form method="dialog">'
        '<h3 id="confirm-title">Confirm</h3><p id="confirm-text"></p>'
        '<div class="dialog-buttons"><button value="cancel" id="confirm-cancel">Cancel</button>'
        '<button value="ok" id="confirm-ok" class="danger">Confirm</button></div>'
        "</form></dialog>"
    )


def error_page(status_code: int, detail: str, *, login: str | None = None) -> str:
    action = f'<p><a href="{e(login)}" target="_top">Log in to Airflow</a></p>' if login else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{status_code}</title></head><body>"
        f'<div class="error" role="alert"><h1>{status_code}</h1><p>{e(detail)}</p>{action}</div>'
        "</body></html>"
    )
