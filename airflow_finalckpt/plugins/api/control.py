"""The app's access to the pipelines: one ``PipelineControl`` per process, and error mapping.

The control service is built on first use (never at import: the plugin module is imported by
every Airflow component) from the finalckpt settings the api-server sees
(``AIRFLOW__FINALCKPT__STORE_URL`` / ``AIRFLOW_CONN_FINALCKPT_DEFAULT`` / airflow.cfg
``[finalckpt]`` / defaults under ``AIRFLOW_HOME``), the same resolution the CLI uses.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fastapi import HTTPException, status

from airflow_finalckpt.core.errors import (
    ConfigurationError,
    DrainedSavepointError,
    FinalCheckpointError,
    ForeignCheckpointError,
    IllegalGraphChangeError,
    IllegalTransitionError,
    InvalidRunConfError,
    MetadataError,
    StopRequestError,
    StorageError,
    UnknownDagError,
    UnknownPipelineError,
    UnknownRunError,
    UnknownStageError,
)

if TYPE_CHECKING:
    from airflow_finalckpt.control import PipelineControl

_LOCK = threading.Lock()
_CONTROL: PipelineControl | None = None


def default_control() -> PipelineControl:
    """The process-wide control service over the configured store and checkpoint storage."""
    global _CONTROL
    with _LOCK:
        if _CONTROL is None:
            from airflow_finalckpt.config import load_settings
            from airflow_finalckpt.control import PipelineControl
            from airflow_finalckpt.storage import CheckpointStorage
            from airflow_finalckpt.store.engine import make_engine
            from airflow_finalckpt.store.migrate import require_schema

            settings = load_settings()
            engine = make_engine(settings.store_url)
            try:
                require_schema(engine)  # the api-server migrates no PostgreSQL store
            except BaseException:
                engine.dispose()
                raise
            storage = CheckpointStorage(settings.storage_uri, settings.storage_options)
            _CONTROL = PipelineControl(engine, storage)
        return _CONTROL


def reset_default_control() -> None:
    """Forget the cached control service (tests; settings changed)."""
    global _CONTROL
    with _LOCK:
        if _CONTROL is not None:
            _CONTROL.engine.dispose()
        _CONTROL = None


def http_error(exc: FinalCheckpointError) -> HTTPException:
    """The HTTP answer to an error of the control service (its message is the detail)."""
    detail = str(exc)
    if isinstance(
        exc, UnknownRunError | UnknownPipelineError | UnknownDagError | UnknownStageError
    ):
        code = status.HTTP_404_NOT_FOUND
    elif isinstance(
        exc,
        StopRequestError
        | DrainedSavepointError
        | ForeignCheckpointError
        | IllegalTransitionError
        | IllegalGraphChangeError,
    ):
        code = status.HTTP_409_CONFLICT
    elif isinstance(exc, MetadataError | StorageError | InvalidRunConfError):
        code = status.HTTP_422_UNPROCESSABLE_CONTENT
    elif isinstance(exc, ConfigurationError):
        code = status.HTTP_503_SERVICE_UNAVAILABLE
        detail = f"airflow-finalckpt is not configured on the api-server: {exc}"
    else:
        code = status.HTTP_409_CONFLICT
    return HTTPException(status_code=code, detail=detail)
