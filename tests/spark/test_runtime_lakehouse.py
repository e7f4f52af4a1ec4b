"""The example pipeline publishing to Iceberg and Delta through the real runtime on real Spark:
the tables equal the pandas reference, also after a crash between the covering checkpoint and
the commit (the next attempt commits again, the tables hold every row once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
from airflow_finalckpt.sinks.staged import StagedTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(4)
BATCHES = {"ingest": 2, "enrich": 1, "delay_windows": 1, "publish": 1}


class InjectedCrash(RuntimeError):
    pass


class RecordingStatsLogger:
    """A metrics backend behind Airflow's ``stats.initialize`` seam: keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any, dict[str, Any]]] = []

    def _keep(self, kind: str, stat: str, value: Any, tags: dict[str, Any] | None) -> None:
        self.sent.append((kind, stat, value, dict(tags or {})))

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("incr", stat, count, tags)

    def decr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("decr", stat, count, tags)

    def gauge(
        self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None
    ) -> None:
        self._keep("gauge", stat, value, tags)

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        self._keep("timing", stat, dt, tags)


@pytest.fixture
def recorded_metrics() -> Iterator[RecordingStatsLogger]:
    """Airflow's stats module sends to a recorder; its previous backend is put back after."""
    from airflow.sdk._shared.observability.metrics import stats as module

    saved = (module._factory, module._backend, module._export_legacy_names)
    recorder = RecordingStatsLogger()
    module.initialize(factory=lambda: recorder, export_legacy_names=False)  # type: ignore[arg-type,return-value]
    try:
        yield recorder
    finally:
        module._factory, module._backend, module._export_legacy_names = saved


def _run(tmp_path: Path, spark: SparkSession, sinks: list[StagedTableSink], **kw: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    run_example_locally(
        spark,
        str(tmp_path / "inputs"),
        Coordinator(engine, "nyc", writer=CheckpointStorage(str(tmp_path / "checkpoints"))),
        CheckpointStorage(str(tmp_path / "checkpoints")),
        sinks,
        batch_sizes=BATCHES,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("crash_at", [None, "mid-commit"])
def test_example_pipeline_publishes_to_iceberg_and_delta_exactly_once(
    spark: SparkSession,
    tmp_path: Path,
    crash_at: str | None,
    recorded_metrics: RecordingStatsLogger,
) -> None:
    prepare_inputs(tmp_path / "inputs", days=DAYS)
    sinks: list[StagedTableSink] = [
        IcebergTableSink("windows_iceberg", "nyc.windows", warehouse=str(tmp_path / "wh")),
        DeltaTableSink("windows_delta", str(tmp_path / "delta" / "windows")),
    ]
    if crash_at is not None:
        crashed: list[str] = []

        def crash_once(stage_id: str, at: str) -> None:
            if stage_id == "publish" and at == crash_at and not crashed:
                crashed.append(at)
                raise InjectedCrash(at)

        with pytest.raises(InjectedCrash):
            _run(tmp_path, spark, sinks, fault=crash_once)
    _run(tmp_path, spark, sinks)

    expected = reference_pipeline(DAYS).windows
    for sink in sinks:
        assert_windows_match(sink.read_arrow().to_pandas(), expected)
        assert sink.staged_txn_ids() == set()
    iceberg, delta = sinks
    assert isinstance(iceberg, IcebergTableSink) and isinstance(delta, DeltaTableSink)
    table, log = iceberg.table(), delta.table()
    assert table is not None and log is not None
    committed = iceberg.committed_txn_ids()

    def batches_of(sink_id: str, txn_ids: set[str]) -> set[str]:
        """The batches of a sink's transactions (their ids name the sink: ``.<sink>.e<n>``)."""
        suffix = f".{sink_id}."
        assert all(suffix in txn_id for txn_id in txn_ids), (sink_id, txn_ids)
        return {txn_id.replace(suffix, ".") for txn_id in txn_ids}

    # the two sinks committed the same batches, each under its own transaction ids
    assert committed and batches_of("windows_iceberg", committed) == batches_of(
        "windows_delta", delta.committed_txn_ids()
    )
    # one snapshot / version per committed transaction that had rows
    assert len(table.snapshots()) == log.version() + 1 <= len(committed)

    # metrics through Airflow's stats: every batch, every commit, every stage's finish and close
    sent = recorded_metrics.sent
    closed = {tags["stage_id"] for kind, stat, _, tags in sent if stat == "finalckpt.stage.closed"}
    assert closed == {"ingest", "enrich", "delay_windows", "publish"}
    batches = [(v, t) for k, stat, v, t in sent if stat == "finalckpt.batch.splits"]
    assert batches and all(value >= 1 for value, _ in batches)
    assert any(stat == "finalckpt.batch.duration" for _, stat, _, _ in sent)
    commits = {t["sink_id"] for _, stat, _, t in sent if stat == "finalckpt.sink.commit.duration"}
    assert commits == {"windows_iceberg", "windows_delta"}
