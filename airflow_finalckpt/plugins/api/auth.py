"""Authentication and authorization of every route of the finalckpt FastAPI app.

Airflow mounts plugin apps under its api-server but gives them no authentication, so each route
here depends on :func:`authenticate` (who is calling) and then on :func:`authorize_dag` (may they
do this to that DAG's runs), both delegating to Airflow's configured auth manager:

* credentials: ``Authorization: Bearer <JWT>`` (what ``POST /auth/token`` returns), else the
  Airflow UI session cookie ``_token`` (``COOKIE_NAME_JWT_TOKEN``: the same JWT, set by the
  login page; the browser sends it to the plugin page in Airflow's iframe). As in Airflow's own
  ``get_user``, an explicit bearer token wins over the ambient cookie;
* validation: ``get_auth_manager().get_user_from_token`` (signature, expiry, audience,
  revocation): missing, malformed, expired, revoked or forged -> **401** with
  ``WWW-Authenticate: Bearer``. (Airflow's public API answers 403 to a forged token; a 401
  tells clients to log in again, which is the useful answer.);
* authorization: ``is_authorized_dag(method, access_entity=DagAccessEntity.RUN,
  details=DagDetails(id=dag_id))``: ``GET`` to read, ``PUT`` (edit runs) to stop/resume, ``POST``
  + ``PUT`` to restore into a new run -> **403** otherwise;
* CSRF: a state-changing request authenticated by the cookie must carry the header
  ``X-Finalckpt-Request: 1`` (a cross-site form cannot set it, and cross-origin scripts would
  need a CORS preflight Airflow does not grant) and must not come from another origin
  (``Origin`` / ``Sec-Fetch-Site``; the UI's own origin is the request's host, the host of
  Airflow's ``[api] base_url``, and ``X-Forwarded-Host`` only with ``[finalckpt]
  trust_forwarded_host``) -> **403** otherwise. Bearer tokens are not ambient, so
  they need neither.

Checks run before any state is read or changed: a 401/403 changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, status

from airflow_finalckpt.provider_info import SECTION

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

    from airflow_finalckpt.control import PipelineRunSummary

log = logging.getLogger(__name__)

#: The Airflow UI session cookie (``airflow.api_fastapi.auth.managers.base_auth_manager``).
COOKIE_NAME = "_token"
#: Header the page's JavaScript sends with every change (CSRF defence for cookie sessions).
CSRF_HEADER = "X-Finalckpt-Request"
CSRF_VALUE = "1"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``[finalckpt] trust_forwarded_host``: a proxy in front of the api-server sets (overwrites)
#: ``X-Forwarded-Host`` on every request, so the CSRF origin check may take it as the host.
TRUST_FORWARDED_HOST = "trust_forwarded_host"


@dataclass(frozen=True)
class Principal:
    """An authenticated Airflow user and how they proved it."""

    user: BaseUser
    via: Literal["bearer", "cookie"]

    @property
    def name(self) -> str:
        """The user name Airflow shows (recorded as who stopped, resumed or restored)."""
        return str(self.user.get_name())


def _unauthorized(detail: str, error: str | None = None) -> HTTPException:
    challenge = 'Bearer realm="airflow-finalckpt"'
    if error:
        challenge += f', error="{error}"'
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=detail,
        headers={"WWW-Authenticate": challenge},
    )


def forbidden(detail: str) -> HTTPException:
    """A 403 answer with ``detail``."""
    return HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=detail)


def _credentials(request: Request) -> tuple[str, Literal["bearer", "cookie"]] | None:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise _unauthorized(
                "the Authorization header must be 'Bearer <token>' (a JWT from POST /auth/token)",
                "invalid_request",
            )
        return value.strip(), "bearer"
    cookie = request.cookies.get(COOKIE_NAME)
    if cookie:
        return cookie, "cookie"
    return None


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency: the calling Airflow user, or 401."""
    from airflow.api_fastapi.app import get_auth_manager
    from jwt import ExpiredSignatureError, InvalidTokenError

    found = _credentials(request)
    if found is None:
        raise _unauthorized(
            "not authenticated: log in to Airflow, or send 'Authorization: Bearer <token>' "
            "with a token from POST /auth/token"
        )
    token, via = found
    try:
        user = await get_auth_manager().get_user_from_token(token)
    except ExpiredSignatureError:
        raise _unauthorized("the token has expired: log in again", "invalid_token") from None
    except InvalidTokenError:
        raise _unauthorized(
            "the token is not valid (bad signature, malformed, revoked or not for this Airflow)",
            "invalid_token",
        ) from None
    principal = Principal(user=user, via=via)
    request.state.finalckpt_principal = principal
    return principal


def check_csrf(request: Request, principal: Principal) -> None:
    """Refuse a cookie-authenticated change that a browser could have sent cross-site."""
    if request.method.upper() in SAFE_METHODS or principal.via != "cookie":
        return
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        raise forbidden("cross-site request refused (CSRF protection)")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        if urlsplit(origin).netloc not in _own_hosts(request):
            raise forbidden(
                f"request from origin {origin!r} refused (CSRF protection): changes are "
                "accepted from the Airflow UI's own origin only"
            )
    elif origin == "null":
        raise forbidden("request from an opaque origin refused (CSRF protection)")
    if request.headers.get(CSRF_HEADER) != CSRF_VALUE:
        raise forbidden(
            f"a change authenticated by the Airflow session cookie must send the header "
            f"'{CSRF_HEADER}: {CSRF_VALUE}' (CSRF protection); API clients should use "
            "'Authorization: Bearer <token>'"
        )


def _own_hosts(request: Request) -> set[str]:
    """The hosts a change may come from: the one the request was sent to, the one of
    Airflow's ``[api] base_url`` (where a proxy serves the UI), and a proxy's
    ``X-Forwarded-Host`` only when ``[finalckpt] trust_forwarded_host`` says the proxy sets it
    on every request: a client can send that header too (issue 37).
    """
    from airflow.configuration import conf

    hosts = {urlsplit(str(request.base_url)).netloc, request.headers.get("host", "")}
    base_url = conf.get("api", "base_url", fallback=None)
    if base_url:
        hosts.add(urlsplit(base_url).netloc)
    forwarded = request.headers.get("x-forwarded-host")
    if forwarded and conf.getboolean(SECTION, TRUST_FORWARDED_HOST, fallback=False):
        hosts.add(forwarded.split(",")[0].strip())
    return hosts - {""}


def _team_name(dag_id: str) -> str | None:
    """The DAG's team in multi-team deployments (the auth manager needs it), else None."""
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.dag import DagModel

    return DagModel.get_team_name(dag_id)


def is_allowed(
    principal: Principal, dag_id: str, method: ResourceMethod, entity: str = "RUN"
) -> bool:
    """May ``principal`` do ``method`` on ``dag_id``'s ``entity`` (a ``DagAccessEntity`` name:
    its runs unless told)? The auth manager decides.
    """
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    return bool(
        get_auth_manager().is_authorized_dag(
            method=method,
            access_entity=DagAccessEntity[entity],
            details=DagDetails(id=dag_id, team_name=_team_name(dag_id)),
            user=principal.user,
        )
    )


_VERBS: dict[str, str] = {
    "GET": "read the {entity} of",
    "PUT": "edit the {entity} of",
    "POST": "create {entity} of",
}
_ENTITY_WORDS: dict[str, str] = {"RUN": "runs", "TASK": "tasks"}


def readable_runs(
    principal: Principal, runs: Iterable[PipelineRunSummary]
) -> list[PipelineRunSummary]:
    """The runs whose every DAG the user may read (one check per DAG); a pipeline run with no
    DAG run recorded belongs to nobody's DAG and is hidden. The JSON list and the runs page
    both filter through here, so they cannot show different runs.
    """
    may_read = readable_dag(principal)
    return [r for r in runs if r.dag_runs and all(may_read(d) for d, _ in r.dag_runs)]


def readable_dag(principal: Principal) -> Callable[[str], bool]:
    """``may_read(dag_id)``: may the user read the DAG's runs (asked once per DAG)."""
    allowed: dict[str, bool] = {}

    def may_read(dag_id: str) -> bool:
        if dag_id not in allowed:
            allowed[dag_id] = is_allowed(principal, dag_id, "GET")
        return allowed[dag_id]

    return may_read


def authorize_dag(
    principal: Principal, dag_id: str, *methods: ResourceMethod, entity: str = "RUN"
) -> None:
    """403 unless ``principal`` may do every one of ``methods`` on ``dag_id``'s ``entity``
    (its runs unless told).
    """
    for method in methods:
        if not is_allowed(principal, dag_id, method, entity):
            verb = _VERBS.get(method, method).format(entity=_ENTITY_WORDS.get(entity, entity))
            raise forbidden(f"user {principal.name!r} may not {verb} DAG {dag_id!r}")


def login_url(request: Request) -> str:
    """Where the auth manager logs users in (shown on 401 pages)."""
    from airflow.api_fastapi.app import get_auth_manager

    try:
        return str(get_auth_manager().get_url_login())
    except Exception:  # pragma: no cover - any auth manager problem: fall back to the root
        return "/"
