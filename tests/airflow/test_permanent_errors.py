"""Permanent errors fail the stage task on its first try whatever its ``retries``; transient ones
keep Airflow's retries. Real ``dag.test()`` runs with ``retries=3`` and no retry delay."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.core.errors import (
    PERMANENT_ERRORS,
    ConfigurationError,
    DrainedSavepointError,
    ForeignCheckpointError,
    IllegalGraphChangeError,
    InvalidGraphError,
    InvalidRunConfError,
    InvalidStageArgumentError,
    MetadataError,
    PipelineDrivenError,
    RecomputeRefusedError,
    SourceRangeBusyError,
    SourceRefusedError,
    SplitListChangedError,
    StageDefinitionError,
    StaleEpochError,
    StopRequestError,
    StorageError,
    UnsafePathError,
    UnsupportedMetadataVersionError,
    is_permanent,
)
from airflow_finalckpt.core.plan_check import BatchingRefusedError
from airflow_finalckpt.core.split_list import LostFinishedSplitsError
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.sinks.base import InvalidIdentifierError
from airflow_finalckpt.spark.launch import UnsupportedDeployModeError
from airflow_finalckpt.store.connect import StoreUnreachableError

ONE_STAGE_DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator


def noop(ctx):
    return None


def splits():
    return SPLITS


with DAG(
    DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    default_args={"retries": 3, "retry_delay": timedelta(0)},
) as dag:
    FinalCheckpointStageOperator(task_id="ingest", transform=noop, splits=splits)
"""


#: One of each permanent error class (PERMANENT_ERRORS), and subclasses raised in their place.
PERMANENT = [
    InvalidGraphError("cycle"),
    IllegalGraphChangeError("b", "removed-stage", "gone"),
    StageDefinitionError("no transform"),
    InvalidRunConfError("allow_drop_stages must be a list"),
    UnsafePathError("x"),
    MetadataError("corrupt"),
    ForeignCheckpointError("another pipeline's savepoint"),
    DrainedSavepointError("x"),
    RecomputeRefusedError("the sink declares no slice"),
    PipelineDrivenError("driven by DAG run run-1"),
    SplitListChangedError("finished with another split list"),
    SourceRefusedError("an overwrite snapshot"),
]
PERMANENT_SUBCLASSES = [
    InvalidStageArgumentError("batch_size=0"),
    LostFinishedSplitsError("finished splits no longer declared"),
    BatchingRefusedError("not split-local"),
    UnsupportedMetadataVersionError("version 99"),
    InvalidIdentifierError("a/b"),
    UnsupportedDeployModeError("cluster mode on local[*]"),
]
#: Errors a retry may fix: they keep Airflow's retries.
TRANSIENT = [
    StorageError("I/O"),
    ConfigurationError("unreachable"),
    StoreUnreachableError("store down", url="postgresql://db/x", attempts=3),
    StaleEpochError("s", 1, 2),
    StopRequestError("a stop is in progress"),
    SourceRangeBusyError("another run holds the range"),
    RuntimeError("spark died"),
    OSError("disk"),
]


def test_every_permanent_error_class_is_classified_permanent() -> None:
    assert [type(e) for e in PERMANENT] == list(PERMANENT_ERRORS)  # a new class joins the list
    classified = {type(e).__name__: is_permanent(e) for e in PERMANENT + PERMANENT_SUBCLASSES}
    assert classified == dict.fromkeys(classified, True)


def test_transient_errors_keep_their_retries() -> None:
    classified = {type(e).__name__: is_permanent(e) for e in TRANSIENT}
    assert classified == dict.fromkeys(classified, False)


@pytest.fixture
def settings(airflow_home: Any, local_store: Path) -> Path:
    return local_store


def tries(dag_run: Any, task_id: str) -> tuple[str, int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id,
                TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id,
            )
        ).one()
        return str(ti.state), int(ti.try_number)


def test_garbage_restore_from_fails_once_and_writes_nothing(
    settings: Path, write_dag: Callable[..., Any]
) -> None:
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"perm_{uuid.uuid4().hex[:8]}", SPLITS=["a", "b"])
    dag_run = dag.test(run_conf={"restore_from": "../../garbage"})
    assert str(dag_run.state).endswith("failed")
    assert tries(dag_run, "ingest") == ("failed", 1)
    assert not (settings / "checkpoints").exists() or not any((settings / "checkpoints").iterdir())


def test_bad_stage_definition_fails_once(settings: Path, write_dag: Callable[..., Any]) -> None:
    # a splits callable returning one split twice: a DAG bug no retry can fix (the wrong
    # arguments the parser can see are the DAG's import error: test_parse_time_errors.py)
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"perm_{uuid.uuid4().hex[:8]}", SPLITS=["a", "a"])
    dag_run = dag.test()
    assert tries(dag_run, "ingest") == ("failed", 1)


def test_unreachable_store_is_transient_and_retried(
    settings: Path, write_dag: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "postgresql+psycopg://x@127.0.0.1:1/db")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_RETRIES", "0")
    hook_module.dispose_engines()
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"perm_{uuid.uuid4().hex[:8]}", SPLITS=["a", "b"])
    dag_run = dag.test()
    assert tries(dag_run, "ingest") == ("failed", 4)  # 1 try + 3 retries
