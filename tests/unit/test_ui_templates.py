"""The UI's view rules (buttons per run state, graph layout, formatting) on plain values, and
the Jinja2 templates: all load from the package, autoescape every id, draw what the view says."""

from __future__ import annotations

import pytest

from airflow_finalckpt.control import (
    CheckpointSummary,
    PipelineDetail,
    PipelineRunState,
    PipelineRunSummary,
    StageSummary,
)
from airflow_finalckpt.core.model import CheckpointKind, StageLifecycle, StageStatus
from airflow_finalckpt.plugins.api import render, view


def stage(sid: str, *up: str, done: int = 0, total: int | None = 4) -> StageSummary:
    return StageSummary(
        stage_id=sid,
        upstream=list(up),
        lifecycle=StageLifecycle.RUNNING if done else StageLifecycle.NOT_STARTED,
        status=StageStatus.PARTIALLY_FINISHED if done else StageStatus.NOT_STARTED,
        epoch=1,
        done_splits=done,
        total_splits=total,
        closed_checkpoint_id=None,
    )


def summary(state: PipelineRunState, key: str = "k") -> PipelineRunSummary:
    return PipelineRunSummary(
        pipeline_key=key,
        dag_runs=[("d", "r")],
        state=state,
        stages_total=2,
        stages_closed=0,
        done_splits=2,
        total_splits=8,
        latest_checkpoint_id=None,
        restored_from=None,
        unread_splits=0,
        stop=None,
    )


@pytest.mark.parametrize(
    ("state", "enabled"),
    [
        (PipelineRunState.RUNNING, {"drain", "savepoint"}),
        (PipelineRunState.NOT_STARTED, {"drain", "savepoint"}),
        (PipelineRunState.SUSPENDED, {"resume"}),
        (PipelineRunState.STOPPING, set()),
        (PipelineRunState.DRAINING, set()),
        (PipelineRunState.DRAINED, set()),
        (PipelineRunState.FINISHED, set()),
    ],
)
def test_buttons_follow_the_run_state(state: PipelineRunState, enabled: set[str]) -> None:
    buttons = view.buttons(state)
    assert [b.mode for b in buttons] == ["drain", "savepoint", "resume"]
    assert {b.mode for b in buttons if b.enabled} == enabled


def test_graph_layout_places_stages_by_depth_and_skips_unknown_upstreams() -> None:
    assert view.graph_layout([]) is None
    layout = view.graph_layout(
        [stage("a", done=2), stage("b", "a"), stage("c", "a"), stage("d", "b", "c", "gone")]
    )
    assert layout is not None
    assert [(b.stage.stage_id, b.x, b.y) for b in layout.boxes] == [
        ("a", 12, 12),
        ("b", 262, 12),
        ("c", 262, 100),
        ("d", 512, 12),
    ]
    assert (layout.width, layout.height) == (714, 176)
    assert len(layout.edges) == 4  # a->b, a->c, b->d, c->d; "gone" is not drawn
    assert layout.edges[0] == "M202,44 C232,44 232,44 260,44"
    a = layout.boxes[0]
    assert (a.progress, a.bar_width, a.fill) == ("2/4", "85.0", "#ffe0b2")
    assert layout.boxes[1].progress == "0/4"
    unknown = view.graph_layout([stage("x", total=None)])
    assert unknown is not None and unknown.boxes[0].progress == "0/?"


def test_formatting() -> None:
    assert [view.duration(v) for v in (None, 0.25, 3.21, 600)] == [
        "—",
        "250 ms",
        "3.2 s",
        "10.0 min",
    ]
    assert [view.size(v) for v in (None, 10, 3000, 5 * 2**20)] == [
        "—",
        "10 B",
        "2.9 KiB",
        "5.0 MiB",
    ]
    assert view.iso_time(0) == "1970-01-01T00:00:00+00:00"
    assert view.run_page_url("/f", "a/b", "r 1") == "/f/ui/dags/a%2Fb/runs/r%201"


def test_every_template_loads_from_the_package() -> None:
    names = render.ENV.list_templates()
    assert {"base.html", "pipeline_page.html", "pipeline_live.html", "runs_live.html"} <= set(names)
    for name in names:
        render.ENV.get_template(name)


def test_pages_escape_ids_and_draw_the_view() -> None:
    evil = '<img src=x onerror="alert(1)">'
    ck = CheckpointSummary(
        checkpoint_id=3,
        kind=CheckpointKind.DRAINED_SAVEPOINT,
        reason="drain",
        state="COMPLETED",
        triggered_at=0.0,
        completed_at=1.5,
        duration_s=1.5,
        size_bytes=2048,
        metadata_path="/m",
        failure_reason=None,
        stage_statuses={evil: StageStatus.FULLY_FINISHED},
    )
    detail = PipelineDetail(
        summary=summary(PipelineRunState.SUSPENDED, key=evil),
        stages=[stage(evil, done=1)],
        checkpoints=[ck],
    )
    page = render.pipeline_page("/finalckpt", evil, "r", detail, can_edit=True)
    live = render.pipeline_live(detail, evil, "r", can_edit=True)
    runs = render.runs_live([summary(PipelineRunState.RUNNING, key=evil)], "/finalckpt")
    for html in (page, live, runs):
        assert "<img" not in html and "&lt;img src=x" in html
    assert live in page
    assert 'data-mode="resume" data-label="Resume">' in live
    assert 'data-mode="drain" data-label="Stop with drain" disabled>' in live
    assert 'data-checkpoint-id="3" data-kind="drained_savepoint" data-state="COMPLETED"' in live
    assert "<td>2.0 KiB</td>" in live and "<td>1.5 s</td>" in live
    assert 'data-api="/finalckpt/api/dags/%3Cimg%20src%3Dx' in page
    assert "<h1>Pipeline runs</h1>" in runs and 'data-run-state="running"' in runs

    missing = render.pipeline_page("/f", "d", "r", None, error="no pipeline <run>", can_edit=False)
    assert '<div class="error" role="alert"><p>no pipeline &lt;run&gt;</p></div>' in missing
    assert 'data-live-url="/f/ui/dags/d/runs/r/live"' in missing

    error = render.error_page(401, "log in", login='/auth/login?next="x"')
    assert 'href="/auth/login?next=&#34;x&#34;" target="_top"' in error
    assert "Log in" not in render.error_page(403, "no")


def test_a_reader_s_page_has_no_action_buttons() -> None:
    """Stop, resume and recompute need permission to edit the DAG's runs: a user without it sees
    none of their buttons (the REST routes would refuse them with 403), only why."""
    detail = PipelineDetail(
        summary=summary(PipelineRunState.RUNNING, key="k"),
        stages=[stage("ingest", done=1), stage("enrich", done=0)],
        checkpoints=[],
    )
    editor = render.pipeline_page("/f", "d", "r", detail, can_edit=True)
    reader = render.pipeline_page("/f", "d", "r", detail, can_edit=False)
    live = render.pipeline_live(detail, "d", "r", can_edit=False)

    assert editor.count("data-action=") == 5  # drain, savepoint, resume, 2 x recompute
    assert "Read only" not in editor
    for html in (reader, live):
        assert "data-action=" not in html and "<button" not in html.split("<dialog")[0]
        assert "Read only: stopping, resuming and recomputing need permission" in html
        assert 'data-stage-id="ingest"' in html  # the rest of the page is drawn
