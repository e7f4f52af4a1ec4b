"""A stop with drain cuts fact sources, not dimensions (issue 25): a source whose output its
downstream stages read whole (``on_drain="complete"``, the default of a source no downstream
stage takes as its primary input) reads all its input; a fact source (``"stop"``) stops taking
input. Real runner and coordinator on SQLite; the default is resolved from a real DAG.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StateHandle, StopMode
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "drain-dimensions"


class Logic:
    """Runs ``on_first`` before its first batch; remembers the splits it processed."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.on_first = on_first
        self.processed: list[str] = []
        self.drained: bool | None = None

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        if self.on_first is not None:
            self.on_first()
            self.on_first = None
        self.processed.extend(batch.splits)
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        self.drained = drain
        return BatchOutput()


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(str(event) % args)


@pytest.mark.parametrize(
    ("on_drain", "read", "drained"),
    [("complete", ["w0", "w1", "w2"], False), ("stop", ["w0"], True)],
)
def test_a_drain_during_a_source(
    tmp_path: Path, on_drain: str, read: list[str], drained: bool
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, KEY)
    coord.register(StageGraph.from_edges(["weather", "ingest"], []))
    coord.start_attempt("ingest")  # a running fact source: the drain does not complete at once
    logic = Logic(on_first=lambda: coord.request_stop(StopMode.DRAIN, "test"))
    spec = StageSpec(
        pipeline_key=KEY,
        stage_id="weather",
        splits=("w0", "w1", "w2"),
        batch_size=1,
        on_drain=on_drain,
    )
    log = Lines()
    result = StageRunner(coord, spec, logic, log=log).run()
    assert logic.processed == read
    assert logic.drained is drained
    assert result.end_of_data is not None
    assert result.end_of_data.drain is drained
    assert result.end_of_data.unread_splits == 3 - len(read)
    if on_drain == "complete":
        assert any("reads its input whole" in line for line in log.lines)
    engine.dispose()


def test_on_drain_is_validated() -> None:
    with pytest.raises(ValueError, match="on_drain must be one of"):
        StageSpec(pipeline_key=KEY, stage_id="weather", splits=(), on_drain="finish")
