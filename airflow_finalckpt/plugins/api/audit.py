"""Airflow's audit log for every change made through the plugin (stop, resume, reset, restore).

Each change is one row of Airflow's ``log`` table (``airflow.models.Log``), the table Airflow's
own api-server routes write through ``airflow.api_fastapi.logging.decorators.action_logging``
and the one its UI (Browse > Audit Log) and ``GET /api/v2/eventLogs`` read: event
``finalckpt.<action>``, the user as owner, the DAG id, the run id, and in ``extra`` the request
(mode, stage, savepoint path, masked like Airflow masks request bodies), how the user
authenticated and the **result**.

Why not ``action_logging`` itself: it writes its row before the route runs and records no
outcome, and it authenticates again through Airflow's ``get_user`` (bearer or cookie rules
that differ from this app's). Here the row is written first too, before anything changes, and
a failure to write it refuses the change (503, nothing done); once the action ran the same row
gets its result: ``accepted`` with what was done, or ``refused``/``failed`` with the HTTP
status and message. Only the api-server writes these rows (tasks, triggers and DAG
processors never touch Airflow's metadata database). Requests refused by authentication or
authorization (401/403) are not recorded, as in Airflow's own routes; dry runs neither.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, status

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.plugins.api.auth import Principal

log = logging.getLogger(__name__)

#: every event this app writes starts with it (``GET /api/v2/eventLogs?event_pattern=finalckpt``)
EVENT_PREFIX = "finalckpt."
ACTIONS = ("stop", "resume", "reset", "restore")


@dataclass
class AuditEntry:
    """The row of one change: what was asked, then what came of it (set by the route)."""

    event: str
    dag_id: str
    run_id: str | None
    request: dict[str, Any]
    result: dict[str, Any] = field(default_factory=dict)
    row_id: int | None = None

    def extra(self, outcome: Mapping[str, Any]) -> str:
        """The ``extra`` column: the request, then the outcome (JSON, like Airflow's)."""
        return json.dumps({**self.request, **outcome}, default=str)


def _masked(values: Mapping[str, Any]) -> dict[str, Any]:
    """Request values as Airflow's ``action_logging`` masks them (secret-looking keys, values
    registered with ``mask_secret``), paths and URLs with their credentials masked too.
    """
    from airflow._shared.secrets_masker import secrets_masker

    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, str):
            value = mask_url(value)
        out[key] = secrets_masker.redact(value, key)
    return out


def _insert(entry: AuditEntry, principal: Principal, method: str) -> int:
    from airflow.models import Log
    from airflow.utils.session import create_session

    row = Log(
        event=entry.event,
        owner=principal.name,
        owner_display_name=principal.name,
        extra=entry.extra({"method": method, "result": "requested"}),
        dag_id=entry.dag_id,
        run_id=entry.run_id,
    )
    with create_session() as session:
        session.add(row)
        session.flush()
        return int(row.id)


def _update(entry: AuditEntry, outcome: Mapping[str, Any]) -> None:
    from airflow.models import Log
    from airflow.utils.session import create_session
    from sqlalchemy import update

    values: dict[str, Any] = {"extra": entry.extra(outcome)}
    if entry.run_id is not None:
        values["run_id"] = entry.run_id
    with create_session() as session:
        session.execute(update(Log).where(Log.id == entry.row_id).values(**values))


def _status_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, FinalCheckpointError):
        from airflow_finalckpt.plugins.api.control import http_error

        answer = http_error(exc)
        return answer.status_code, str(answer.detail)
    return status.HTTP_500_INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}"


@contextmanager
def audited(
    principal: Principal,
    action: str,
    dag_id: str,
    run_id: str | None,
    request: Mapping[str, Any],
    *,
    method: str = "POST",
) -> Iterator[AuditEntry]:
    """Record ``action`` on ``dag_id``/``run_id`` in Airflow's audit log around the block.

    The row is written before the block runs (a failure: 503, the block never runs); the
    block puts what it did in ``entry.result`` (and may set ``entry.run_id``); an exception
    out of the block is recorded as ``refused`` (4xx) or ``failed`` and raised on.
    """
    entry = AuditEntry(
        event=EVENT_PREFIX + action,
        dag_id=dag_id,
        run_id=run_id,
        request={**_masked(request), "auth": principal.via},
    )
    try:
        entry.row_id = _insert(entry, principal, method)
    except Exception as exc:
        log.exception("finalckpt: cannot write the audit log entry of %s", entry.event)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the {action} was not done: it could not be recorded in Airflow's audit log "
            f"({type(exc).__name__}); check the api-server's metadata database connection",
        ) from exc
    outcome: dict[str, Any] = {"method": method}
    try:
        yield entry
    except BaseException as exc:
        code, detail = _status_of(exc)
        outcome.update(result="refused" if code < 500 else "failed", status_code=code)
        outcome["detail"] = detail
        _record_outcome(entry, outcome)
        raise
    outcome.update(result="accepted", **entry.result)
    _record_outcome(entry, outcome)


def _record_outcome(entry: AuditEntry, outcome: Mapping[str, Any]) -> None:
    """Put the outcome on the row; the change is done, so a failure here is logged, not raised
    (the row written before the change stays, with result ``requested``).
    """
    try:
        _update(entry, outcome)
    except Exception:
        log.exception(
            "finalckpt: the %s was done but its result could not be added to audit log row %s",
            entry.event,
            entry.row_id,
        )
