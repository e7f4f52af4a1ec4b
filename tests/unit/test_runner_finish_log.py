"""The runner's finish line says whether the finish triggered the eager final checkpoint or
joined one already pending (coalescing), through the real runtime on SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StateHandle
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "finish-log"


class Logic:
    """Processes every split, keeps nothing."""

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


class Recorder:
    """Keeps the info lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(str(event) % args)

    def finished_line(self) -> str:
        [line] = [x for x in self.lines if " finished (" in x]
        return line


def test_the_finish_line_says_triggered_then_joined(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, KEY, writer=CheckpointStorage(str(tmp_path)))
    coord.register(StageGraph.from_edges(["busy", "x", "y"], []))
    coord.start_attempt("busy")  # keeps the eager checkpoint pending (it waits for busy)
    logs = {}
    for sid in ("x", "y"):
        logs[sid] = Recorder()
        spec = StageSpec(pipeline_key=KEY, stage_id=sid, splits=(f"{sid}0",), batch_size=1)
        StageRunner(coord, spec, Logic(), log=logs[sid]).run()
    eager = coord.stage("x").finish_threshold
    assert eager is not None and coord.stage("y").finish_threshold == eager
    assert logs["x"].finished_line().endswith(f"(eager checkpoint {eager} triggered)")
    assert logs["y"].finished_line().endswith(f"(eager checkpoint {eager} joined)")
    engine.dispose()
