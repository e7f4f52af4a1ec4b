"""Writes the DAG run note of a drained pipeline run when its DAG run succeeds, and names the
stages whose progress the run dropped on purpose (``allow_drop_stages`` in its conf).

Runs in the scheduler (which owns Airflow's metadata database: the note is set on the DagRun
the scheduler is committing, never from task code). Reads the plugin's own store; any failure
is logged and ignored: a note must never break scheduling.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

if TYPE_CHECKING:
    from airflow_finalckpt.control import PipelineControl

log = logging.getLogger(__name__)

_CONTROL: dict[str, PipelineControl] = {}
_LOCK = threading.Lock()


def _control() -> PipelineControl:
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.control import PipelineControl
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.engine import make_engine

    settings = load_settings()
    with _LOCK:
        control = _CONTROL.get(settings.store_url)
        if control is None:
            control = PipelineControl(
                make_engine(settings.store_url),
                CheckpointStorage(settings.storage_uri, settings.storage_options),
            )
            _CONTROL[settings.store_url] = control
        return control


def drop_note(conf: Any) -> str | None:
    """The note of a run whose conf drops stages' progress on purpose; None otherwise (also for
    a malformed value: the stage tasks refuse that run with a one-line error).
    """
    from airflow_finalckpt.core.errors import InvalidRunConfError
    from airflow_finalckpt.core.run_conf import ALLOW_DROP_STAGES_KEY, parse_allow_drop_stages

    if not isinstance(conf, dict):
        return None
    try:
        stages = parse_allow_drop_stages(conf.get(ALLOW_DROP_STAGES_KEY))
    except InvalidRunConfError:
        return None
    if not stages:
        return None
    return (
        f"allow_drop_stages: the progress of {', '.join(stages)} (if removed or renamed in the "
        "DAG) was dropped on purpose; see the stage task logs."
    )


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """Write the note of a run that dropped stages on purpose or was drained (scheduler)."""
    try:
        drop = drop_note(getattr(dag_run, "conf", None))
        if drop and not dag_run.note:
            dag_run.note = drop
        note = _control().drain_note(dag_run.dag_id, dag_run.run_id)
        if note and (not dag_run.note or dag_run.note == drop):
            dag_run.note = f"{drop} {note}" if drop else note
            log.info("DAG run %s of %s was drained: note set", dag_run.run_id, dag_run.dag_id)
    except Exception as exc:  # e.g. the store is unreachable or not migrated yet
        log.warning(
            "could not write the drain note of DAG run %s: %s: %s",
            getattr(dag_run, "run_id", "?"),
            type(exc).__name__,
            (str(exc).splitlines() or [""])[0],
        )
