"""The example pipeline through the real runtime on real Spark, without Airflow.

Sinks must equal an independent pandas computation; after a crash mid-``enrich`` the new
attempt processes only the unfinished splits, and the sinks are still exactly equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.runtime.runner import CommitMode, RunStatus
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(6)
BATCHES = {"ingest": 2, "enrich": 1, "delay_windows": 1, "publish": 1}


class InjectedCrash(RuntimeError):
    pass


@pytest.fixture
def env(tmp_path: Path) -> dict[str, object]:
    inputs = tmp_path / "inputs"
    prepare_inputs(inputs, days=DAYS)
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    sinks = [
        ParquetTableSink("windows_parquet", str(tmp_path / "out" / "windows")),
        SqlTableSink("windows_sql", f"sqlite:///{tmp_path}/out.db", "delay_windows"),
    ]
    return {
        "inputs": str(inputs),
        "coordinator": Coordinator(engine, "nyc", writer=storage),
        "storage": storage,
        "sinks": sinks,
    }


def _check_sinks(sinks: list, expected) -> None:  # type: ignore[type-arg]
    parquet, sql = sinks
    for actual in (parquet.read_pandas(), sql.read_pandas()):
        assert_windows_match(actual, expected.windows)


def test_pipeline_sinks_equal_pandas_reference(spark: SparkSession, env: dict) -> None:  # type: ignore[type-arg]
    coord: Coordinator = env["coordinator"]  # type: ignore[assignment]
    run = run_example_locally(
        spark,
        env["inputs"],
        coord,
        env["storage"],
        env["sinks"],
        batch_sizes=BATCHES,  # type: ignore[arg-type]
        checkpoint_interval_s=3600.0,
    )
    assert all(r.status is RunStatus.FINISHED for r in run.results.values())
    # Eager final checkpoints: with a one-hour interval no periodic checkpoint ever ran, yet
    # every stage closed on the checkpoint its finish triggered (its threshold).
    reasons = {c.reason.value for c in coord.checkpoints()}
    assert reasons == {"eager_final"}
    for view in coord.stages().values():
        assert view.closed_checkpoint_id == view.finish_threshold
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in coord.stages().values())
    _check_sinks(env["sinks"], reference_pipeline(DAYS))  # type: ignore[arg-type]
    committed = [t for t, state in coord.transactions() if state == "COMMITTED"]
    assert committed and all(t.checkpoint_id is not None for t in committed)


def test_crash_mid_enrich_resumes_only_unfinished_splits(spark: SparkSession, env: dict) -> None:  # type: ignore[type-arg]
    coord: Coordinator = env["coordinator"]  # type: ignore[assignment]
    seen = {"enrich_batches": 0}

    def crash_on_third_enrich_batch(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "after-record-batch":
            seen["enrich_batches"] += 1
            if seen["enrich_batches"] == 2:
                raise InjectedCrash("crash mid-enrich")

    with pytest.raises(InjectedCrash):
        run_example_locally(
            spark,
            env["inputs"],  # type: ignore[arg-type]
            coord,
            env["storage"],  # type: ignore[arg-type]
            env["sinks"],  # type: ignore[arg-type]
            batch_sizes=BATCHES,
            fault=crash_on_third_enrich_batch,
        )
    enrich = coord.stage("enrich")
    done_before = set(enrich.progress.finished_splits)
    assert len(done_before) == 2 and enrich.lifecycle is StageLifecycle.RUNNING
    ingest_epoch = coord.stage("ingest").epoch

    run = run_example_locally(
        spark,
        env["inputs"],
        coord,
        env["storage"],
        env["sinks"],
        batch_sizes=BATCHES,  # type: ignore[arg-type]
    )
    # ingest was closed: no Spark job, nothing processed again
    assert run.results["ingest"].status is RunStatus.CLOSED
    assert run.results["ingest"].processed_splits == ()
    assert coord.stage("ingest").epoch == ingest_epoch + 1
    # enrich processed exactly the splits it had not finished
    redone = set(run.results["enrich"].processed_splits)
    all_parts = set(run.end_of_data["ingest"].manifest)
    assert redone == all_parts - done_before
    _check_sinks(env["sinks"], reference_pipeline(DAYS))  # type: ignore[arg-type]


def test_final_commit_mode_publishes_only_at_final_checkpoint(
    spark: SparkSession, env: dict
) -> None:  # type: ignore[type-arg]
    coord: Coordinator = env["coordinator"]  # type: ignore[assignment]
    parquet = env["sinks"][0]  # type: ignore[index]
    observed: list[int] = []

    def watch(stage_id: str, point: str) -> None:
        if stage_id == "publish" and point == "after-record-batch":
            observed.append(len(parquet.committed_txn_ids()))

    run_example_locally(
        spark,
        env["inputs"],  # type: ignore[arg-type]
        coord,
        env["storage"],  # type: ignore[arg-type]
        env["sinks"],  # type: ignore[arg-type]
        batch_sizes=BATCHES,
        commit_mode=CommitMode.FINAL,
        fault=watch,
    )
    assert observed and set(observed) == {0}
    assert parquet.committed_txn_ids()
    _check_sinks(env["sinks"], reference_pipeline(DAYS))  # type: ignore[arg-type]


def test_restore_checkpoint_into_fresh_store(
    spark: SparkSession,
    env: dict,  # type: ignore[type-arg]
    tmp_path: Path,
) -> None:
    """A checkpoint path alone restores the pipeline into an empty coordination database."""
    from airflow_finalckpt.core.restore import plan_restore
    from airflow_finalckpt.examples.nycflights13.local import example_graph

    coord: Coordinator = env["coordinator"]  # type: ignore[assignment]
    storage: CheckpointStorage = env["storage"]  # type: ignore[assignment]

    def crash_in_enrich(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "after-record-batch":
            coord.trigger()  # a checkpoint that covers ingest (finished) and enrich (partial)
            raise InjectedCrash("crash mid-enrich")

    with pytest.raises(InjectedCrash):
        run_example_locally(
            spark,
            env["inputs"],
            coord,
            storage,
            env["sinks"],
            batch_sizes=BATCHES,
            fault=crash_in_enrich,  # type: ignore[arg-type]
        )
    # the failed enrich attempt released its lease (issue 25): the checkpoint it triggered does
    # not wait for a batch boundary that never comes, it completes from enrich's durable progress
    pending = [c for c in coord.checkpoints() if c.state.value == "PENDING"]
    assert not pending, "a released attempt must not hold a checkpoint pending"
    latest = coord.latest_completed()
    assert latest is not None and latest.metadata_path
    record = storage.read_checkpoint(latest.metadata_path)
    statuses = {s: r.status.value for s, r in record.stages.items()}
    assert statuses["ingest"] == "FULLY_FINISHED"
    assert statuses["enrich"] != "FULLY_FINISHED"
    assert 1 <= len(record.stages["enrich"].finished_splits) < 3  # of ingest's three parts

    fresh_engine = make_engine(f"sqlite:///{tmp_path}/fresh.db")
    ensure_schema(fresh_engine)
    fresh = Coordinator(fresh_engine, record.pipeline_key, writer=storage)
    fresh.register(example_graph())
    plan = plan_restore(record, example_graph(), pipeline_key=record.pipeline_key)
    assert fresh.restore(plan, record, latest.metadata_path)
    assert not fresh.restore(plan, record, latest.metadata_path)  # idempotent per source

    run = run_example_locally(
        spark, env["inputs"], fresh, storage, env["sinks"], batch_sizes=BATCHES
    )  # type: ignore[arg-type]
    assert run.results["ingest"].processed_splits == ()
    assert run.results["ingest"].status is RunStatus.FINISHED  # closed at once, no Spark job
    enrich_done = record.stages["enrich"].finished_splits
    assert set(run.results["enrich"].processed_splits) == set(
        run.end_of_data["ingest"].manifest
    ) - set(enrich_done)
    _check_sinks(env["sinks"], reference_pipeline(DAYS))  # type: ignore[arg-type]


@pytest.mark.parametrize("point", ["before-commit", "mid-commit"])
def test_crash_between_checkpoint_complete_and_commit_done_replays_once(
    spark: SparkSession,
    env: dict,  # type: ignore[type-arg]
    point: str,
) -> None:
    """The checkpoint completed, the sink commit did not happen / was not recorded: the next
    attempt commits again, and the sinks still hold every row exactly once."""
    coord: Coordinator = env["coordinator"]  # type: ignore[assignment]
    crashed: list[str] = []

    def crash_once(stage_id: str, at: str) -> None:
        if stage_id == "publish" and at == point and not crashed:
            crashed.append(at)
            raise InjectedCrash(at)

    with pytest.raises(InjectedCrash):
        run_example_locally(
            spark,
            env["inputs"],
            coord,
            env["storage"],
            env["sinks"],
            batch_sizes=BATCHES,
            fault=crash_once,  # type: ignore[arg-type]
        )
    assert coord.latest_completed() is not None
    run_example_locally(
        spark, env["inputs"], coord, env["storage"], env["sinks"], batch_sizes=BATCHES
    )  # type: ignore[arg-type]
    _check_sinks(env["sinks"], reference_pipeline(DAYS))  # type: ignore[arg-type]
    states = [state for _, state in coord.transactions("publish")]
    assert states and set(states) == {"COMMITTED"}


def test_pipelines_sharing_sinks_commit_their_own_transactions(
    spark: SparkSession, env: dict, tmp_path: Path
) -> None:  # type: ignore[type-arg]
    """Three pipeline runs (auto batches) write to the same Parquet and SQL sinks: each commits
    its own transactions, none is refused as already committed, none sweeps another's staged
    transaction as an orphan."""
    storage: CheckpointStorage = env["storage"]  # type: ignore[assignment]
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    parquet, sql = env["sinks"]  # type: ignore[misc]
    # a transaction pipeline C staged but never recorded (its batch crashed) must survive the
    # other pipelines' orphan sweeps, which only look at their own transactions
    from airflow_finalckpt.runtime.runner import transaction_id

    foreign = transaction_id("run-c", "publish", "crashed-n1-0000000000", 1)
    sql.write_pandas(foreign, reference_pipeline(DAYS).windows.head(3))
    sql.precommit(foreign, 0)
    for key in ("run-a", "run-b", "run-a2"):
        coord = Coordinator(engine, key, writer=storage)
        run = run_example_locally(spark, env["inputs"], coord, storage, env["sinks"])  # type: ignore[arg-type]
        assert all(r.status is RunStatus.FINISHED for r in run.results.values()), key
        assert all(v.lifecycle is StageLifecycle.CLOSED for v in coord.stages().values())
    expected = reference_pipeline(DAYS).windows
    for sink in (parquet, sql):
        actual = sink.read_pandas()
        assert len(actual) == 3 * len(expected)  # every run's windows, once each
        committed = sink.committed_txn_ids()
        assert {t.split(".")[1] for t in committed} == {
            transaction_id(k, "publish", "x", 1).split(".")[1] for k in ("run-a", "run-b", "run-a2")
        }
    assert foreign in sql.staged_txn_ids()
