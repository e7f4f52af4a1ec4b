"""The branching example pipeline under a triggerer crash and under stops, on a REAL Airflow
(api-server, scheduler, dag-processor, triggerer, LocalExecutor with parallelism 4, PostgreSQL;
coordination store on PostgreSQL). DAGs: tests/e2e/branching_dags/branching_faults.py, paced by
gate files so that what overlaps does not depend on the load.

``[ingest, weather] >> enrich >> delay_windows >> publish`` and ``enrich >> carrier_daily``.
Observed, not assumed:

- **triggerer SIGKILL**: ``carrier_daily`` finished and DEFERRED on ``FinalCheckpointTrigger``
  (assigned to a running triggerer) while ``delay_windows`` holds a batch, so its final
  checkpoint cannot complete; the triggerer process is SIGKILLed and a new one started (new
  PID, new triggerer job); the same trigger row is taken over by the new triggerer job while
  the task stays deferred in the same try; only then may ``delay_windows`` go on: its
  acknowledgement completes the checkpoint, the trigger fires ``closable`` on the NEW
  triggerer (its log file), the task resumes in the same try, closes once (one try, one
  Asset event naming the checkpoint) and the three sinks equal the pandas reference;
- **stop with savepoint while both branches run** (``delay_windows`` and ``carrier_daily``
  RUNNING, each inside its second of three batches), through the plugin's REST route the UI
  uses: the savepoint stays pending until both acknowledge, then completes with both branches
  PARTIALLY_FINISHED (two of three splits) next to FULLY_FINISHED upstream stages and a
  NOT_STARTED ``publish`` in its ``_metadata``; both tasks wait deferred on
  ``StageResumeTrigger``, nothing of the suspended branches is committed and the DAG run stays
  running. The operator fails that DAG run and restores the savepoint into a new DAG run
  (REST): fully finished stages run no Spark, each branch processes only its remaining split,
  every transaction is committed once and the sinks equal the reference;
- **stop with drain while both branches run**: both branches finish (drained), the DAG run
  succeeds, the drained savepoint's ``_metadata`` has every stage FULLY_FINISHED, the sinks
  equal the reference (the sources had read everything), and resume and restore are refused.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    StageLifecycle,
    StopMode,
    StopState,
)
from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_carrier_daily_match,
    assert_windows_match,
    reference_carrier_daily,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .airflow_cluster import AirflowCluster, _create_database, _drop_database, postgres_reachable

DAG_FILE = Path(__file__).resolve().parent / "branching_dags" / "branching_faults.py"
TRIGGERER_DAG = "branching_faults_triggerer"
SAVEPOINT_DAG = "branching_faults_savepoint"
DRAIN_DAG = "branching_faults_drain"
FAIL_WINDOWS_DAG = "branching_faults_fail_windows"
FAIL_CARRIER_DAG = "branching_faults_fail_carrier"
DRAIN_SOURCES_DAG = "branching_faults_drain_sources"
TWO_RUNS_DAG = "branching_faults_two_runs"
OUTPUT = {
    TRIGGERER_DAG: "triggerer",
    SAVEPOINT_DAG: "savepoint",
    DRAIN_DAG: "drain",
    FAIL_WINDOWS_DAG: "fail_windows",
    FAIL_CARRIER_DAG: "fail_carrier",
    DRAIN_SOURCES_DAG: "drain_sources",
    TWO_RUNS_DAG: "two_runs",
}
DAYS = 21  # three ingest parts: enrich, delay_windows and carrier_daily have three splits
FINAL_TRIGGER = "airflow_finalckpt.triggers.final_checkpoint.FinalCheckpointTrigger"
RESUME_TRIGGER = "airflow_finalckpt.triggers.final_checkpoint.StageResumeTrigger"
UPSTREAM = ("ingest", "weather", "enrich")
BRANCHES = ("delay_windows", "carrier_daily")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ok, why = postgres_reachable()
    if not ok:
        if os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{why} but FINALCKPT_REQUIRE_POSTGRES=1", pytrace=False)
        pytest.skip(why)
    work = tmp_path_factory.mktemp("branching-faults")
    name = f"finalckpt_bf_{uuid.uuid4().hex[:10]}"
    url = _create_database(name)
    engine = make_engine(url)
    ensure_schema(engine)
    engine.dispose()
    try:
        yield {"work": work, "store_url": url}
    finally:
        _drop_database(name)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(airflow_cluster: Callable[..., AirflowCluster], env: dict[str, Any]) -> AirflowCluster:
    work: Path = env["work"]
    return airflow_cluster(
        [DAG_FILE],
        extra_env={
            "AIRFLOW__FINALCKPT__STORE_URL": env["store_url"],
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
            # keep every checkpoint's _metadata for the assertions
            "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "100",
            "FINALCKPT_E2E_WORK": str(work),
            "FINALCKPT_E2E_DAYS": str(DAYS),
        },
        expect_dags=[
            TRIGGERER_DAG,
            SAVEPOINT_DAG,
            DRAIN_DAG,
            FAIL_WINDOWS_DAG,
            FAIL_CARRIER_DAG,
            DRAIN_SOURCES_DAG,
            TWO_RUNS_DAG,
        ],
    )


class Pipeline:
    """One DAG run of a branching_faults DAG: its gates, its coordinator, its sinks."""

    def __init__(self, cluster: AirflowCluster, env: dict[str, Any], dag_id: str) -> None:
        self.cluster = cluster
        self.dag_id = dag_id
        self.work: Path = env["work"]
        self.store_url: str = env["store_url"]
        self.gates = self.work / "gates" / dag_id
        self.gates.mkdir(parents=True, exist_ok=True)
        self.key = f"{dag_id}-{uuid.uuid4().hex[:8]}"
        self.engine = make_engine(self.store_url)
        self.coord = Coordinator(self.engine, self.key)
        self.storage = CheckpointStorage(str(self.work / "checkpoints"))
        self.run_id = ""

    def hold(self, *gates: str) -> None:
        for gate in gates:
            (self.gates / gate).touch()

    def release(self, *gates: str) -> None:
        for gate in gates:
            (self.gates / gate).unlink(missing_ok=True)

    def held(self, gate: str) -> bool:
        return (self.gates / f"{gate}.held").exists()

    def trigger(self) -> str:
        self.run_id = self.cluster.trigger_dag(self.dag_id, conf={"pipeline_key": self.key})
        return self.run_id

    def tis(self, run_id: str | None = None) -> dict[str, dict[str, Any]]:
        rows = self.cluster.task_instances(self.dag_id, run_id or self.run_id)
        return {ti["task_id"]: ti for ti in rows}

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 420) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            assert time.monotonic() < deadline, (
                f"timed out after {timeout:.0f}s waiting for {what}\n{self.cluster.log_tails(40)}"
            )
            time.sleep(0.3)

    def finished_splits(self, stage_id: str) -> frozenset[str]:
        try:
            return self.coord.stage(stage_id).progress.finished_splits
        except Exception:  # pipeline or stage not registered yet
            return frozenset()

    def statuses(self, checkpoint_id: int) -> dict[str, str]:
        path = self.coord.checkpoint(checkpoint_id).metadata_path
        assert path, f"checkpoint {checkpoint_id} has no _metadata"
        record = self.storage.read_checkpoint(path)
        return {sid: s.status.value for sid, s in record.stages.items()}

    def assert_sinks_equal_reference(self) -> None:
        out = self.work / OUTPUT[self.dag_id] / "output"
        days = first_days(DAYS)
        windows = reference_pipeline(days).windows
        assert_windows_match(
            ParquetTableSink("delay_windows_parquet", f"{out}/delay_windows").read_pandas(),
            windows,
        )
        assert_windows_match(
            SqlTableSink(
                "delay_windows_sql", f"sqlite:///{out}/delay_windows.db", "delay_windows"
            ).read_pandas(),
            windows,
        )
        assert_carrier_daily_match(
            ParquetTableSink("carrier_daily_parquet", f"{out}/carrier_daily").read_pandas(),
            reference_carrier_daily(days),
        )

    def assert_committed_once(self) -> None:
        txns = self.coord.transactions()
        assert txns and {s for _t, s in txns} == {"COMMITTED"}, txns
        ids = [(t.sink_id, t.txn_id) for t, _s in txns]
        assert len(ids) == len(set(ids))

    def close(self) -> None:
        self.release(*[p.name for p in self.gates.iterdir() if not p.name.endswith(".held")])
        self.engine.dispose()


@pytest.fixture
def pipeline_factory(
    cluster: AirflowCluster, env: dict[str, Any]
) -> Iterator[Callable[[str], Pipeline]]:
    made: list[Pipeline] = []

    def make(dag_id: str) -> Pipeline:
        made.append(Pipeline(cluster, env, dag_id))
        return made[-1]

    yield make
    for p in made:  # a failed test must not leave a task holding a gate for HOLD_S
        p.close()


def _triggerer_jobs(cluster: AirflowCluster) -> dict[int, dict[str, Any]]:
    jobs = cluster.api("GET", "/api/v2/jobs", params={"job_type": "TriggererJob", "limit": 100})
    return {int(j["id"]): j for j in jobs["jobs"]}


def _asset_events(cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str) -> list[Any]:
    events = cluster.api(
        "GET",
        "/api/v2/assets/events",
        params={
            "source_dag_id": dag_id,
            "source_run_id": run_id,
            "source_task_id": task_id,
            "limit": 100,
        },
    )
    return list(events["asset_events"])


def test_triggerer_sigkill_while_a_finished_branch_waits_deferred(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline]
) -> None:
    p = pipeline_factory(TRIGGERER_DAG)
    # carrier_daily holds its last batch, delay_windows its second
    p.hold("carrier_daily-3", "delay_windows-2")
    run_id = p.trigger()
    p.wait(lambda: p.held("delay_windows-2"), "delay_windows inside its second batch", 900)
    assert len(p.finished_splits("delay_windows")) == 1
    p.wait(lambda: p.held("carrier_daily-3"), "carrier_daily inside its last batch")
    # carrier_daily finishes while delay_windows holds: its final checkpoint needs
    # delay_windows' acknowledgement, which comes only at delay_windows' next batch boundary
    p.release("carrier_daily-3")

    def deferred_on_a_triggerer() -> dict[str, dict[str, Any]] | None:
        tis = p.tis()
        carrier, windows = tis["carrier_daily"], tis["delay_windows"]
        trigger = carrier.get("trigger") or {}
        if (
            carrier["state"] == "deferred"
            and windows["state"] == "running"
            and trigger.get("triggerer_id") is not None
        ):
            return tis
        return None

    seen = p.wait(deferred_on_a_triggerer, "carrier_daily deferred on a running triggerer")
    carrier_ti = seen["carrier_daily"]
    assert carrier_ti["trigger"]["classpath"] == FINAL_TRIGGER, carrier_ti
    carrier_try = carrier_ti["try_number"]
    trigger_id = carrier_ti["trigger"]["id"]
    old_job = int(carrier_ti["trigger"]["triggerer_id"])
    assert p.coord.stage("carrier_daily").lifecycle is StageLifecycle.FINISHED
    pending = p.coord.pending_for("delay_windows")
    assert pending, "no checkpoint waits for delay_windows' acknowledgement"
    log_dir = (
        cluster.logs_dir / f"dag_id={TRIGGERER_DAG}" / f"run_id={run_id}" / "task_id=carrier_daily"
    )
    old_log = log_dir / f"attempt={carrier_try}.log.trigger.{old_job}.log"
    # the trigger really runs on the old triggerer (its log there says it started)
    p.wait(
        lambda: old_log.exists() and "starting" in old_log.read_text(errors="replace"),
        "the trigger started on the old triggerer",
        120,
    )

    # SIGKILL the triggerer (its whole process tree) while carrier_daily waits in it
    old_pid = cluster.component_pid("triggerer")
    assert old_pid is not None
    killed_at = time.time()
    cluster.kill("triggerer")
    assert cluster.component_pid("triggerer") is None
    still = cluster.task_instance(TRIGGERER_DAG, run_id, "carrier_daily")
    assert (still["state"], still["try_number"]) == ("deferred", carrier_try), still
    cluster.start_component("triggerer")
    cluster.wait_healthy(components=["triggerer"], since=killed_at, timeout=120)
    new_pid = cluster.component_pid("triggerer")
    assert new_pid is not None and new_pid != old_pid

    # the same trigger row is taken over by the new triggerer job (once the dead one's
    # heartbeat is older than the health threshold); the task stays deferred in the same try
    def adopted() -> dict[str, Any] | None:
        ti = cluster.task_instance(TRIGGERER_DAG, run_id, "carrier_daily")
        trigger = ti.get("trigger") or {}
        owner = trigger.get("triggerer_id")
        return ti if owner is not None and int(owner) != old_job else None

    adopted_ti = p.wait(adopted, "the trigger taken over by the new triggerer", 180)
    assert adopted_ti["state"] == "deferred" and adopted_ti["try_number"] == carrier_try
    assert adopted_ti["trigger"]["id"] == trigger_id
    assert adopted_ti["trigger"]["classpath"] == FINAL_TRIGGER
    new_job = int(adopted_ti["trigger"]["triggerer_id"])
    jobs = _triggerer_jobs(cluster)
    started = jobs[new_job]["start_date"]
    assert started and started > jobs[old_job]["start_date"], (jobs[old_job], jobs[new_job])
    # nothing could close carrier_daily yet: delay_windows still holds its batch
    assert p.coord.stage("carrier_daily").lifecycle is StageLifecycle.FINISHED
    assert cluster.task_instance(TRIGGERER_DAG, run_id, "delay_windows")["state"] == "running"

    # delay_windows goes on: its batch boundary acknowledges, the checkpoint completes, and the
    # trigger on the NEW triggerer fires the event carrier_daily resumes on
    p.release("delay_windows-2")
    p.wait(
        lambda: p.coord.stage("carrier_daily").lifecycle is StageLifecycle.CLOSED,
        "carrier_daily closed",
    )
    closed_on = p.coord.stage("carrier_daily").closed_checkpoint_id
    assert closed_on is not None and closed_on >= (
        p.coord.stage("carrier_daily").finish_threshold or 0
    )
    state = cluster.wait_for_run(TRIGGERER_DAG, run_id, timeout=600)
    assert state == "success", cluster.log_tails(60)

    new_log = (log_dir / f"attempt={carrier_try}.log.trigger.{new_job}.log").read_text(
        errors="replace"
    )
    assert "Trigger fired event" in new_log, new_log[-3000:]
    assert f"'checkpoint_id': {closed_on}" in new_log and "closable" in new_log
    assert "Trigger fired event" not in old_log.read_text(errors="replace")
    # closed exactly once, in the try that deferred: one try, one Asset event for its commit
    tries = cluster.task_tries(TRIGGERER_DAG, run_id, "carrier_daily")
    assert [t["try_number"] for t in tries] == [carrier_try], tries
    assert tries[0]["state"] == "success"
    events = _asset_events(cluster, TRIGGERER_DAG, run_id, "carrier_daily")
    assert len(events) == 1, events
    assert events[0]["extra"]["checkpoint_id"] == closed_on, events[0]
    views = p.coord.stages()
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in views.values()), views
    p.assert_committed_once()
    p.assert_sinks_equal_reference()


def _stop(cluster: AirflowCluster, dag_id: str, run_id: str, mode: str) -> dict[str, Any]:
    """The stop button's REST call (the pipeline page posts it), as a user who may edit runs."""
    path = f"/finalckpt/api/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/stop"
    resp = cluster.request("POST", path, json={"mode": mode}, user="user")
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


@pytest.mark.parametrize("mode", ["savepoint", "drain"])
def test_stop_while_both_branches_run(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline], mode: str
) -> None:
    p = pipeline_factory(SAVEPOINT_DAG if mode == "savepoint" else DRAIN_DAG)
    # each branch holds its second of three batches
    p.hold("delay_windows-2", "carrier_daily-2")
    run_id = p.trigger()
    p.wait(lambda: p.held("delay_windows-2"), "delay_windows inside its second batch", 900)
    p.wait(lambda: p.held("carrier_daily-2"), "carrier_daily inside its second batch")
    tis = p.tis()
    assert tis["delay_windows"]["state"] == tis["carrier_daily"]["state"] == "running", tis
    for stage in BRANCHES:
        assert len(p.finished_splits(stage)) == 1, stage
        assert p.coord.stage(stage).lifecycle is StageLifecycle.RUNNING

    requested = _stop(cluster, p.dag_id, run_id, mode)
    assert requested["mode"] == mode and requested["requested_by"] == "user"
    stop = p.coord.stop_request()
    assert stop is not None and stop.state is StopState.REQUESTED
    if mode == "savepoint":
        # the savepoint waits for both branches' acknowledgements at their batch boundaries
        assert stop.savepoint_id is not None
        assert p.coord.checkpoint(stop.savepoint_id).state.value == "PENDING"
        for stage in BRANCHES:
            assert stop.savepoint_id in p.coord.pending_for(stage), stage
    p.release("delay_windows-2", "carrier_daily-2")
    if mode == "savepoint":
        _savepoint_then_restore(p, run_id)
    else:
        _drained(p, run_id)


def _savepoint_then_restore(p: Pipeline, run_id: str) -> None:
    cluster = p.cluster
    stop = p.wait(
        lambda: (
            (s := p.coord.stop_request()) is not None and s.state is not StopState.REQUESTED and s
        ),
        "the savepoint",
    )
    assert stop.state is StopState.COMPLETED, stop
    savepoint = p.coord.checkpoint(stop.savepoint_id)
    assert savepoint.kind is CheckpointKind.SAVEPOINT and savepoint.metadata_path
    path = savepoint.metadata_path
    record = p.storage.read_checkpoint(path)
    statuses = {sid: s.status.value for sid, s in record.stages.items()}
    assert {sid: statuses[sid] for sid in UPSTREAM} == dict.fromkeys(UPSTREAM, "FULLY_FINISHED")
    assert statuses["publish"] == "NOT_STARTED", statuses
    done_at_savepoint: dict[str, set[str]] = {}
    for stage in BRANCHES:
        assert statuses[stage] == "PARTIALLY_FINISHED", statuses
        done_at_savepoint[stage] = set(record.stages[stage].finished_splits)
        assert len(done_at_savepoint[stage]) == 2, (stage, done_at_savepoint)

    # both branches suspended: deferred on StageResumeTrigger (no worker slot, Spark released),
    # nothing of them committed, publish not started, the DAG run still running
    def both_waiting() -> dict[str, dict[str, Any]] | None:
        tis = p.tis()
        ok = all(
            tis[s]["state"] == "deferred"
            and (tis[s].get("trigger") or {}).get("classpath") == RESUME_TRIGGER
            for s in BRANCHES
        )
        return tis if ok else None

    tis = p.wait(both_waiting, "both branches deferred on StageResumeTrigger", 180)
    assert tis["publish"]["state"] in (None, "none", "scheduled"), tis["publish"]
    assert cluster.dag_run(p.dag_id, run_id)["state"] == "running"
    views = p.coord.stages()
    for stage in BRANCHES:
        assert views[stage].lifecycle is StageLifecycle.SUSPENDED
        assert set(views[stage].progress.finished_splits) == done_at_savepoint[stage]
    assert views["publish"].lifecycle is StageLifecycle.NOT_STARTED
    assert not [t for t, s in p.coord.transactions("carrier_daily") if s == "COMMITTED"]
    manifest = cluster.xcom(p.dag_id, run_id, "enrich", key="end_of_data")["manifest"]
    assert len(manifest) == 3

    # the operator ends the suspended DAG run and restores the savepoint into a new one
    cluster.api(
        "PATCH",
        f"/api/v2/dags/{quote(p.dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}",
        json={"state": "failed"},
    )
    p.wait(
        lambda: all(
            p.tis()[s]["state"] not in ("deferred", "running", "queued", "scheduled")
            for s in BRANCHES
        ),
        "the suspended tasks ended with their DAG run",
        120,
    )
    created = cluster.request(
        "POST",
        f"/finalckpt/api/dags/{quote(p.dag_id, safe='')}/restore",
        json={"savepoint_path": path},
        user="user",
    )
    assert created.status_code == 201, created.text
    new_run = created.json()["run_id"]
    assert cluster.dag_run(p.dag_id, new_run)["conf"] == {"restore_from": path}
    state = cluster.wait_for_run(p.dag_id, new_run, timeout=600)
    assert state == "success", cluster.log_tails(60)

    # fully finished stages ran no Spark; each branch processed only its remaining split
    for stage in UPSTREAM:
        run = cluster.xcom(p.dag_id, new_run, stage, key="stage_run")
        assert run["processed_splits"] == [] and run["spark_started"] is False, (stage, run)
    for stage in BRANCHES:
        run = cluster.xcom(p.dag_id, new_run, stage, key="stage_run")
        assert set(run["processed_splits"]) == set(manifest) - done_at_savepoint[stage], run
    assert p.coord.restored_from() == path
    views = p.coord.stages()
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in views.values()), views
    p.assert_committed_once()
    p.assert_sinks_equal_reference()


def _drained(p: Pipeline, run_id: str) -> None:
    cluster = p.cluster
    state = cluster.wait_for_run(p.dag_id, run_id, timeout=600)
    assert state == "success", cluster.log_tails(60)
    stop = p.coord.stop_request()
    assert stop is not None and stop.mode is StopMode.DRAIN and stop.state is StopState.COMPLETED
    final = p.coord.checkpoint(stop.savepoint_id or 0)
    assert final.kind is CheckpointKind.DRAINED_SAVEPOINT and final.metadata_path
    statuses = p.statuses(final.checkpoint_id)
    assert set(statuses.values()) == {"FULLY_FINISHED"}, statuses
    print(
        f"\n[stop latency] drain with both branches running: drained savepoint "
        f"{final.checkpoint_id} complete {(final.completed_at or 0) - stop.requested_at:.1f}s "
        "after the request",
        file=sys.stderr,
    )
    # the branches finished drained (every split: their input was complete), publish too
    for stage in (*BRANCHES, "publish"):
        eod = cluster.xcom(p.dag_id, run_id, stage, key="end_of_data")
        assert eod["drain"] is True, (stage, eod)
    for stage in UPSTREAM:
        assert cluster.xcom(p.dag_id, run_id, stage, key="end_of_data")["drain"] is False
    views = p.coord.stages()
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in views.values()), views
    for stage in BRANCHES:
        assert len(views[stage].progress.finished_splits) == 3, stage
    p.assert_committed_once()
    p.assert_sinks_equal_reference()

    base = f"/finalckpt/api/dags/{quote(p.dag_id, safe='')}"
    resume = cluster.request(
        "POST", f"{base}/runs/{quote(run_id, safe='')}/resume", json={}, user="user"
    )
    assert resume.status_code == 409 and "cannot be resumed" in resume.text, resume.text
    restore = cluster.request(
        "POST", f"{base}/restore", json={"savepoint_path": final.metadata_path}, user="user"
    )
    assert restore.status_code == 409 and "drained savepoint" in restore.text, restore.text


def _fail_for_good_while_sibling_waits(
    p: Pipeline, failing: str, waiting: str
) -> tuple[str, dict[str, dict[str, Any]], int]:
    """``failing`` holds its second batch until ``waiting`` finished and waits deferred for its
    eager final checkpoint (which waits for ``failing``'s acknowledgement); then ``failing``
    fails on every try (2 tries). Returns the run id, its task instances once the run ended and
    the eager checkpoint's id.
    """
    cluster = p.cluster
    # `waiting` finishes only once `failing` recorded its first batch and holds its second, so
    # its eager checkpoint plans `failing` as running (it must acknowledge)
    p.hold(f"{failing}-2", f"{waiting}-3")
    run_id = p.trigger()
    p.wait(lambda: p.held(f"{failing}-2"), f"{failing} inside its second batch", 600)
    p.release(f"{waiting}-3")
    cluster.wait_for_task(p.dag_id, run_id, waiting, ("deferred",), timeout=300)
    eager = p.coord.stage(waiting).finish_threshold
    assert eager is not None
    assert p.coord.checkpoint(eager).state is CheckpointState.PENDING  # it waits for `failing`
    (p.gates / f"{failing}.fail").touch()
    p.release(f"{failing}-2")
    state = cluster.wait_for_run(p.dag_id, run_id, timeout=300)
    tis = p.tis(run_id)
    assert state == "failed", (tis, cluster.log_tails(60))
    assert tis[failing]["state"] == "failed" and tis[failing]["try_number"] == 2, tis[failing]
    assert tis[waiting]["state"] == "success", tis[waiting]
    # The eager checkpoint completed at the first try's failure (its failure path released the
    # attempt), before the retry began: it did not wait for the failure to be final.
    done = p.coord.checkpoint(eager)
    assert done.state is CheckpointState.COMPLETED and done.completed_at is not None
    tries = cluster.task_tries(p.dag_id, run_id, failing)
    second = next(t for t in tries if t["try_number"] == 2)
    assert done.completed_at < _epoch_seconds(second["start_date"]), (done, second)
    assert p.statuses(eager)[failing] == "PARTIALLY_FINISHED"  # from its first batch
    assert p.coord.stage(waiting).lifecycle is StageLifecycle.CLOSED
    # carrier_daily holds the carrier Asset (delay_windows' Asset is publish's)
    carrier = "carrier_daily"
    assert len(_asset_events(cluster, p.dag_id, run_id, carrier)) == (carrier == waiting)
    return run_id, tis, eager


def _epoch_seconds(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_branch_failing_for_good_does_not_block_its_finished_sibling(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline]
) -> None:
    """delay_windows fails on every try while carrier_daily finished and waits deferred:
    carrier_daily closes, commits and succeeds, publish is upstream_failed, the run fails.
    """
    p = pipeline_factory(FAIL_WINDOWS_DAG)
    _run_id, tis, _ = _fail_for_good_while_sibling_waits(p, "delay_windows", "carrier_daily")
    assert tis["publish"]["state"] == "upstream_failed"
    out = p.work / OUTPUT[p.dag_id] / "output"
    assert_carrier_daily_match(
        ParquetTableSink("carrier_daily_parquet", f"{out}/carrier_daily").read_pandas(),
        reference_carrier_daily(first_days(DAYS)),
    )


def test_the_mirror_case_lets_publish_run(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline]
) -> None:
    """carrier_daily fails on every try while delay_windows finished and waits deferred:
    delay_windows closes and succeeds, publish runs and succeeds, the run fails.
    """
    p = pipeline_factory(FAIL_CARRIER_DAG)
    run_id, tis, _ = _fail_for_good_while_sibling_waits(p, "carrier_daily", "delay_windows")
    assert tis["publish"]["state"] == "success", tis["publish"]
    assert p.coord.stage("publish").lifecycle is StageLifecycle.CLOSED
    assert len(_asset_events(cluster, p.dag_id, run_id, "publish")) == 1
    out = p.work / OUTPUT[p.dag_id] / "output"
    windows = reference_pipeline(first_days(DAYS)).windows
    assert_windows_match(
        ParquetTableSink("delay_windows_parquet", f"{out}/delay_windows").read_pandas(), windows
    )
    assert cluster.xcom(p.dag_id, run_id, "publish", key="end_of_data")["drain"] is False


def test_a_drain_while_both_sources_run_cuts_the_facts_not_the_dimension(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline]
) -> None:
    """Both sources inside their second batch when the drain is requested: ingest (the fact
    source) stops after it (14 of 21 days), weather (a dimension enrich reads whole) reads all
    three origins and finishes undrained; every window of the days read equals the pandas
    reference with complete weather, and the note says exactly what each source read.
    """
    p = pipeline_factory(DRAIN_SOURCES_DAG)
    p.hold("ingest-2", "weather-2")
    run_id = p.trigger()
    p.wait(
        lambda: p.held("ingest-2") and p.held("weather-2"),
        "both sources inside their second batch",
        600,
    )
    _stop(cluster, p.dag_id, run_id, "drain")
    p.release("ingest-2", "weather-2")
    state = cluster.wait_for_run(p.dag_id, run_id, timeout=900)
    assert state == "success", cluster.log_tails(60)
    weather = cluster.xcom(p.dag_id, run_id, "weather", key="end_of_data")
    assert weather["drain"] is False and weather["unread_splits"] == 0, weather
    assert len(p.finished_splits("weather")) == 3
    ingest = cluster.xcom(p.dag_id, run_id, "ingest", key="end_of_data")
    assert ingest["drain"] is True and ingest["unread_splits"] == DAYS - 14, ingest
    read = first_days(14)
    out = p.work / OUTPUT[p.dag_id] / "output"
    assert_windows_match(
        ParquetTableSink("delay_windows_parquet", f"{out}/delay_windows").read_pandas(),
        reference_pipeline(read).windows,
    )
    stop = p.coord.stop_request()
    assert stop is not None and stop.state is StopState.COMPLETED
    by = f" by {stop.requested_by}" if stop.requested_by else ""
    assert cluster.dag_run(p.dag_id, run_id).get("note") == (
        f"Drained{by}: stopped taking input and published everything read so far at drained "
        f"savepoint {stop.savepoint_id}. {DAYS - 14} input splits were left unread (splits "
        f"read: ingest 14/{DAYS}, weather 3/3). A drained run cannot be resumed."
    )


def test_a_continuation_while_the_first_run_still_runs_is_refused(
    cluster: AirflowCluster, pipeline_factory: Callable[[str], Pipeline]
) -> None:
    """A second DAG run on the first run's pipeline key, started while the first run's
    delay_windows holds a batch: its first stage task is refused at once (one try, no retry),
    naming the first run; the first run's attempts keep their epochs (no StaleEpochError
    ping-pong), it succeeds, and every commit has exactly one Asset event.
    """
    p = pipeline_factory(TWO_RUNS_DAG)
    p.hold("delay_windows-2")
    first = p.trigger()
    p.wait(lambda: p.held("delay_windows-2"), "delay_windows inside its second batch", 600)
    epoch = p.coord.stage("delay_windows").epoch
    second = cluster.trigger_dag(p.dag_id, conf={"pipeline_key": p.key})
    assert cluster.wait_for_run(p.dag_id, second, timeout=420) == "failed"
    refused = p.tis(second)
    assert refused["ingest"]["state"] == "failed" and refused["ingest"]["try_number"] == 1
    log = cluster.logs(p.dag_id, second, "ingest", 1)
    assert "PipelineDrivenError" in log and "is driven by DAG run" in log, log[-3000:]
    assert first in log and '{"take_over": true}' in log
    assert p.coord.driver() == (p.dag_id, first)
    assert p.coord.stage("delay_windows").epoch == epoch  # nothing taken from the first run
    p.release("delay_windows-2")
    assert cluster.wait_for_run(p.dag_id, first, timeout=420) == "success"
    for task in ("carrier_daily", "publish"):
        assert len(_asset_events(cluster, p.dag_id, first, task)) == 1, task
        assert _asset_events(cluster, p.dag_id, second, task) == [], task
    p.assert_committed_once()
