"""A dead attempt's writer that stages again after the next attempt's start-up sweep (a Spark
job still finishing after its task was killed) leaves no ``_staging/<txn>.e1`` behind: the
stage sweeps its orphans again once it closed (issue 25: the directory stayed after the retry
logged "aborting orphaned transaction ...e1"). Real runner, SQLite, a real Parquet sink.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StateHandle
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "orphan-sweep"


class Crash(Exception):
    pass


class Writer:
    """Stages one row per batch; ``crash``: fails after staging its first batch;
    ``late``: called before its first batch (the dead attempt's writer stages again)."""

    def __init__(self, sink: ParquetTableSink, *, crash: bool = False, late: Any = None) -> None:
        self.sink, self.crash, self.late = sink, crash, late

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        if self.late is not None:
            self.late()
            self.late = None
        self.sink.write_pandas(txn_ids[self.sink.sink_id], pd.DataFrame({"split": batch.splits}))
        if self.crash:
            raise Crash("killed mid-stage")
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(str(event) % args)


def test_a_late_write_of_a_dead_attempt_is_swept_at_close(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, KEY)
    coord.register(StageGraph.from_edges(["a"], []))
    sink = ParquetTableSink("pq", str(tmp_path / "table"))
    spec = StageSpec(pipeline_key=KEY, stage_id="a", splits=("s0", "s1"), batch_size=1)
    with pytest.raises(Crash):
        StageRunner(coord, spec, Writer(sink, crash=True), [sink], log=Lines()).run()
    [dead] = sink.staged_txn_ids()
    assert dead.endswith(".e1")

    def late_write() -> None:  # after the start-up sweep removed it
        assert dead not in sink.staged_txn_ids()
        sink.write_pandas(dead, pd.DataFrame({"split": ["s0"]}))

    log = Lines()
    runner = StageRunner(coord, spec, Writer(sink, late=late_write), [sink], log=log)
    runner.run()
    assert dead in sink.staged_txn_ids()  # staged again by the late writer
    assert runner.try_close() is not None
    assert sink.staged_txn_ids() == set()
    assert not (tmp_path / "table" / "_staging" / dead).exists()
    swept = [line for line in log.lines if line.startswith(f"aborting orphaned transaction {dead}")]
    assert len(swept) == 2  # at the start, and again after close
    assert sorted(sink.read_pandas()["split"]) == ["s0", "s1"]
    engine.dispose()
