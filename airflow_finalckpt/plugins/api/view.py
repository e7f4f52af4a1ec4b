"""What the UI templates draw, as plain values: formatted numbers and times, which buttons a run
state enables, the stage graph's layout. No HTML here (that is in ``plugins/templates/``), so
these rules are testable without rendering a page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from airflow_finalckpt.control import CheckpointSummary, PipelineRunState, StageSummary
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


@dataclass(frozen=True)
class Button:
    """One action button of the pipeline page (the page's script reads its data attributes)."""

    mode: str
    action: str
    label: str
    style: str
    enabled: bool


_BUTTONS = (
    ("drain", "stop", "Stop with drain", "danger"),
    ("savepoint", "stop", "Stop with savepoint", "warn"),
    ("resume", "resume", "Resume", "primary"),
)


def buttons(state: PipelineRunState) -> list[Button]:
    """Every button, enabled only where the run's state allows that action."""
    enabled = ACTIONS.get(state, frozenset())
    return [Button(m, a, label, s, m in enabled) for m, a, label, s in _BUTTONS]


# ------------------------------------------------------------------------------- formatting


def iso_time(value: float) -> str:
    """A UNIX time as ISO 8601 in UTC (the ``datetime`` attribute of ``<time>``)."""
    return datetime.fromtimestamp(value, tz=UTC).isoformat()


def display_time(value: float) -> str:
    """A UNIX time as shown on the page (UTC, to the second)."""
    return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    """A duration in the unit a reader takes in at a glance."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def size(num: int | None) -> str:
    """A byte count in binary units."""
    if num is None:
        return "—"
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{num} B"  # pragma: no cover


def quoted(value: str) -> str:
    """One URL path segment (an id may contain ``/``)."""
    return quote(value, safe="")


def run_page_url(base: str, dag_id: str, run_id: str) -> str:
    """The pipeline page of a DAG run."""
    return f"{base}/ui/dags/{quoted(dag_id)}/runs/{quoted(run_id)}"


def status_colours(status: str) -> tuple[str, str]:
    """(fill, stroke) of a stage status; unknown statuses in black on white."""
    return STATUS_COLOURS.get(status, ("#ffffff", "#000000"))


def status_label(status: str) -> str:
    """A stage status in words."""
    return STATUS_LABELS.get(status, status)


def ordered_statuses(ck: CheckpointSummary, stage_order: Iterable[str]) -> list[tuple[str, str]]:
    """(stage, status) of a checkpoint in graph order, then stages no longer in the graph."""
    statuses = {s: str(v.value) for s, v in ck.stage_statuses.items()}
    order = [s for s in stage_order if s in statuses]
    return [(s, statuses[s]) for s in order + sorted(set(statuses) - set(order))]


# ------------------------------------------------------------------------------------ graph

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 190, 64, 60, 24, 12


@dataclass(frozen=True)
class StageBox:
    """A stage drawn as a box at (x, y), coloured by its checkpoint status."""

    stage: StageSummary
    x: int
    y: int

    @property
    def status(self) -> str:
        """The status the stage would have in a checkpoint taken now."""
        return self.stage.status.value

    @property
    def fill(self) -> str:
        """The box's fill colour."""
        return status_colours(self.status)[0]

    @property
    def stroke(self) -> str:
        """The box's border and progress bar colour."""
        return status_colours(self.status)[1]

    @property
    def progress(self) -> str:
        """Splits done of the stage's total (``?`` while unknown)."""
        total = "?" if self.stage.total_splits is None else str(self.stage.total_splits)
        return f"{self.stage.done_splits}/{total}"

    @property
    def lifecycle(self) -> str:
        """The live lifecycle in words."""
        return self.stage.lifecycle.value.lower().replace("_", " ")

    @property
    def bar_width(self) -> str:
        """Width of the progress bar's filled part."""
        pct = 0.0
        if self.stage.total_splits:
            pct = min(1.0, self.stage.done_splits / self.stage.total_splits)
        return f"{(BOX_W - 20) * pct:.1f}"

    @property
    def title(self) -> str:
        """The box's tooltip: status, progress, lifecycle, epoch and the latest batch."""
        batches = "; " + self.stage.batches if self.stage.batches else ""
        return (
            f"{self.stage.stage_id}: {status_label(self.status)}, {self.progress} splits, "
            f"{self.lifecycle}, epoch {self.stage.epoch}{batches}"
        )


@dataclass(frozen=True)
class GraphLayout:
    """The stage graph left to right by depth: boxes and the edge curves between them."""

    width: int
    height: int
    boxes: list[StageBox]
    edges: list[str]


def _layers(stages: Sequence[StageSummary]) -> dict[str, int]:
    """Longest-path depth of each stage (stages come in topological order)."""
    depth: dict[str, int] = {}
    known = {s.stage_id for s in stages}
    for stage in stages:
        ups = [u for u in stage.upstream if u in known]
        depth[stage.stage_id] = 1 + max((depth.get(u, 0) for u in ups), default=-1)
    return depth


def graph_layout(stages: Sequence[StageSummary]) -> GraphLayout | None:
    """Where each stage's box and each edge go; None without stages."""
    if not stages:
        return None
    depth = _layers(stages)
    columns: dict[int, list[str]] = {}
    for stage in stages:
        columns.setdefault(depth[stage.stage_id], []).append(stage.stage_id)
    pos: dict[str, tuple[int, int]] = {}
    for col, ids in columns.items():
        for row, sid in enumerate(ids):
            pos[sid] = (PAD + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    width = PAD * 2 + (max(columns) + 1) * BOX_W + max(columns) * GAP_X
    height = PAD * 2 + max(len(ids) for ids in columns.values()) * (BOX_H + GAP_Y) - GAP_Y
    edges = []
    for stage in stages:
        x2, y2 = pos[stage.stage_id]
        for up in stage.upstream:
            if up not in pos:
                continue
            x1, y1 = pos[up]
            sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2
            mid = (sx + ex) // 2
            edges.append(f"M{sx},{sy} C{mid},{sy} {mid},{ey} {ex - 2},{ey}")
    boxes = [StageBox(s, *pos[s.stage_id]) for s in stages]
    return GraphLayout(width, height, boxes, edges)
