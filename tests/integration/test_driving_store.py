"""One DAG run drives a pipeline at a time, through ``Coordinator.start_pipeline`` on a real
store (SQLite and PostgreSQL): a continuation started while the first run's attempt is alive
is refused (nothing written), takes over with ``take_over``, or when the attempt is gone; the
run it took the pipeline from is refused for good; no epoch is taken from the driver.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import PipelineDrivenError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.store.engine import make_engine

KEY = "driven"
GRAPH = StageGraph.from_edges(["a"], [])
RUN1, RUN2 = ("dag", "run1"), ("dag", "run2")


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def first_run(engine: Engine) -> tuple[Coordinator, Clock, int]:
    clock = Clock()
    coord = Coordinator(engine, KEY, clock=clock)
    coord.start_pipeline(GRAPH, driver=RUN1)
    coord.link_dag_run(*RUN1)
    epoch = coord.start_attempt("a").epoch
    assert coord.renew_lease("a", epoch, 60.0)
    assert coord.driver() == RUN1
    return coord, clock, epoch


def test_a_continuation_is_refused_while_the_driver_runs(engine: Engine) -> None:
    coord, _, epoch = first_run(engine)
    with pytest.raises(PipelineDrivenError, match="driven by DAG run 'run1' of DAG 'dag'"):
        coord.start_pipeline(GRAPH, driver=RUN2)
    assert coord.driver() == RUN1
    assert coord.stage("a").epoch == epoch  # nothing taken from the driver


def test_take_over_then_the_old_run_is_refused_for_good(engine: Engine) -> None:
    coord, clock, _ = first_run(engine)
    clock.now += 1  # the continuation joins later
    coord.start_pipeline(GRAPH, driver=RUN2, take_over=True)
    coord.link_dag_run(*RUN2)
    assert coord.driver() == RUN2
    coord.start_attempt("a")  # the new run's attempt fences the old one
    clock.now += 3600  # nothing of run2 alive any more: run1 still may not come back
    with pytest.raises(PipelineDrivenError, match="was taken over by DAG run 'run2'"):
        coord.start_pipeline(GRAPH, driver=RUN1)
    assert coord.driver() == RUN2


def test_a_continuation_takes_over_once_the_driver_attempt_is_gone(engine: Engine) -> None:
    coord, _, epoch = first_run(engine)
    coord.release_attempt("a", epoch)  # the first run's attempt failed
    coord.start_pipeline(GRAPH, driver=RUN2)
    assert coord.driver() == RUN2
