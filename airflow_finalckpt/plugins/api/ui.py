"""HTML routes under ``/finalckpt/ui`` (shown in Airflow's UI through external views) and the
page's static files. Read-only: the page's buttons POST to the REST routes, and a user sees
only the buttons of the actions they may take (stop, resume and recompute need permission to
edit the DAG's runs; the REST routes refuse them with 403 anyway).
"""

from collections.abc import Callable
from importlib import resources
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, Response

from airflow_finalckpt.control import PipelineControl, PipelineDetail, PipelineRunSummary
from airflow_finalckpt.core.errors import UnknownPipelineError, UnknownRunError
from airflow_finalckpt.plugins.api import render
from airflow_finalckpt.plugins.api.auth import (
    Principal,
    authenticate,
    authorize_dag,
    is_allowed,
    readable_runs,
)

TAG_UI = "UI pages"
STATIC_TYPES = {"finalckpt.js": "text/javascript", "finalckpt.css": "text/css"}
NO_STORE = {"Cache-Control": "no-store"}


def base_of(request: Request) -> str:
    """The app's own URL prefix (``/finalckpt``, behind Airflow's base path if any)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


Authenticated = Annotated[Principal, Depends(authenticate)]
ControlFactory = Callable[[], PipelineControl]


def build_ui_router(get_control: ControlFactory) -> APIRouter:
    """The HTML routes; ``get_control`` supplies the control service (tests pass their own)."""
    router = APIRouter(tags=[TAG_UI])
    _add_runs_pages(router, get_control)
    _add_pipeline_pages(router, get_control)
    _add_static_files(router)
    return router


def visible_runs(
    principal: Principal, control: PipelineControl, dag_id: str | None
) -> list[PipelineRunSummary]:
    """The runs the page and its refreshes show: of ``dag_id`` if given, and readable."""
    if dag_id is not None:
        authorize_dag(principal, dag_id, "GET")
    return readable_runs(principal, control.runs(dag_id))


def pipeline_detail(
    principal: Principal, control: PipelineControl, dag_id: str, run_id: str
) -> PipelineDetail:
    """The run's detail, once the user may read the DAG's runs (403 otherwise)."""
    authorize_dag(principal, dag_id, "GET")
    return control.describe(dag_id, run_id)


def may_edit(principal: Principal, dag_id: str) -> bool:
    """Whether the page shows the stop, resume and recompute buttons: the permission the REST
    routes behind them ask for (edit the DAG's runs).
    """
    return is_allowed(principal, dag_id, "PUT")


def _add_runs_pages(router: APIRouter, get_control: ControlFactory) -> None:
    """The page listing all pipeline runs, and its live fragment."""

    @router.get("/ui/runs", response_class=HTMLResponse, summary="Page: all pipeline runs")
    def runs_page(
        request: Request,
        principal: Authenticated,
        control: Annotated[PipelineControl, Depends(get_control)],
        dag_id: Annotated[str | None, Query()] = None,
    ) -> HTMLResponse:
        base = base_of(request)
        live = f"{base}/ui/runs/live" + (f"?{urlencode({'dag_id': dag_id})}" if dag_id else "")
        runs = visible_runs(principal, control, dag_id)
        return HTMLResponse(render.runs_page(runs, base, live), headers=NO_STORE)

    @router.get("/ui/runs/live", response_class=HTMLResponse, summary="Fragment: pipeline runs")
    def runs_fragment(
        request: Request,
        principal: Authenticated,
        control: Annotated[PipelineControl, Depends(get_control)],
        dag_id: Annotated[str | None, Query()] = None,
    ) -> HTMLResponse:
        runs = visible_runs(principal, control, dag_id)
        return HTMLResponse(render.runs_live(runs, base_of(request)), headers=NO_STORE)


def _add_pipeline_pages(router: APIRouter, get_control: ControlFactory) -> None:
    """The pipeline page of a DAG run, and its live fragment."""

    @router.get(
        "/ui/dags/{dag_id}/runs/{run_id}",
        response_class=HTMLResponse,
        summary="Page: the pipeline of a DAG run",
    )
    def pipeline_page(
        request: Request,
        dag_id: str,
        run_id: str,
        principal: Authenticated,
        control: Annotated[PipelineControl, Depends(get_control)],
    ) -> HTMLResponse:
        base = base_of(request)
        try:
            detail = pipeline_detail(principal, control, dag_id, run_id)
        except (UnknownRunError, UnknownPipelineError) as exc:
            # Not started yet: show why, and keep polling until the first stage registers it.
            content = render.pipeline_page(
                base, dag_id, run_id, None, error=str(exc), can_edit=False
            )
            return HTMLResponse(content, status_code=status.HTTP_404_NOT_FOUND, headers=NO_STORE)
        content = render.pipeline_page(
            base, dag_id, run_id, detail, can_edit=may_edit(principal, dag_id)
        )
        return HTMLResponse(content, headers=NO_STORE)

    @router.get(
        "/ui/dags/{dag_id}/runs/{run_id}/live",
        response_class=HTMLResponse,
        summary="Fragment: the live part of the pipeline page",
    )
    def pipeline_fragment(
        dag_id: str,
        run_id: str,
        principal: Authenticated,
        control: Annotated[PipelineControl, Depends(get_control)],
    ) -> HTMLResponse:
        detail = pipeline_detail(principal, control, dag_id, run_id)
        content = render.pipeline_live(detail, dag_id, run_id, can_edit=may_edit(principal, dag_id))
        return HTMLResponse(content, headers=NO_STORE)


def _add_static_files(router: APIRouter) -> None:
    """The page's script and style sheet (behind authentication like every route)."""

    @router.get("/static/{name}", summary="The page's script and style sheet")
    def static(name: str, _: Authenticated) -> Response:
        media = STATIC_TYPES.get(name)
        if media is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {name!r}")
        data = resources.files("airflow_finalckpt.plugins.api").joinpath("static", name)
        return Response(data.read_bytes(), media_type=media, headers={"Cache-Control": "no-cache"})

    @router.get("/static/ui/{name}", summary="The React apps' bundle (built from ui/)")
    def bundle(name: str, _: Authenticated) -> Response:
        if not name.endswith(".js") or "/" in name or name.startswith("."):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no UI file {name!r}")
        data = resources.files("airflow_finalckpt.plugins.api").joinpath("static", "ui", name)
        if not data.is_file():
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                f"no UI file {name!r}: the React bundle was not built "
                "(scripts/setup.sh builds it: npm ci && npm run build in ui/)",
            )
        return Response(
            data.read_bytes(), media_type="text/javascript", headers={"Cache-Control": "no-cache"}
        )
