"""DAG edits x entry points: one graph-change check before any write, everywhere.

The pipeline ``a -> b -> c, a -> r`` has ``a`` and ``r`` CLOSED (fully finished), ``b`` stopped
at a savepoint with one of its splits finished (partially finished) and ``c`` not started. Each
edit of the DAG is tried through every entry that starts from existing progress, on a real
SQLite store and real checkpoint storage:

* ``continue``: a ``pipeline_key`` continuation (or a retry after the DAG changed): the stored
  graph and progress;
* ``restore-same-store`` / ``restore-fresh-store``: ``restore_from`` the savepoint, into the
  store that took it and into an empty one (another cluster);
* ``dry-run``: ``PipelineControl.plan_restore``, what ``finalckpt restore --dry-run`` and the
  REST/UI restore answer (their Airflow adapters are tested in tests/airflow).

An illegal edit is refused with the stage and the rule, every store row and every checkpoint
file unchanged (an empty store stays empty); a legal one keeps exactly the progress it should.
The store that took the savepoint is SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, select

from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.coordination import Coordinator, StartOutcome
from airflow_finalckpt.core.errors import IllegalGraphChangeError, InvalidRunConfError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
)
from airflow_finalckpt.core.restore import (
    FINISHED_NEEDS_FINISHED_UPSTREAM,
    PARTIAL_NEEDS_FINISHED_UPSTREAM,
    REKEYED_STAGE,
    REMOVED_STAGE,
    StageAction,
)
from airflow_finalckpt.core.run_conf import parse_allow_drop_stages
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "flights.run1"
DAG = "flights"
RUN = "manual__1"


def graph(*stages: tuple[str, tuple[str, ...]] | tuple[str, tuple[str, ...], str]) -> StageGraph:
    return StageGraph.build(Stage(s[0], s[1], s[2] if len(s) > 2 else None) for s in stages)


ORIGINAL = graph(("a", ()), ("b", ("a",)), ("c", ("b",)), ("r", ("a",)))


@dataclass(frozen=True)
class Edit:
    name: str
    graph: StageGraph
    #: (stage, rule) of the refusal, None for a legal edit
    refused: tuple[str, str] | None
    allow_drop: tuple[str, ...] = ()


EDITS = [
    Edit(
        "remove-running-stage",
        graph(("a", ()), ("c", ("a",)), ("r", ("a",))),
        ("b", REMOVED_STAGE),
    ),
    Edit(
        "remove-running-stage-allowed",
        graph(("a", ()), ("c", ("a",)), ("r", ("a",))),
        None,
        allow_drop=("b",),
    ),
    Edit(
        "rename-stage",
        graph(("a", ()), ("b_v2", ("a",), "b"), ("c", ("b_v2",)), ("r", ("a",))),
        ("b", REKEYED_STAGE),
    ),
    Edit(
        "rename-stage-allowed",
        graph(("a", ()), ("b_v2", ("a",), "b"), ("c", ("b_v2",)), ("r", ("a",))),
        None,
        allow_drop=("b",),
    ),
    Edit(
        "add-stage-before-finished",
        graph(("a", ()), ("b", ("a",)), ("c", ("b",)), ("n", ("a",)), ("r", ("n",))),
        ("r", FINISHED_NEEDS_FINISHED_UPSTREAM),
    ),
    Edit(
        "add-stage-before-partial",
        graph(("a", ()), ("n", ("a",)), ("b", ("n",)), ("c", ("b",)), ("r", ("a",))),
        ("b", PARTIAL_NEEDS_FINISHED_UPSTREAM),
    ),
    Edit(
        "add-stage-after",
        graph(("a", ()), ("b", ("a",)), ("c", ("b",)), ("r", ("a",)), ("n", ("r",))),
        None,
    ),
    Edit(
        "remove-finished-leaf",
        graph(("a", ()), ("b", ("a",)), ("c", ("b",))),
        ("r", REMOVED_STAGE),
    ),
    Edit(
        "remove-finished-leaf-allowed",
        graph(("a", ()), ("b", ("a",)), ("c", ("b",))),
        None,
        allow_drop=("r",),
    ),
    Edit(
        "remove-not-started-stage",
        graph(("a", ()), ("b", ("a",)), ("r", ("a",))),
        None,
    ),
    Edit(
        "allow-drop-names-the-wrong-stage",
        graph(("a", ()), ("c", ("a",)), ("r", ("a",))),
        ("b", REMOVED_STAGE),
        allow_drop=("c",),
    ),
]
ENTRIES = ["continue", "restore-same-store", "restore-fresh-store", "dry-run"]


@dataclass
class Pipeline:
    engine: Engine
    storage: CheckpointStorage
    root: Path
    coord: Coordinator
    savepoint: str
    record: CheckpointRecord
    fresh_engine: Engine

    def snapshot(self, engine: Engine | None = None) -> tuple[Any, ...]:
        """Every row of every table, and every file (name, size, mtime) of the storage."""
        engine = engine or self.engine
        meta = MetaData()
        meta.reflect(engine)
        rows = {}
        with engine.connect() as conn:
            for name, table in sorted(meta.tables.items()):
                rows[name] = sorted(repr(tuple(r)) for r in conn.execute(select(table)))
        files = sorted(
            (str(p.relative_to(self.root)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        )
        return rows, files


def _close(coord: Coordinator, stage: str) -> None:
    epoch = coord.start_attempt(stage, total_splits=1).epoch
    coord.finish(
        stage,
        epoch,
        StageSnapshot(
            finished_splits=frozenset({f"{stage}1"}),
            end_of_data=EndOfData(manifest=[f"{stage}/p0"]),
        ),
    )
    checkpoint = coord.closable_checkpoint(stage)
    assert checkpoint is not None
    coord.close(stage, epoch, checkpoint)


@pytest.fixture
def pipeline(store_url: str, tmp_path: Path) -> Iterator[Pipeline]:
    """The pipeline in a migrated store (SQLite and PostgreSQL); the "other cluster" is an
    empty SQLite store."""
    engine = make_engine(store_url)
    fresh = make_engine(f"sqlite:///{tmp_path / 'other-coordination.db'}")
    ensure_schema(fresh)
    root = tmp_path / "checkpoints"
    storage = CheckpointStorage(str(root))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(ORIGINAL)
    coord.link_dag_run(DAG, RUN)
    _close(coord, "a")
    _close(coord, "r")
    b = coord.start_attempt("b", total_splits=3).epoch
    coord.record_batch("b", b, finished_splits=["s1"])
    coord.request_stop(StopMode.SAVEPOINT, "test")
    coord.record_batch("b", b)
    coord.suspend("b", b)
    stop = coord.stop_request()
    assert stop is not None and stop.state is StopState.COMPLETED
    path = coord.checkpoint(stop.savepoint_id or 0).metadata_path
    assert path is not None
    yield Pipeline(engine, storage, root, coord, path, storage.read_checkpoint(path), fresh)
    engine.dispose()
    fresh.dispose()


def _enter(p: Pipeline, entry: str, edit: Edit) -> StartOutcome | dict[str, Any]:
    if entry == "continue":
        return p.coord.start_pipeline(edit.graph, allow_drop_stages=edit.allow_drop)
    if entry == "dry-run":
        check = PipelineControl(p.engine, p.storage).plan_restore(
            DAG, p.savepoint, lambda _dag: edit.graph, allow_drop_stages=edit.allow_drop
        )
        assert check.graph_checked and check.mode == "restore" and check.plan is not None
        return check.plan
    engine = p.engine if entry == "restore-same-store" else p.fresh_engine
    return Coordinator(engine, KEY, writer=p.storage).start_pipeline(
        edit.graph, record=p.record, source=p.savepoint, allow_drop_stages=edit.allow_drop
    )


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("edit", [e for e in EDITS if e.refused], ids=lambda e: e.name)
def test_illegal_edit_is_refused_before_any_write(
    pipeline: Pipeline, edit: Edit, entry: str
) -> None:
    assert edit.refused is not None
    stage, rule = edit.refused
    before = pipeline.snapshot()
    fresh_before = pipeline.snapshot(pipeline.fresh_engine)
    with pytest.raises(IllegalGraphChangeError) as info:
        _enter(pipeline, entry, edit)
    assert (info.value.stage_id, info.value.rule) == (stage, rule)
    assert f"stage {stage!r} violates restore rule {rule!r}" in str(info.value)
    assert pipeline.snapshot() == before
    assert pipeline.snapshot(pipeline.fresh_engine) == fresh_before  # not even a pipeline row


@pytest.mark.parametrize("entry", ["continue", "restore-same-store", "restore-fresh-store"])
@pytest.mark.parametrize("edit", [e for e in EDITS if not e.refused], ids=lambda e: e.name)
def test_legal_edit_keeps_the_progress_it_should(
    pipeline: Pipeline, edit: Edit, entry: str
) -> None:
    outcome = _enter(pipeline, entry, edit)
    assert isinstance(outcome, StartOutcome)
    engine = pipeline.fresh_engine if entry == "restore-fresh-store" else pipeline.engine
    views = Coordinator(engine, KEY).stages()
    assert set(views) == set(edit.graph.stage_ids)  # dropped / removed rows are gone
    new = set(edit.graph.stage_ids) - set(ORIGINAL.stage_ids)
    if entry == "continue":
        change = outcome.change
        assert change is not None and outcome.restored is None
        assert set(change.dropped) == set(edit.allow_drop)
        assert set(change.fresh) == new
        expected = {"a": "CLOSED", "r": "CLOSED", "b": "SUSPENDED", "c": "NOT_STARTED"}
    else:
        plan = outcome.restored
        assert plan is not None and outcome.change is None
        assert set(plan.dropped_stages) == set(edit.allow_drop)
        assert set(plan.skipped) == {"a", "r"} & set(edit.graph.stage_ids)
        assert set(plan.fresh) == ({"c"} & set(edit.graph.stage_ids)) | new
        # restored: finished stages wait for a checkpoint to close on, b re-runs its splits
        expected = {"a": "FINISHED", "r": "FINISHED", "b": "NOT_STARTED", "c": "NOT_STARTED"}
    for sid, view in views.items():
        assert view.lifecycle.value == expected.get(sid, StageLifecycle.NOT_STARTED.value), sid
    if "b" in views:  # the partially finished stage keeps its finished split
        assert views["b"].progress.finished_splits == frozenset({"s1"})
    for sid in new | {"b_v2"} & set(views):
        assert views[sid].progress.finished_splits == frozenset()


@pytest.mark.parametrize("edit", [e for e in EDITS if not e.refused], ids=lambda e: e.name)
def test_dry_run_says_exactly_what_the_restore_does(pipeline: Pipeline, edit: Edit) -> None:
    before = pipeline.snapshot()
    doc = _enter(pipeline, "dry-run", edit)
    assert pipeline.snapshot() == before  # a dry run writes nothing
    assert isinstance(doc, dict)
    outcome = _enter(pipeline, "restore-fresh-store", edit)
    assert isinstance(outcome, StartOutcome) and outcome.restored is not None
    plan = outcome.restored
    assert doc["summary"] == plan.describe()
    assert doc["skipped"] == plan.skipped and doc["resumed"] == plan.resumed
    assert doc["fresh"] == plan.fresh and doc["dropped_stages"] == list(plan.dropped_stages)
    by_stage = {s["stage_id"]: s for s in doc["stages"]}
    if "b" in by_stage:
        assert by_stage["b"]["action"] == StageAction.RESUME.value
        assert by_stage["b"]["finished_splits"] == ["s1"]
        assert by_stage["b"]["redo"] == "every split but the 1 finished ones"


def test_unchanged_graph_is_not_rechecked(pipeline: Pipeline) -> None:
    outcome = pipeline.coord.start_pipeline(ORIGINAL)
    assert outcome == StartOutcome()  # same fingerprint: no check, nothing planned


def test_restore_is_applied_once_per_source_then_continues(pipeline: Pipeline) -> None:
    edit = next(e for e in EDITS if e.name == "add-stage-after")
    coord = Coordinator(pipeline.fresh_engine, KEY, writer=pipeline.storage)
    first = coord.start_pipeline(edit.graph, record=pipeline.record, source=pipeline.savepoint)
    assert first.restored is not None
    again = coord.start_pipeline(edit.graph, record=pipeline.record, source=pipeline.savepoint)
    assert again == StartOutcome()  # the run's other tasks: already restored, same graph
    removed = next(e for e in EDITS if e.name == "remove-running-stage")
    before = pipeline.snapshot(pipeline.fresh_engine)
    with pytest.raises(IllegalGraphChangeError) as info:  # a retry after the DAG changed
        coord.start_pipeline(removed.graph, record=pipeline.record, source=pipeline.savepoint)
    assert (info.value.stage_id, info.value.rule) == ("b", REMOVED_STAGE)
    assert "the stored progress of pipeline" in str(info.value)
    assert pipeline.snapshot(pipeline.fresh_engine) == before


@pytest.mark.parametrize("value", [5, [""], ["b", 3], {"b": True}])
def test_malformed_allow_drop_stages_is_refused(value: Any) -> None:
    with pytest.raises(InvalidRunConfError, match="allow_drop_stages must be a list"):
        parse_allow_drop_stages(value)


def test_allow_drop_stages_accepts_a_list_or_one_id() -> None:
    assert parse_allow_drop_stages(None) == ()
    assert parse_allow_drop_stages("b") == ("b",)
    assert parse_allow_drop_stages(["b", " r ", "b"]) == ("b", "r")


def test_dry_run_of_an_already_restored_path_checks_the_stored_progress(
    pipeline: Pipeline,
) -> None:
    """A second run restoring the same path continues the stored progress (the restore is
    applied once per source): the dry run says so and checks what that run will check."""
    after = next(e for e in EDITS if e.name == "add-stage-after")
    pipeline.coord.start_pipeline(after.graph, record=pipeline.record, source=pipeline.savepoint)
    control = PipelineControl(pipeline.engine, pipeline.storage)
    check = control.plan_restore(DAG, pipeline.savepoint, lambda _dag: ORIGINAL)
    assert check.mode == "continue" and check.plan is not None
    assert check.plan["forgotten"] == ["n"] and check.plan["dropped_stages"] == []
    renamed = next(e for e in EDITS if e.name == "rename-stage")
    before = pipeline.snapshot()
    with pytest.raises(IllegalGraphChangeError) as info:
        control.plan_restore(DAG, pipeline.savepoint, lambda _dag: renamed.graph)
    assert (info.value.stage_id, info.value.rule) == ("b", REKEYED_STAGE)
    assert pipeline.snapshot() == before
