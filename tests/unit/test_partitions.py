"""Partitions (AIP-76) as plain values and through the real runner: a stage sees its run's
partition key and date, the keys a transform reports ride on its sink transactions, and a
commit announces exactly the keys of the transactions it made visible (none of an aborted
one, none of a commit a recompute superseded). Real runner, SQLite, a real Parquet sink."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import SinkTransaction, StateHandle
from airflow_finalckpt.core.partitions import (
    check_partition_keys,
    committed_partitions,
    with_partitions,
)
from airflow_finalckpt.core.pipeline_keys import default_pipeline_key
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.operators.publishing import announce_commit
from airflow_finalckpt.operators.scheduling import run_context_of
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAY = dt.datetime(2026, 3, 10, tzinfo=dt.UTC)


def _context(**extra: Any) -> dict[str, Any]:
    return {
        "dag": SimpleNamespace(dag_id="sales"),
        "dag_run": SimpleNamespace(conf={}, partition_key=None, partition_date=None),
        "run_id": "scheduled__2026-03-10",
        "logical_date": None,
        **extra,
    }


def test_a_partitioned_run_is_captured_as_plain_values() -> None:
    run = run_context_of(_context(partition_key="us|2026-03-10", partition_date=DAY))
    assert run.partition_key == "us|2026-03-10"
    assert run.partition_date == DAY
    assert run.partition_parts() == ["us", "2026-03-10"]
    assert RunContext.from_json(run.to_json()) == run
    # a context without the keys (an older Task SDK) falls back to the DAG run's
    dag_run = SimpleNamespace(conf={}, partition_key="eu", partition_date=None)
    assert run_context_of({**_context(), "dag_run": dag_run}).partition_key == "eu"
    plain = run_context_of(_context())
    assert (plain.partition_key, plain.partition_date, plain.partition_parts()) == (None, None, [])


def test_partition_keys_are_checked_with_one_line_errors() -> None:
    assert check_partition_keys("s", "us") == ("us",)
    assert check_partition_keys("s", ["us", "eu"]) == ("us", "eu")
    with pytest.raises(StageDefinitionError, match="partition key ' ' is not a non-empty"):
        check_partition_keys("s", ["us", " "])
    with pytest.raises(StageDefinitionError, match="251 characters, Airflow keeps at most 250"):
        check_partition_keys("s", "x" * 251)


def test_a_commit_announces_the_keys_of_its_committed_transactions_only() -> None:
    def txn(tid: str, keys: list[str], **payload: Any) -> SinkTransaction:
        [marked] = with_partitions(
            [SinkTransaction(sink_id="o", txn_id=tid, payload=payload)], keys
        )
        return marked

    rows = [
        (txn("a", ["2026-03-10", "2026-03-11"]), "COMMITTED"),
        (txn("b", ["2026-03-11"]), "COMMITTED"),
        (txn("c", ["2026-03-12"]), "ABORTED"),
        (txn("d", ["2026-03-13"]), "PRECOMMITTED"),
        (txn("e", ["2026-03-09"], superseded=True), "COMMITTED"),
        (txn("f", []), "COMMITTED"),
    ]
    assert committed_partitions(rows) == ["2026-03-10", "2026-03-11"]
    assert with_partitions([SinkTransaction(sink_id="o", txn_id="x")], [])[0].payload == {}


def test_a_partitioned_run_has_a_readable_key_from_the_same_digest() -> None:
    plain = default_pipeline_key("sales", "asset_triggered__2026-03-10T00:00:00+00:00_ab12")
    keyed = default_pipeline_key(
        "sales", "asset_triggered__2026-03-10T00:00:00+00:00_ab12", partition_key="us|2026-03-10"
    )
    assert keyed.startswith("sales.p=us-2026-03-10.asset_triggered__2026-03-10T00-00-00-00-00")
    assert keyed.rsplit(".", 1)[1] == plain.rsplit(".", 1)[1]  # one pipeline per DAG run
    assert default_pipeline_key("sales", "r", partition_key=None) == default_pipeline_key(
        "sales", "r"
    )
    regenerated = default_pipeline_key("sales", "r", 2, partition_key="us|2026-03-10")
    assert regenerated.startswith("sales.p=us-2026-03-10.r-g2.")  # a re-created partitioned run


class Accessor:
    def __init__(self) -> None:
        self.extra: dict[str, Any] = {}
        self.keys: list[str] = []

    def add_partitions(self, keys: str | list[str]) -> None:
        self.keys.extend([keys] if isinstance(keys, str) else keys)


class Events(dict[Any, Accessor]):
    def __missing__(self, key: Any) -> Accessor:
        self[key] = Accessor()
        return self[key]


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(str(event) % args)

    warning = info


class Reporter:
    """Stages one row per split with its day; reports each batch's days as partition keys.
    ``crash_after``: fails on the batch after that many recorded ones."""

    def __init__(self, sink: ParquetTableSink, crash_after: int | None = None) -> None:
        self.sink, self.crash_after, self.done = sink, crash_after, 0

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        if self.crash_after is not None and self.done >= self.crash_after:
            raise RuntimeError("killed mid-stage")
        self.done += 1
        days = [s.split("/")[0] for s in batch.splits]
        self.sink.write_pandas(txn_ids["o"], pd.DataFrame({"day": days, "split": batch.splits}))
        return BatchOutput(partition_keys=tuple(sorted(set(days))))

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


def _announced(coord: Coordinator, stage: str = "a") -> tuple[list[str], dict[str, Any]]:
    from airflow.sdk import Asset

    events = Events()
    asset = Asset("finalckpt_partitions_unit")
    assert not announce_commit(
        {"outlet_events": events}, [asset], coord, stage, republish=False, log=Lines()
    )
    return events[asset].keys, events[asset].extra


def test_runtime_partitions_are_announced_once_per_committed_key(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, "partitions")
    coord.register(StageGraph.from_edges(["a"], []))
    sink = ParquetTableSink("o", str(tmp_path / "table"))
    first = ("2026-03-10/1", "2026-03-10/2", "2026-03-11/1")
    spec = StageSpec(pipeline_key="partitions", stage_id="a", splits=first, batch_size=2)

    # an attempt records its first batch (2026-03-10), then dies; a clear of the failed
    # task resumes, but here the stage is reset first: its pre-committed batch is aborted
    with pytest.raises(Exception, match="killed mid-stage"):
        StageRunner(coord, spec, Reporter(sink, crash_after=1), [sink], log=Lines()).run()
    coord.reset_stages(["a"])
    states = {t.txn_id: s for t, s in coord.transactions("a")}
    assert list(states.values()) == ["ABORTED"]

    # the next attempt reads other input (one day only): only its key is announced
    spec = StageSpec(pipeline_key="partitions", stage_id="a", splits=first[2:], batch_size=2)
    runner = StageRunner(coord, spec, Reporter(sink), [sink], log=Lines())
    runner.run()
    assert runner.try_close() is not None
    keys, extra = _announced(coord)
    assert keys == ["2026-03-11"] and extra["partition_keys"] == ["2026-03-11"]
    assert extra["rows"] == 1

    # a recompute (a clear of the succeeded stage) supersedes that commit: its own commit
    # announces only what it recomputed, and counts only its own rows
    coord.reset_stages(["a"])
    spec = StageSpec(pipeline_key="partitions", stage_id="a", splits=first[:2], batch_size=2)
    runner = StageRunner(coord, spec, Reporter(sink), [sink], log=Lines())
    runner.run()
    assert runner.try_close() is not None
    keys, extra = _announced(coord)
    assert keys == ["2026-03-10"] and extra["rows"] == 2
    assert len([s for _, s in coord.transactions("a") if s == "COMMITTED"]) == 4  # 2 + 2 finish

    # a re-publication announces nothing
    events = Events()
    assert announce_commit(
        {"outlet_events": events}, ["x"], coord, "a", republish=True, log=Lines()
    )
    assert not events
    engine.dispose()
