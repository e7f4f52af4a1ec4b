"""The FastAPI app the plugin mounts in Airflow's api-server at ``/finalckpt``.

* ``/finalckpt/api/...``: REST (JSON) routes, see ``routes.py``; OpenAPI at
  ``/finalckpt/api/openapi.json``, Swagger UI at ``/finalckpt/api/docs``;
* ``/finalckpt/ui/...``: HTML pages shown inside Airflow's UI (external views), see ``ui.py``;
* ``/finalckpt/static/...``: the pages' script and style sheet.

Every route authenticates the Airflow user and checks their permission on the DAG (``auth.py``).
Built lazily by the plugin (``get_app``), so importing the plugin stays cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.plugins.api import render
from airflow_finalckpt.plugins.api.auth import Principal, authenticate, login_url
from airflow_finalckpt.plugins.api.control import default_control
from airflow_finalckpt.plugins.api.control import http_error as control_http_error
from airflow_finalckpt.plugins.api.routes import build_router
from airflow_finalckpt.plugins.api.ui import base_of, build_ui_router

DESCRIPTION = """\
Stop a running pipeline **with drain** (finish everything, fire every event-time window,
commit, end the DAG run) or **with a savepoint** (suspend at the next split-batch boundary,
nothing lost), **resume** it, **restore** a savepoint into a new DAG run, and read pipeline
runs, stages and checkpoint history.

Authentication: `Authorization: Bearer <JWT>` (from Airflow's `POST /auth/token`) or the
Airflow UI session cookie `_token`; changes made with the cookie must send the header
`X-Finalckpt-Request: 1`. Authorization is Airflow's: reading needs GET on the DAG's runs,
stop/resume need PUT (edit runs), restore needs POST and PUT.
"""


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _is_html(request: Request) -> bool:
    path = request.url.path
    base = base_of(request)
    rel = path[len(base) :] if base and path.startswith(base) else path
    return rel.startswith("/ui/")


def create_app(get_control: Callable[[], PipelineControl] | None = None) -> FastAPI:
    """A new app; ``get_control`` overrides the control service (tests)."""
    control_dep = get_control or default_control
    app = FastAPI(
        title="airflow-finalckpt",
        summary="Stop / drain / resume / restore of pipeline runs with final checkpoints",
        description=DESCRIPTION,
        version=_version(),
        openapi_url=None,  # served below, behind authentication like every route
        docs_url=None,
        redoc_url=None,
        openapi_tags=[
            {"name": "Pipeline runs", "description": "Read pipeline runs and checkpoints"},
            {"name": "Stop and resume", "description": "Stop with drain/savepoint; resume"},
            {"name": "Restore", "description": "Restore a savepoint into a new DAG run"},
            {"name": "DAGs", "description": "A DAG's pipeline graph (stage ids and edges)"},
            {"name": "UI pages", "description": "HTML shown inside the Airflow UI"},
        ],
    )
    app.include_router(build_router(control_dep))
    app.include_router(build_ui_router(control_dep))

    @app.get("/api/openapi.json", include_in_schema=False)
    def openapi(_: Annotated[Principal, Depends(authenticate)]) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/api/docs", include_in_schema=False)
    def docs(request: Request, _: Annotated[Principal, Depends(authenticate)]) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=f"{base_of(request)}/api/openapi.json", title="airflow-finalckpt API"
        )

    @app.exception_handler(FinalCheckpointError)
    async def control_error(request: Request, exc: FinalCheckpointError) -> Any:
        """Errors of the control service (unknown run, already stopping, drained savepoint,
        ...) answer with their own message and status (404/409/422/503), like any HTTP error.
        """
        return await http_error(request, control_http_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        headers = getattr(exc, "headers", None)
        if _is_html(request):
            login = login_url(request) if exc.status_code == 401 else None
            return HTMLResponse(
                render.error_page(exc.status_code, str(exc.detail), login=login),
                status_code=exc.status_code,
                headers=headers,
            )
        if exc.status_code == 401:  # where the page sends the user to log in again
            headers = {**(headers or {}), "X-Finalckpt-Login": login_url(request)}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": _validation_detail(exc), "errors": jsonable_errors(exc)},
            status_code=422,
        )

    return app


def jsonable_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """The validation errors as JSON: where, what and which check (no input values)."""
    from fastapi.encoders import jsonable_encoder

    return [
        {k: v for k, v in err.items() if k in ("loc", "msg", "type")}
        for err in jsonable_encoder(exc.errors())
    ]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("airflow-finalckpt")
    except Exception:  # pragma: no cover
        return "0"


_APP: FastAPI | None = None
_APP_LOCK = threading.Lock()


def get_app() -> FastAPI:
    """The process-wide app the plugin registers (built on first use)."""
    global _APP
    with _APP_LOCK:
        if _APP is None:
            _APP = create_app()
        return _APP
