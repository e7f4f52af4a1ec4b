"""Writes the DAG run note of a drained pipeline run when its DAG run succeeds.

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


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    try:
        note = _control().drain_note(dag_run.dag_id, dag_run.run_id)
        if note and not dag_run.note:
            dag_run.note = note
            log.info("DAG run %s of %s was drained: note set", dag_run.run_id, dag_run.dag_id)
    except Exception as exc:  # e.g. the store is unreachable or not migrated yet
        log.warning(
            "could not write the drain note of DAG run %s: %s: %s",
            getattr(dag_run, "run_id", "?"),
            type(exc).__name__,
            (str(exc).splitlines() or [""])[0],
        )
