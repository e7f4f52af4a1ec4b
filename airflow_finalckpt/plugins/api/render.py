"""The UI pages rendered from the Jinja2 templates in ``airflow_finalckpt/plugins/templates``
(package data; Jinja2 ships with Airflow). Autoescaping is on for every template, so ids, run
ids and error texts can never inject markup; the values the templates draw come from ``view``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from airflow_finalckpt.control import PipelineDetail, PipelineRunSummary
from airflow_finalckpt.plugins.api import view


def _environment() -> Environment:
    """The templates' environment: escaped, strict about undefined names, view helpers in."""
    env = Environment(
        loader=PackageLoader("airflow_finalckpt.plugins", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        iso_time=view.iso_time,
        display_time=view.display_time,
        duration=view.duration,
        size=view.size,
        status_colours=view.status_colours,
        status_label=view.status_label,
    )
    env.globals.update(
        buttons=view.buttons,
        graph_layout=view.graph_layout,
        ordered_statuses=view.ordered_statuses,
        run_page_url=view.run_page_url,
        status_colours_all=view.STATUS_COLOURS,
        box_w=view.BOX_W,
        box_h=view.BOX_H,
    )
    return env


ENV = _environment()


def _render(name: str, **context: Any) -> str:
    return ENV.get_template(name).render(**context)


def pipeline_live(detail: PipelineDetail, dag_id: str, run_id: str, *, can_edit: bool) -> str:
    """The part of the pipeline page that refreshes every 2 s; its action buttons only where
    ``can_edit`` (the user may edit the DAG's runs).
    """
    stage_order = [s.stage_id for s in detail.stages]
    return _render(
        "pipeline_live.html",
        detail=detail,
        dag_id=dag_id,
        run_id=run_id,
        stage_order=stage_order,
        can_edit=can_edit,
    )


def pipeline_page(
    base: str,
    dag_id: str,
    run_id: str,
    detail: PipelineDetail | None,
    error: str | None = None,
    *,
    can_edit: bool,
) -> str:
    """The pipeline page of a DAG run; ``error`` instead of ``detail`` while it has none yet;
    action buttons only where ``can_edit``.
    """
    run_url = view.run_page_url(base, dag_id, run_id)
    return _render(
        "pipeline_page.html",
        title=f"Pipeline of {dag_id} / {run_id}",
        base=base,
        page_kind="pipeline",
        live_url=run_url + "/live",
        api_url=f"{base}/api/dags/{view.quoted(dag_id)}/runs/{view.quoted(run_id)}",
        detail=detail,
        error=error,
        dag_id=dag_id,
        run_id=run_id,
        stage_order=[s.stage_id for s in detail.stages] if detail else [],
        can_edit=can_edit,
    )


def runs_live(runs: Sequence[PipelineRunSummary], base: str) -> str:
    """The runs page's live part (refreshed every 2 s)."""
    return _render("runs_live.html", runs=runs, base=base)


def runs_page(runs: Sequence[PipelineRunSummary], base: str, live_url: str) -> str:
    """The page listing pipeline runs."""
    return _render(
        "runs_page.html",
        title="Pipeline runs",
        base=base,
        page_kind="runs",
        live_url=live_url,
        runs=runs,
    )


def error_page(status_code: int, detail: str, *, login: str | None = None) -> str:
    """An HTTP error of a UI route (401 links to Airflow's login, outside the iframe)."""
    return _render("error.html", status_code=status_code, detail=detail, login=login)
