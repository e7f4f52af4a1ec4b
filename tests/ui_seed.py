"""Pipelines seeded straight into a coordination store for the Pipelines list's tests (the API
test and the browser test): many runs of two DAGs in every list state, through the coordinator
where it is quick and by writing stage rows where a real run would take minutes (finished)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import Engine, update

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import StopMode
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import schema as t

#: the states the seed cycles through, in order (run i gets STATES[i % len(STATES)])
STATES = ("running", "finished", "not_started", "draining", "stopping")


@dataclass(frozen=True)
class Seeded:
    """What was seeded: run ids per DAG, and how many runs each state got."""

    runs: dict[str, list[str]]
    states: Counter[str]


def seed_pipelines(
    engine: Engine, storage: CheckpointStorage, count: int, dags: tuple[str, ...], prefix: str
) -> Seeded:
    """``count`` one-stage pipelines ``<prefix>.<i>``, DAG run ``<prefix>__<i:04d>`` of
    ``dags[i % len(dags)]``, in state ``STATES[i % len(STATES)]``.
    """
    graph = StageGraph.build([Stage("only", ())])
    runs: dict[str, list[str]] = {d: [] for d in dags}
    states: Counter[str] = Counter()
    for i in range(count):
        dag_id, run_id, state = dags[i % len(dags)], f"{prefix}__{i:04d}", STATES[i % len(STATES)]
        coordinator = Coordinator(engine, f"{prefix}.{i:04d}", writer=storage)
        coordinator.register(graph)
        coordinator.link_dag_run(dag_id, run_id)
        if state != "not_started":
            coordinator.start_attempt("only", total_splits=2)
        if state == "finished":
            with engine.begin() as conn:
                conn.execute(
                    update(t.stages)
                    .where(t.stages.c.pipeline_key == coordinator.pipeline_key)
                    .values(lifecycle="CLOSED")
                )
        elif state == "draining":
            coordinator.request_stop(StopMode.DRAIN, requested_by="seed")
        elif state == "stopping":
            coordinator.request_stop(StopMode.SAVEPOINT, requested_by="seed")
        runs[dag_id].append(run_id)
        states[state] += 1
    return Seeded(runs, states)
