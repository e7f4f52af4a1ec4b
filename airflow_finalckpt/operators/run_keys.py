"""Which pipeline a stage task works on, as the operator applies it: a key named in the DAG
run conf (a continuation on purpose), the operator's ``pipeline_key`` argument, a savepoint's
pipeline (``restore_from``), else the DAG run's own default key, for which the store's record
of the run id decides (``core.run_instance``): the same DAG run keeps its pipeline, a run
deleted and created again under the same id gets a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from airflow_finalckpt.core.pipeline_keys import KeyOrigin, default_pipeline_key
from airflow_finalckpt.core.run_instance import (
    KeyChoice,
    RunInstance,
    RunLink,
    choose_default_key,
    is_recreated,
)
from airflow_finalckpt.store.repository import dag_run_link


@dataclass(frozen=True)
class ResolvedKey:
    """A stage attempt's pipeline key, where it came from, the DAG run instance the task
    runs in (None: the context has no DAG run) and, for a default key, how it was chosen.
    """

    pipeline_key: str
    origin: KeyOrigin
    instance: RunInstance | None = None
    choice: KeyChoice | None = None


def run_instance_of(context: Mapping[str, Any]) -> RunInstance | None:
    """The Task SDK's DagRun of the context as a ``RunInstance`` (None without one)."""
    dag_run = context.get("dag_run")
    if dag_run is None:
        return None
    run_after = getattr(dag_run, "run_after", None)
    start_date = getattr(dag_run, "start_date", None)
    if run_after is None and start_date is None:
        return None
    return RunInstance.of(
        run_after=run_after,
        start_date=start_date,
        clear_number=getattr(dag_run, "clear_number", 0),
    )


def resolve_key(
    context: Mapping[str, Any],
    dag_id: str,
    operator_key: str | None,
    restored_key: str | None,
    engine: Callable[[], Engine],
) -> ResolvedKey:
    """The pipeline key of this attempt (module docstring), with the store's record of the
    run id (``engine``): a default key follows it, a named key moves it if it is a deleted run's.
    """
    instance = run_instance_of(context)
    dag_run = context.get("dag_run")
    conf = (getattr(dag_run, "conf", None) or {}) if dag_run is not None else {}
    explicit = [
        (restored_key, KeyOrigin.RESTORE),
        (conf.get("pipeline_key"), KeyOrigin.CONF),
        (operator_key, KeyOrigin.OPERATOR),
    ]
    run_id = str(context["run_id"])
    link = dag_run_link(engine(), dag_id, run_id)
    for key, origin in explicit:
        if key:
            return ResolvedKey(str(key), origin, instance, moved_link(link, str(key), instance))
    partition = context.get("partition_key")
    partition_key = None if partition is None else str(partition)
    choice = choose_default_key(
        link,
        instance,
        lambda generation: default_pipeline_key(dag_id, run_id, generation, partition_key),
    )
    return ResolvedKey(choice.pipeline_key, KeyOrigin.DEFAULT, instance, choice)


def moved_link(link: RunLink | None, key: str, instance: RunInstance | None) -> KeyChoice | None:
    """A run naming its key whose id is linked to another pipeline by a run deleted since
    (re-created with another conf): its link moves to the named key. None: linked as is.
    """
    if link is None or link.pipeline_key == key or not is_recreated(link.instance, instance):
        return None
    return KeyChoice(key, link.generation, replaces=link.pipeline_key)
