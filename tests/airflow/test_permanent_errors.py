"""Permanent errors fail the stage task on its first try whatever its ``retries``; transient ones
keep Airflow's retries. Real ``dag.test()`` runs with ``retries=3`` and no retry delay."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.core.errors import (
    ConfigurationError,
    DrainedSavepointError,
    IllegalGraphChangeError,
    InvalidGraphError,
    MetadataError,
    StageDefinitionError,
    StaleEpochError,
    StorageError,
    UnsafePathError,
    is_permanent,
)
from airflow_finalckpt.hooks import finalckpt as hook_module

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


def test_classification() -> None:
    permanent = [
        UnsafePathError("x"),
        IllegalGraphChangeError("b", "removed-stage", "gone"),
        DrainedSavepointError("x"),
        InvalidGraphError("cycle"),
        StageDefinitionError("no transform"),
        MetadataError("corrupt"),
    ]
    transient = [
        StorageError("I/O"),
        ConfigurationError("unreachable"),
        StaleEpochError("s", 1, 2),
        RuntimeError("spark died"),
        OSError("disk"),
    ]
    assert [is_permanent(e) for e in permanent] == [True] * len(permanent)
    assert [is_permanent(e) for e in transient] == [False] * len(transient)


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
