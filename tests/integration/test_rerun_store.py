"""The clear-or-retry record in a real store (SQLite / PostgreSQL) and `finalckpt reset`.

A stage is driven to CLOSED through the coordinator's own transitions; its publication is
recorded as the operator does when its try returns; a reset (Python, CLI) forgets the stage,
the stages downstream of it and the record, in one transition.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData, StageLifecycle, StageSnapshot, StopMode
from airflow_finalckpt.core.rerun import AttemptKind, Publication, TaskTry, attempt_kind
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

DAG = "daily"
RUN = "scheduled__2013-01-01"
KEY = "daily.scheduled__2013-01-01"


@dataclass
class Env:
    url: str
    coord: Coordinator
    runner: CliRunner

    def invoke(self, *args: str) -> tuple[int, str, str]:
        result = self.runner.invoke(main, [*args, "--direct-store", "--store-url", self.url])
        return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def env(store_url: str, tmp_path: Path, isolated_settings_env: Path) -> Iterator[Env]:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    engine = make_engine(store_url)
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(
        StageGraph.from_edges(
            ["read_day", "aggregate", "report"],
            [("read_day", "aggregate"), ("aggregate", "report")],
        )
    )
    coord.link_dag_run(DAG, RUN)
    runner = CliRunner(env={"AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints")})
    yield Env(store_url, coord, runner)
    engine.dispose()


def close_stage(coord: Coordinator, stage: str) -> None:
    """Run, finish and close a stage the way its runtime does."""
    epoch = coord.start_attempt(stage, total_splits=1).epoch
    coord.record_batch(stage, epoch, finished_splits=["s1"])
    outcome = coord.finish(
        stage, epoch, StageSnapshot(end_of_data=EndOfData(manifest=[f"data/{stage}/p0"]))
    )
    latest = coord.latest_completed()
    assert latest is not None and latest.checkpoint_id >= outcome.threshold
    coord.close(stage, epoch, latest.checkpoint_id)
    assert coord.stage(stage).lifecycle is StageLifecycle.CLOSED


def test_publication_is_recorded_only_for_a_closed_stage_and_drives_the_rule(env: Env) -> None:
    coord = env.coord
    first = TaskTry(DAG, RUN, "read_day", 1)
    assert coord.publish("read_day", first) is Publication.NOT_CLOSED  # nothing recorded
    assert coord.published_by("read_day") is None

    close_stage(coord, "read_day")
    assert coord.publish("read_day", first) is Publication.FIRST
    assert coord.published_by("read_day") == first
    # a later return of the same close (a re-entry, a continuation) is recorded, not news
    again = TaskTry(DAG, "manual__continuation", "read_day", 1)
    assert coord.publish("read_day", again) is Publication.AGAIN
    assert coord.published_by("read_day") == again
    assert coord.publish("read_day", first) is Publication.AGAIN

    view = coord.stage("read_day")
    cleared = TaskTry(DAG, RUN, "read_day", 2)
    assert attempt_kind(view.lifecycle, coord.published_by("read_day"), cleared) is (
        AttemptKind.RECOMPUTE
    )


def test_of_two_dag_runs_returning_one_close_at_once_exactly_one_announces(env: Env) -> None:
    """A take-over: the first DAG run's try closes the stage after the second run joined, and
    both tries return it at once; one Asset event per commit means one FIRST (CI saw both runs
    announce before the record was a compare-and-set)."""
    close_stage(env.coord, "read_day")
    engines = [make_engine(env.url) for _ in range(8)]
    start = threading.Barrier(len(engines))
    outcomes: list[Publication] = []

    def publish(n: int) -> None:
        coord = Coordinator(engines[n], KEY)
        start.wait()
        outcomes.append(coord.publish("read_day", TaskTry(DAG, f"run-{n}", "read_day", 1)))

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.dispose()
    assert sorted(outcomes) == sorted([Publication.FIRST] + [Publication.AGAIN] * 7), outcomes
    # a reset forgets the record: the recompute's close is news again
    env.coord.reset_stages(["read_day"])
    close_stage(env.coord, "read_day")
    assert env.coord.publish("read_day", TaskTry(DAG, RUN, "read_day", 2)) is Publication.FIRST


def test_reset_forgets_progress_and_publication_of_the_stage_and_downstream(env: Env) -> None:
    coord = env.coord
    for stage in ("read_day", "aggregate", "report"):
        close_stage(coord, stage)
        coord.publish(stage, TaskTry(DAG, RUN, stage, 1))
    epochs = {sid: v.epoch for sid, v in coord.stages().items()}

    views = coord.reset_stages(["aggregate", "report"])

    assert set(views) == {"aggregate", "report"}
    for sid in ("aggregate", "report"):
        assert views[sid].lifecycle is StageLifecycle.NOT_STARTED
        assert views[sid].epoch == epochs[sid] + 1
        assert views[sid].progress.finished_splits == frozenset()
        assert coord.published_by(sid) is None
    assert coord.stage("read_day").lifecycle is StageLifecycle.CLOSED
    assert coord.published_by("read_day") == TaskTry(DAG, RUN, "read_day", 1)
    # a recompute that closes again and crashes before returning is re-published, not redone
    close_stage(coord, "aggregate")
    view = coord.stage("aggregate")
    assert attempt_kind(view.lifecycle, None, TaskTry(DAG, RUN, "aggregate", 3)) is (
        AttemptKind.REPUBLISH
    )


def test_cli_reset_resets_downstream_and_prints_one_json_document(env: Env) -> None:
    for stage in ("read_day", "aggregate", "report"):
        close_stage(env.coord, stage)

    code, out, err = env.invoke("reset", DAG, RUN, "--stage", "aggregate", "--json")

    assert code == 0, err
    doc = json.loads(out)
    assert doc["reset_stages"] == ["aggregate", "report"]
    assert doc["task_ids"] == ["aggregate", "report"]
    assert doc["pipeline_key"] == KEY
    lifecycles = {sid: v.lifecycle for sid, v in env.coord.stages().items()}
    assert lifecycles == {
        "read_day": StageLifecycle.CLOSED,
        "aggregate": StageLifecycle.NOT_STARTED,
        "report": StageLifecycle.NOT_STARTED,
    }
    code, out, err = env.invoke("reset", DAG, RUN, "--stage", "report")
    assert code == 0, err
    assert "reset stages report" in out and "next: clear tasks report" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((DAG, RUN, "--stage", "nope"), "has no stage 'nope'; its stages: read_day, aggregate"),
        ((DAG, "manual__unknown", "--stage", "aggregate"), "no pipeline run is known"),
    ],
)
def test_cli_reset_refuses_with_one_error_line_and_changes_nothing(
    env: Env, args: tuple[str, ...], message: str
) -> None:
    close_stage(env.coord, "read_day")
    before = env.coord.stages()

    code, out, err = env.invoke("reset", *args, "--json")

    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert env.coord.stages() == before


def test_reset_is_refused_while_a_savepoint_is_in_progress(env: Env) -> None:
    env.coord.start_attempt("read_day", total_splits=2)
    env.coord.request_stop(StopMode.SAVEPOINT, requested_by="op")
    before = env.coord.stages()

    code, _, err = env.invoke("reset", DAG, RUN, "--stage", "read_day")

    assert code == 2 and "is stopping with a savepoint" in err
    assert env.coord.stages() == before


class _Ti:
    def __init__(self, task_id: str, try_number: int) -> None:
        self.dag_id, self.task_id, self.try_number = DAG, task_id, try_number


class _Sink:
    def __init__(self, sink_id: str, replace_slice: dict[str, str] | None) -> None:
        self.sink_id, self.replace_slice = sink_id, replace_slice


def _context(task_id: str, try_number: int) -> dict[str, object]:
    return {"ti": _Ti(task_id, try_number), "run_id": RUN}


def test_the_operator_side_recomputes_with_slices_and_refuses_without(env: Env) -> None:
    import logging

    from airflow_finalckpt.core.errors import RecomputeRefusedError, is_permanent
    from airflow_finalckpt.operators.rerun import prepare_attempt, record_publication

    log = logging.getLogger("test")
    coord = env.coord
    close_stage(coord, "read_day")
    record_publication(coord, "read_day", _context("read_day", 1))
    closed = coord.stage("read_day")

    # without a declared slice: refused, permanent, nothing changed
    with pytest.raises(RecomputeRefusedError) as refused:
        prepare_attempt(coord, "read_day", [_Sink("out", None)], _context("read_day", 2), log)
    assert is_permanent(refused.value) and "['out']" in str(refused.value)
    assert coord.stage("read_day") == closed
    # a retry of the very try that published (a re-entry): re-published, untouched
    same = prepare_attempt(coord, "read_day", [_Sink("out", None)], _context("read_day", 1), log)
    assert same is AttemptKind.REPUBLISH and coord.stage("read_day") == closed

    # with a declared slice: reset, it recomputes from scratch
    sliced = [_Sink("out", {"event_date": "2013-01-01"})]
    kind = prepare_attempt(coord, "read_day", sliced, _context("read_day", 2), log)
    assert kind is AttemptKind.RECOMPUTE
    view = coord.stage("read_day")
    assert view.lifecycle is StageLifecycle.NOT_STARTED and view.epoch == closed.epoch + 1
    assert coord.published_by("read_day") is None
    # no task instance in the context (a hand-built one): run as before
    assert prepare_attempt(coord, "aggregate", [], {}, log) is AttemptKind.RUN
