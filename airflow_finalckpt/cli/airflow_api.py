"""The ``finalckpt`` CLI's client of Airflow's REST API (the CLI reads no Airflow database).

* where: ``[finalckpt] api_url``, else ``[api] base_url``, else ``http://localhost:8080``
  (env ``AIRFLOW__FINALCKPT__API_URL`` / ``AIRFLOW__API__BASE_URL`` or airflow.cfg);
* who: ``[finalckpt] api_token`` (a JWT, e.g. from ``POST /auth/token``), else
  ``[finalckpt] api_username`` + ``api_password``, exchanged for a token at ``POST /auth/token``
  (SimpleAuthManager and FAB both answer it); nothing configured: no credentials, and the
  api-server's 401 says what to set;
* what: the DAG's pipeline graph from the plugin's ``GET /finalckpt/api/dags/{dag_id}/stages``
  (Airflow's own task list has no stage ids), new DAG runs through Airflow's public
  ``POST /api/v2/dags/{dag_id}/dagRuns``, and the plugin's stop, resume, reset and run detail
  routes (``/finalckpt/api/dags/{dag_id}/runs/{run_id}/...``): the default way of
  ``finalckpt stop | resume | reset | status``, so Airflow's roles decide and the changes land
  in Airflow's audit log.

Every failure is an :class:`AirflowApiError` (a ``FinalCheckpointError``) with one line saying
what to do: unreachable, 401, 403, 404 (``UnknownDagError``) or any other refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from airflow_finalckpt.config import airflow_option
from airflow_finalckpt.core.errors import FinalCheckpointError, UnknownDagError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.split_list import DeclaredSplits
from airflow_finalckpt.provider_info import SECTION

DEFAULT_API_URL = "http://localhost:8080"
TIMEOUT_S = 30.0
_CREDENTIALS_HINT = (
    f"set [{SECTION}] api_token (env AIRFLOW__FINALCKPT__API_TOKEN) or "
    f"[{SECTION}] api_username and api_password"
)


class AirflowApiError(FinalCheckpointError):
    """Airflow's API could not be reached, or refused or failed the request."""


class AirflowApiUnreachableError(AirflowApiError):
    """No answer from the api-server (wrong URL, not running, network, timeout)."""


@dataclass(frozen=True)
class ApiSettings:
    """Where the api-server is, and the credentials the CLI presents."""

    url: str
    url_source: str
    token: str | None = None
    username: str | None = None
    password: str | None = None


def api_settings() -> ApiSettings:
    """The API client's settings from Airflow's config (see the module docstring)."""
    url, source = airflow_option(SECTION, "api_url")
    if url is None:
        url, source = airflow_option("api", "base_url")
    if url is None:
        url, source = DEFAULT_API_URL, "default"
    return ApiSettings(
        url=url.rstrip("/"),
        url_source=source,
        token=airflow_option(SECTION, "api_token")[0],
        username=airflow_option(SECTION, "api_username")[0],
        password=airflow_option(SECTION, "api_password")[0],
    )


def _detail(response: httpx.Response) -> str:
    """The server's own message (FastAPI's ``detail``), else the start of the body."""
    try:
        detail = response.json().get("detail")
    except Exception:  # not JSON, or not an object
        detail = None
    if isinstance(detail, str) and detail:
        return detail
    if detail:
        return str(detail)[:300]
    return response.text.strip()[:300] or response.reason_phrase


class AirflowApi:
    """One api-server, one set of credentials; a token is fetched once, on first use."""

    def __init__(self, settings: ApiSettings, *, timeout_s: float = TIMEOUT_S) -> None:
        self.settings = settings
        self._client = httpx.Client(base_url=settings.url, timeout=timeout_s)
        self._token = settings.token

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def __enter__(self) -> AirflowApi:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        where = f"the Airflow API server at {self.settings.url} (from {self.settings.url_source})"
        try:
            return self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise AirflowApiUnreachableError(
                f"cannot reach {where}: {type(exc).__name__}: {exc or 'no answer'}; set "
                f"[{SECTION}] api_url (env AIRFLOW__FINALCKPT__API_URL) or [api] base_url"
            ) from exc
        except httpx.InvalidURL as exc:
            raise AirflowApiError(f"invalid URL of {where}: {exc}") from exc

    def _headers(self) -> dict[str, str]:
        if self._token is None and self.settings.username and self.settings.password:
            self._token = self.login(self.settings.username, self.settings.password)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def login(self, username: str, password: str) -> str:
        """A token for ``username`` from the auth manager's ``POST /auth/token``."""
        response = self._send(
            "POST", "/auth/token", json={"username": username, "password": password}
        )
        if response.status_code in (400, 401, 403):
            raise AirflowApiError(
                f"Airflow refused the login of user {username!r} (HTTP {response.status_code}: "
                f"{_detail(response)}); check [{SECTION}] api_username and api_password"
            )
        doc = self._json(response, "/auth/token") if response.is_success else None
        token = doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise AirflowApiError(
                f"POST /auth/token answered HTTP {response.status_code} without a token: "
                f"{_detail(response)}"
            )
        return token

    def _json(self, response: httpx.Response, path: str) -> Any:
        """The JSON body of a success; anything else (Airflow's web UI answers its HTML page
        for paths no app serves) means the URL is not an api-server with the plugin.
        """
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise AirflowApiError(
                f"{self.settings.url}{path} answered {kind}, not JSON: is {self.settings.url} "
                f"(from {self.settings.url_source}) Airflow's api-server, with airflow-finalckpt "
                "installed there (its plugin serves /finalckpt)?"
            ) from None

    def _request(
        self,
        method: str,
        dag_id: str,
        path: str,
        what: str,
        *,
        run_route: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The JSON answer of a request about ``dag_id``, or the error a user can act on
        (``run_route``: a 404 or 409 of the plugin's run routes is the control service's own
        message: unknown run or stage, already stopping, not suspended...).
        """
        response = self._send(method, path, headers=self._headers(), **kwargs)
        if response.is_success:
            return self._json(response, path)
        detail = _detail(response)
        if response.status_code == 401:
            raise AirflowApiError(
                f"not authenticated at the Airflow API server {self.settings.url} ({detail}); "
                f"{_CREDENTIALS_HINT}"
            )
        if response.status_code == 403:
            raise AirflowApiError(f"Airflow refused to {what}: {detail}")
        if run_route and response.status_code in (404, 409):
            raise FinalCheckpointError(detail)
        if response.status_code == 404:
            raise UnknownDagError(
                f"DAG {dag_id!r} is not known to Airflow at {self.settings.url} (not parsed yet, "
                f"or a typo): {detail}"
            )
        raise AirflowApiError(f"could not {what}: HTTP {response.status_code}: {detail}")

    # ------------------------------------------------------------------ calls

    def _stages(self, dag_id: str) -> list[dict[str, Any]]:
        doc = self._request(
            "GET",
            dag_id,
            f"/finalckpt/api/dags/{quote(dag_id, safe='')}/stages",
            f"read the stages of DAG {dag_id!r}",
        )
        stages: list[dict[str, Any]] = doc["stages"]
        return stages

    def stage_graph(self, dag_id: str) -> StageGraph:
        """The DAG's pipeline graph as Airflow last parsed it; UnknownDagError on 404."""
        stages = self._stages(dag_id)
        try:
            return StageGraph.build(
                Stage(s["stage_id"], tuple(s["upstream"]), s["task_id"]) for s in stages
            )
        except (KeyError, TypeError) as exc:
            raise self._malformed(dag_id, exc) from exc

    def declared_splits(self, dag_id: str) -> dict[str, DeclaredSplits]:
        """Each stage's fixed split list (None: computed when its task runs), as the api-server
        read it from the DAG; a plugin without the field answers None (checked by the task).
        """
        stages = self._stages(dag_id)
        try:
            return {
                s["stage_id"]: DeclaredSplits(
                    None if s.get("splits") is None else tuple(s["splits"]),
                    bool(s.get("allow_split_list_change", False)),
                )
                for s in stages
            }
        except (KeyError, TypeError) as exc:
            raise self._malformed(dag_id, exc) from exc

    @staticmethod
    def _malformed(dag_id: str, exc: Exception) -> AirflowApiError:
        return AirflowApiError(
            f"the stages of DAG {dag_id!r} came back malformed ({exc!r}): is airflow-finalckpt "
            "of the same version installed on the api-server?"
        )

    def trigger_run(
        self, dag_id: str, conf: Mapping[str, Any], *, run_id: str | None, note: str
    ) -> str:
        """Create a DAG run (``POST /api/v2/dags/{dag_id}/dagRuns``); returns its run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf), "note": note}
        if run_id is not None:
            body["dag_run_id"] = run_id
        doc = self._request(
            "POST",
            dag_id,
            f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns",
            f"create a DAG run of {dag_id!r}",
            json=body,
        )
        new_run_id = doc.get("dag_run_id") if isinstance(doc, dict) else None
        if not new_run_id:
            raise AirflowApiError(f"Airflow created a run of {dag_id!r} but named none: {doc!r}")
        return str(new_run_id)

    def dag_run_exists(self, dag_id: str, run_id: str) -> bool:
        """Whether Airflow still has the DAG run (``GET /api/v2/dags/{dag_id}/dagRuns/{run_id}``;
        404, for the run or its DAG, means deleted). Other refusals raise AirflowApiError.
        """
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
        try:
            self._request("GET", dag_id, path, f"read DAG run {run_id!r} of {dag_id!r}")
        except UnknownDagError:
            return False
        return True

    # ------------------------------------------------------------------ the plugin's run routes

    @staticmethod
    def run_path(dag_id: str, run_id: str) -> str:
        """The plugin's REST path of a DAG run's pipeline."""
        return f"/finalckpt/api/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"

    def run_detail(self, dag_id: str, run_id: str) -> Any:
        """``GET .../runs/{run_id}``: the pipeline run's detail (JSON of ``PipelineDetail``)."""
        path = self.run_path(dag_id, run_id)
        return self._request(
            "GET", dag_id, path, f"read DAG run {run_id!r} of {dag_id!r}", run_route=True
        )

    def change_run(
        self, dag_id: str, run_id: str, action: str, body: Mapping[str, Any] | None = None
    ) -> Any:
        """``POST .../runs/{run_id}/{action}`` (stop, resume, reset): the plugin's answer."""
        return self._request(
            "POST",
            dag_id,
            f"{self.run_path(dag_id, run_id)}/{action}",
            f"{action} DAG run {run_id!r} of {dag_id!r}",
            run_route=True,
            json=dict(body or {}),
        )
