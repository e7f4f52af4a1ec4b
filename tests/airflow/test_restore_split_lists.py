"""Split-list changes in the dry run of a continuation (``finalckpt restore --dry-run`` and the
REST restore's ``dry_run``), with real serialized DAGs: the dry run applies the split-list rules
the stage tasks apply (``core.split_list``) to the stages whose DAG declares a fixed list.

The pipeline ``a -> b`` has ``a`` CLOSED with its one split ``a1`` and ``b`` stopped at a
savepoint with ``s1`` of ``s1, s2, s3`` finished, both with their split lists' fingerprints;
the store was restored from that savepoint, so a restore of it continues the stored progress.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_finalckpt.control import PipelineControl, dag_declared_splits
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import SplitListChangedError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot, StopMode
from airflow_finalckpt.core.split_list import (
    FINISHED_SPLIT_LIST_RULE,
    LOST_SPLITS_RULE,
    LostFinishedSplitsError,
    split_list_fingerprint,
)
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.airflow.test_restore_entrypoints import Env, serialize

GRAPH = StageGraph.build([Stage("a", ()), Stage("b", ("a",)), Stage("c", ("a",))])
B_SPLITS = ["s1", "s2", "s3"]
C_SPLITS = ["c1", "c2"]


@pytest.fixture
def env(airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """``a`` closed, ``b`` at a savepoint with ``s1`` finished, ``c`` not started; the store
    restored from that savepoint; then ``b`` finished and closed, ``c`` started with ``c1``
    finished (each attempt records its declared list's fingerprint, as the runner does)."""
    url = f"sqlite:///{tmp_path / 'coordination.db'}"
    root = tmp_path / "checkpoints"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(root))
    hook_module.dispose_engines()
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(root))
    key = f"flights.{uuid.uuid4().hex[:8]}"
    coord = Coordinator(engine, key, writer=storage)
    coord.register(GRAPH)
    a = coord.start_attempt("a", total_splits=1).epoch
    done = StageSnapshot(finished_splits=frozenset({"a1"}), end_of_data=EndOfData(manifest=[]))
    coord.finish("a", a, done)
    coord.close("a", a, coord.closable_checkpoint("a") or 0)
    b = _start(coord, "b", B_SPLITS)
    coord.record_batch("b", b, finished_splits=["s1"])
    coord.request_stop(StopMode.SAVEPOINT, "test")
    coord.record_batch("b", b)
    coord.suspend("b", b)
    stop = coord.stop_request()
    assert stop is not None and stop.savepoint_id is not None
    path = coord.checkpoint(stop.savepoint_id).metadata_path
    assert path is not None
    record = storage.read_checkpoint(path)
    assert coord.start_pipeline(GRAPH, record=record, source=path).restored is not None
    b = _start(coord, "b", B_SPLITS)  # the restored run: b finishes, c starts
    coord.record_batch("b", b, finished_splits=["s2", "s3"])
    coord.finish("b", b, StageSnapshot(end_of_data=EndOfData(manifest=[])))
    coord.close("b", b, coord.closable_checkpoint("b") or 0)
    c = _start(coord, "c", C_SPLITS)
    coord.record_batch("c", c, finished_splits=["c1"])
    yield Env(engine, storage, root, key, path)
    engine.dispose()
    hook_module.dispose_engines()


def _start(coord: Coordinator, stage_id: str, splits: list[str]) -> int:
    fingerprint = split_list_fingerprint(splits)
    view = coord.start_attempt(stage_id, total_splits=len(splits), split_list_sha256=fingerprint)
    return view.epoch


def dag_with(dag_id: str, b_splits: Any, c_splits: Any, *, allow: bool = False) -> Any:
    """The pipeline's DAG with these split lists, serialized as the DAG processor does."""
    from airflow.sdk import DAG

    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

    def noop(ctx: Any) -> None:
        return None

    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["a1"])
        b = FinalCheckpointStageOperator(task_id="b", transform=noop, splits=b_splits)
        c = FinalCheckpointStageOperator(
            task_id="c", transform=noop, splits=c_splits, allow_split_list_change=allow
        )
        a >> [b, c]
    serialize(dag)
    return dag


def _dry_run(env: Env, dag_id: str) -> Any:
    from airflow_finalckpt.plugins.api.dags import dag_graph, dag_splits

    control = PipelineControl(env.engine, env.storage)
    return control.plan_restore(dag_id, env.savepoint, dag_graph, load_splits=dag_splits)


def _new_id() -> str:
    return f"splits_{uuid.uuid4().hex[:8]}"


def test_the_serialized_dag_keeps_fixed_split_lists(env: Env) -> None:
    from airflow_finalckpt.plugins.api.dags import dag_splits

    dag = dag_with(_new_id(), B_SPLITS, lambda: C_SPLITS, allow=True)
    declared = dag_splits(dag.dag_id)
    assert declared == dag_declared_splits(dag.tasks)
    assert declared["b"].splits == tuple(B_SPLITS) and not declared["b"].allow_change
    assert declared["c"].splits is None and declared["c"].allow_change  # a callable


def test_the_dry_run_shows_unchanged_and_run_time_split_lists(env: Env) -> None:
    same = _dry_run(env, dag_with(_new_id(), B_SPLITS, C_SPLITS).dag_id)
    assert same.mode == "continue"
    assert same.plan["split_lists"] == {
        # restored from the savepoint as fully finished: metadata keeps no fingerprint for it
        "a": "split list: not recorded (progress from before fingerprints were kept)",
        "b": "split list: unchanged",
        "c": "split list: unchanged",
    }
    later = _dry_run(env, dag_with(_new_id(), B_SPLITS, lambda: C_SPLITS).dag_id)
    note = later.plan["split_lists"]["c"]
    assert note.startswith("split list: declared when the task runs")
    assert FINISHED_SPLIT_LIST_RULE in note and LOST_SPLITS_RULE in note
    assert "  c: split list: declared when the task runs" in "\n".join(later.lines())


def test_a_finished_stage_with_another_split_list_is_refused_by_the_dry_run(env: Env) -> None:
    before = env.snapshot()
    with pytest.raises(SplitListChangedError, match=f"rule {FINISHED_SPLIT_LIST_RULE}"):
        _dry_run(env, dag_with(_new_id(), [*B_SPLITS, "s4"], C_SPLITS).dag_id)  # a late file
    assert env.snapshot() == before


def test_a_started_stage_losing_finished_splits_is_refused_unless_allowed(env: Env) -> None:
    before = env.snapshot()
    with pytest.raises(LostFinishedSplitsError, match=f"rule '{LOST_SPLITS_RULE}'"):
        _dry_run(env, dag_with(_new_id(), B_SPLITS, ["c2", "c3"]).dag_id)
    allowed = _dry_run(env, dag_with(_new_id(), B_SPLITS, ["c2", "c3"], allow=True).dag_id)
    assert allowed.plan["split_lists"]["c"] == (
        "stage c: split list changed since its last attempt (its fingerprint differs): 1 "
        "finished split(s) are no longer declared (their output stays committed, nothing is "
        "undone) and 2 declared split(s) are not finished (they will be processed)"
    )
    assert env.snapshot() == before


def test_the_rest_dry_run_answers_a_split_list_refusal_with_409(env: Env) -> None:
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from airflow_finalckpt.plugins.api import create_app

    dag = dag_with(_new_id(), [*B_SPLITS, "s4"], C_SPLITS)
    token = create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ann", role="ADMIN"))
    headers = {"Authorization": f"Bearer {token}"}
    control = PipelineControl(env.engine, env.storage)
    parent = FastAPI()
    parent.mount("/finalckpt", create_app(lambda: control))
    body = {"savepoint_path": env.savepoint, "dry_run": True}
    before = env.snapshot()
    with TestClient(parent, base_url="http://airflow.test") as client:
        refused = client.post(
            f"/finalckpt/api/dags/{dag.dag_id}/restore", json=body, headers=headers
        )
        stages = client.get(f"/finalckpt/api/dags/{dag.dag_id}/stages", headers=headers)
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert "stage 'b' is finished but now declares another list of 4 splits" in detail
    assert f"(rule {FINISHED_SPLIT_LIST_RULE})" in detail
    assert env.snapshot() == before
    assert stages.status_code == 200, stages.text
    assert {s["stage_id"]: s["splits"] for s in stages.json()["stages"]} == {
        "a": ["a1"],
        "b": [*B_SPLITS, "s4"],
        "c": C_SPLITS,
    }
