"""The cause of an aborted checkpoint (CheckpointFailureReason) is persisted and shown: in the
coordinator's CheckpointInfo, `finalckpt checkpoints list` (table and JSON) and the control
service's checkpoint list behind REST, and the UI's checkpoint table."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StageSnapshot, TriggerReason
from airflow_finalckpt.plugins.api import render
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

KEY = "failure-demo"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_every_abort_cause_is_stored_and_shown(store_url: str, tmp_path: Path) -> None:
    engine = make_engine(store_url)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    clock = Clock()
    coord = Coordinator(engine, KEY, writer=storage, clock=clock)
    coord.register(StageGraph.from_edges(["a", "b"], []), CoordinatorOptions(3, 10.0))
    epochs = {sid: coord.start_attempt(sid).epoch for sid in ("a", "b")}

    expired = coord.trigger(TriggerReason.MANUAL)
    clock.now += 11
    declined = coord.trigger(TriggerReason.MANUAL)  # expires the first
    assert expired is not None and declined is not None
    coord.decline(declined, "b", epochs["b"], "executor lost")
    manual = coord.trigger(TriggerReason.MANUAL)
    assert manual is not None and coord.abort(manual, "operator said so")
    subsumed = coord.trigger(TriggerReason.MANUAL)
    completes = coord.trigger(TriggerReason.MANUAL)
    assert subsumed is not None and completes is not None
    for sid in ("a", "b"):
        coord.acknowledge(completes, sid, epochs[sid], StageSnapshot())
    expected = {
        expired: CheckpointFailureReason.EXPIRED,
        declined: CheckpointFailureReason.DECLINED,
        manual: CheckpointFailureReason.MANUAL,
        subsumed: CheckpointFailureReason.SUBSUMED,
        completes: None,
    }
    assert {c.checkpoint_id: c.failure_kind for c in coord.checkpoints()} == expected

    runner = CliRunner()
    args = ["checkpoints", "list", "--pipeline", KEY, "--store-url", store_url]
    result = runner.invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    shown = {doc["checkpoint_id"]: doc["failure_kind"] for doc in json.loads(result.output)}
    assert shown == {cid: None if k is None else k.value for cid, k in expected.items()}
    table = runner.invoke(main, args, env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "declined: declined by stage 'b'" in table.output

    detail = PipelineControl(engine, storage).describe_pipeline(KEY)
    assert {c.checkpoint_id: c.failure_kind for c in detail.checkpoints} == expected
    assert detail.checkpoints[-1].model_dump(mode="json")["failure_kind"] == "expired"
    html = render.pipeline_live(detail, "dag", "run", can_edit=False)
    assert '<span class="failure-kind">subsumed</span>: subsumed by checkpoint' in html
    engine.dispose()
