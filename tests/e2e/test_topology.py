"""The topology tier: the branching example pipeline on a deployment shaped like the official
Helm chart's CeleryExecutor one (tests/e2e/topology_cluster.py; docs/deploying.md), started
once for the module, the faults run one after the other on it with small data (14 days).

- api-server, scheduler, dag-processor, triggerer; a private Redis as the Celery broker; two
  Celery workers ("pods" ``worker-a`` and ``worker-b``), each with its own AIRFLOW_HOME, HOME,
  TMPDIR, Spark local directory and log folder; the only paths both see are the DAG folder
  (read-only) and the ``finalckpt-data`` volume (a ReadWriteMany PVC: input, checkpoints,
  Parquet tables); Spark runs ``local[*]`` inside the worker's task (no Spark cluster yet);
- PostgreSQL: Airflow's metadata database, the coordination store and each DAG's SQL sink,
  separate databases.

Observed, not assumed, for every test: every sink equals the independent pandas reference,
every transaction is COMMITTED (none PRECOMMITTED or aborted), each task instance's hostname
is the pod that ran it (the REST API's ``hostname``), and the DAG run ends.

Select alone with ``-m topology``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_carrier_daily_match,
    assert_windows_match,
    reference_carrier_daily,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .airflow_cluster import _create_database, _drop_database, postgres_reachable
from .conftest import _LIVE
from .topology_cluster import WORKERS, TopologyCluster

pytestmark = [pytest.mark.topology]

DAG_FILE = Path(__file__).resolve().parent / "topology_dags" / "topology_branching.py"
PLAIN_DAG = "topology_plain"
SIGKILL_DAG = "topology_worker_sigkill"
REDIS_DAG = "topology_redis_restart"
WARM_DAG = "topology_warm_shutdown"
TRIGGERER_DAG = "topology_triggerer"
SAVEPOINT_DAG = "topology_savepoint"
DRAIN_DAG = "topology_drain"
RESUME_TRIGGER = "airflow_finalckpt.triggers.final_checkpoint.StageResumeTrigger"
BRANCHES = ("delay_windows", "carrier_daily")
FINAL_TRIGGER = "airflow_finalckpt.triggers.final_checkpoint.FinalCheckpointTrigger"
DAG_IDS = (
    PLAIN_DAG,
    SIGKILL_DAG,
    "topology_redis_restart",
    "topology_warm_shutdown",
    "topology_triggerer",
    "topology_savepoint",
    "topology_drain",
)
DAYS = 14
UPSTREAM = ("ingest", "weather", "enrich")
STAGES = (*UPSTREAM, "delay_windows", "carrier_daily", "publish")


@pytest.fixture(scope="module")
def topology() -> Iterator[TopologyCluster]:
    ok, why = postgres_reachable()
    if not ok:
        if os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{why} but FINALCKPT_REQUIRE_POSTGRES=1", pytrace=False)
        pytest.skip(why)
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server not found (Debian: apt-get install redis-server)")
    suffix = uuid.uuid4().hex[:8]
    store = f"finalckpt_topo_store_{suffix}"
    store_url = _create_database(store)
    engine = make_engine(store_url)
    ensure_schema(engine)
    engine.dispose()
    sinks = {dag: f"finalckpt_topo_{suffix}_{dag}" for dag in DAG_IDS}
    for name in sinks.values():
        _create_database(name)
    sink_template = store_url.rsplit("/", 1)[0] + f"/finalckpt_topo_{suffix}_{{dag}}"
    for other in list(_LIVE):  # one cluster at a time (tests/e2e/conftest.py)
        _LIVE.remove(other)
        other.stop()
    cluster = TopologyCluster(
        [DAG_FILE],
        extra_env={
            "AIRFLOW__FINALCKPT__STORE_URL": store_url,
            # keep every checkpoint's _metadata for the assertions
            "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "100",
            # a killed attempt's lease outlasts its retry's start: the retry answers for it
            "AIRFLOW__FINALCKPT__ATTEMPT_LEASE_S": "900",
            "FINALCKPT_TOPOLOGY_DAYS": str(DAYS),
            "FINALCKPT_TOPOLOGY_SINK_URL": sink_template,
        },
        expect_dags=DAG_IDS,
        worker_concurrency=1,
    )
    # checkpoints on the shared volume (known only once the cluster's home exists)
    cluster.extra_env["AIRFLOW__FINALCKPT__STORAGE_URI"] = str(cluster.data_dir / "checkpoints")
    _LIVE.append(cluster)
    started = time.monotonic()
    cluster.start()
    print(
        f"\n[topology] up in {time.monotonic() - started:.1f}s at {cluster.base_url} "
        f"(home {cluster.home}, redis :{cluster.redis_port})",
        file=sys.stderr,
    )
    cluster.store_url = store_url  # type: ignore[attr-defined]
    cluster.sink_template = sink_template  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        if cluster in _LIVE:
            _LIVE.remove(cluster)
        cluster.stop()
        for name in (store, *sinks.values()):
            _drop_database(name)


class Run:
    """One DAG run of a topology DAG: its gates, its coordinator, its sinks."""

    def __init__(self, cluster: TopologyCluster, dag_id: str) -> None:
        self.cluster = cluster
        self.dag_id = dag_id
        self.gates = cluster.control_dir / dag_id
        self.gates.mkdir(parents=True, exist_ok=True)
        self.key = f"{dag_id}-{uuid.uuid4().hex[:8]}"
        self.store_url: str = cluster.store_url  # type: ignore[attr-defined]
        self.engine = make_engine(self.store_url)
        self.coord = Coordinator(self.engine, self.key)
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

    def tis(self) -> dict[str, dict[str, Any]]:
        rows = self.cluster.task_instances(self.dag_id, self.run_id)
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

    def hostnames(self) -> dict[str, list[tuple[int, str]]]:
        """Per stage task, (try number, hostname) of every try, from the REST API."""
        return {
            stage: [
                (int(t["try_number"]), str(t["hostname"]))
                for t in self.cluster.task_tries(self.dag_id, self.run_id, stage)
            ]
            for stage in STAGES
        }

    def assert_exactly_once(self) -> None:
        txns = self.coord.transactions()
        assert txns and {s for _t, s in txns} == {"COMMITTED"}, txns
        ids = [(t.sink_id, t.txn_id) for t, _s in txns]
        assert len(ids) == len(set(ids)), ids
        out = self.cluster.data_dir / self.dag_id / "output"
        days = first_days(DAYS)
        windows = reference_pipeline(days).windows
        assert_windows_match(
            ParquetTableSink("delay_windows_parquet", f"{out}/delay_windows").read_pandas(),
            windows,
        )
        sink_url = self.cluster.sink_template.replace(  # type: ignore[attr-defined]
            "{dag}", self.dag_id
        )
        assert_windows_match(
            SqlTableSink("delay_windows_sql", sink_url, "delay_windows").read_pandas(), windows
        )
        assert_carrier_daily_match(
            ParquetTableSink("carrier_daily_parquet", f"{out}/carrier_daily").read_pandas(),
            reference_carrier_daily(days),
        )

    def close(self) -> None:
        self.release(*[p.name for p in self.gates.iterdir() if not p.name.endswith(".held")])
        self.engine.dispose()


@pytest.fixture
def run_factory(topology: TopologyCluster) -> Iterator[Callable[[str], Run]]:
    made: list[Run] = []

    def make(dag_id: str) -> Run:
        made.append(Run(topology, dag_id))
        return made[-1]

    yield make
    for run in made:  # a failed test must not leave a task holding a gate
        run.close()
    for name in topology.worker_names:  # the next test starts with both pods up
        if not topology.worker_alive(name):
            topology.start_worker(name)


def test_one_run_takes_stages_on_both_workers(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    r = run_factory(PLAIN_DAG)
    r.trigger()
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)
    hosts = r.hostnames()
    print(f"\n[topology] {r.dag_id} hostnames per stage: {hosts}", file=sys.stderr)
    for stage, tries in hosts.items():
        assert [n for n, _h in tries] == [1], (stage, tries)  # nothing retried
        assert tries[0][1] in WORKERS, (stage, tries)
    assert {h for tries in hosts.values() for _n, h in tries} == set(WORKERS), hosts
    # each task log is on the pod that ran it (its own log folder; a stage that deferred may
    # resume on the other pod, which then holds that part of the log and is its hostname)
    for name in WORKERS:
        logged = {
            p.parent.name.removeprefix("task_id=")
            for p in topology.worker_logs_dir(name).rglob("attempt=1.log")
            if f"run_id={r.run_id}" in str(p)
        }
        ran = {stage for stage, tries in hosts.items() if tries[0][1] == name}
        assert ran <= logged, (name, ran, logged)
    r.assert_exactly_once()


def test_sigkill_of_a_worker_pod_retries_on_the_other_and_resumes(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    r = run_factory(SIGKILL_DAG)
    r.hold("delay_windows-t1-2")  # the first try holds its second (last) batch
    r.trigger()
    r.wait(lambda: r.held("delay_windows-t1-2"), "delay_windows inside its second batch", 900)
    done_at_kill = set(r.finished_splits("delay_windows"))
    assert len(done_at_kill) == 1, done_at_kill
    epoch_at_kill = r.coord.stage("delay_windows").epoch
    ti = r.tis()["delay_windows"]
    assert ti["state"] == "running" and ti["try_number"] == 1, ti
    victim = ti["hostname"]
    assert victim in WORKERS, ti
    survivor = next(w for w in WORKERS if w != victim)
    before = {s: r.cluster.task_tries(r.dag_id, r.run_id, s) for s in UPSTREAM}
    assert all([t["state"] for t in v] == ["success"] for v in before.values()), before

    killed = topology.kill_worker_tree(victim)
    assert len(killed) >= 3, killed  # worker, pool process, task processes (+ Spark JVM)
    r.release("delay_windows-t1-2")
    # the scheduler fails the orphaned try by heartbeat timeout; the retry can only land on
    # the surviving pod while the victim is down
    retry = topology.wait_for_task(
        r.dag_id,
        r.run_id,
        "delay_windows",
        ("running", "deferred", "success"),
        try_number=2,
        timeout=300,
    )
    assert retry["hostname"] == survivor, retry
    topology.start_worker(victim)
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=600)
    assert state == "success", topology.log_tails(60)

    tries = topology.task_tries(r.dag_id, r.run_id, "delay_windows")
    assert [(t["try_number"], t["hostname"]) for t in tries] == [(1, victim), (2, survivor)]
    # the retry resumed: only the split the killed try had not finished
    manifest = topology.xcom(r.dag_id, r.run_id, "enrich", key="end_of_data")["manifest"]
    stage_run = topology.xcom(r.dag_id, r.run_id, "delay_windows", key="stage_run")
    assert stage_run["epoch"] == epoch_at_kill + 1, stage_run
    assert set(stage_run["processed_splits"]) == set(manifest) - done_at_kill, stage_run
    # stages finished before the fault ran no Spark again: one try each, the same as before
    for stage in UPSTREAM:
        after = topology.task_tries(r.dag_id, r.run_id, stage)
        assert [(t["try_number"], t["hostname"]) for t in after] == [
            (t["try_number"], t["hostname"]) for t in before[stage]
        ], stage
    views = r.coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    r.assert_exactly_once()


@pytest.mark.topology_full
def test_redis_restart_while_a_task_is_queued_loses_no_run(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    """The broker restarted empty while a source task is queued on it (no worker free): the
    message is lost; the scheduler finds the task stuck in queued, requeues it, and it runs
    once; no stage commits twice and the sinks equal the reference."""
    r = run_factory(REDIS_DAG)
    # one pod only: its single slot holds one source inside its first batch, the other source
    # waits in the broker's queue
    standby = WORKERS[1]
    topology.signal_worker(standby, signal.SIGTERM)
    topology.wait_worker_exit(standby, timeout=120)
    r.hold("ingest-t1-1", "weather-t1-1")
    r.trigger()

    def one_held_one_queued() -> tuple[str, str] | None:
        tis = r.tis()
        for running, queued in (("ingest", "weather"), ("weather", "ingest")):
            if r.held(f"{running}-t1-1") and tis[queued]["state"] == "queued":
                return running, queued
        return None

    running, queued = r.wait(one_held_one_queued, "one source held, the other queued", 600)
    lost_at = time.time()
    topology.restart_redis()
    topology.start_worker(standby)
    r.release("ingest-t1-1", "weather-t1-1")
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)
    # the lost task was requeued by the scheduler (its event log says so) and ran once
    events = topology.api(
        "GET",
        "/api/v2/eventLogs",
        params={"dag_id": r.dag_id, "task_id": queued, "event": "stuck in queued reschedule"},
    )["event_logs"]
    assert events, f"{queued} was not requeued as stuck in queued"
    assert all(_epoch(e["when"]) >= lost_at for e in events), events
    # every stage ran in exactly one try that did run (none failed, none ran twice)
    for stage in STAGES:
        tries = topology.task_tries(r.dag_id, r.run_id, stage)
        ran = [t for t in tries if t.get("start_date")]
        assert [t["state"] for t in ran] == ["success"], (stage, tries)
    for stage in STAGES:
        assert len(r.coord.stage(stage).progress.finished_splits) > 0, stage
    r.assert_exactly_once()
    assert running != queued


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _carrier_deferred_while_windows_holds(r: Run) -> dict[str, dict[str, Any]]:
    """carrier_daily finished and DEFERRED on its final checkpoint (which waits for
    delay_windows' acknowledgement) while delay_windows holds its second batch; returns the
    task instances of that moment."""
    r.hold("delay_windows-t1-2", "carrier_daily-t1-2")
    r.trigger()
    r.wait(lambda: r.held("delay_windows-t1-2"), "delay_windows inside its second batch", 900)
    r.wait(lambda: r.held("carrier_daily-t1-2"), "carrier_daily inside its second batch")
    r.release("carrier_daily-t1-2")

    def deferred() -> dict[str, dict[str, Any]] | None:
        tis = r.tis()
        carrier, windows = tis["carrier_daily"], tis["delay_windows"]
        trigger = carrier.get("trigger") or {}
        if carrier["state"] == "deferred" and windows["state"] == "running" and trigger:
            return tis
        return None

    tis = r.wait(deferred, "carrier_daily deferred while delay_windows runs")
    assert tis["carrier_daily"]["trigger"]["classpath"] == FINAL_TRIGGER, tis["carrier_daily"]
    assert r.coord.stage("carrier_daily").lifecycle.value == "FINISHED"
    return tis


@pytest.mark.topology_full
def test_warm_shutdown_of_the_worker_whose_stage_is_deferred(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    """SIGTERM (Celery's warm shutdown) of the pod that ran carrier_daily while carrier_daily
    waits deferred on the triggerer: the pod exits at once (no task of it runs), the trigger
    fires once delay_windows acknowledges, and carrier_daily resumes in the same try on the
    other pod, commits once; every sink equals the reference."""
    r = run_factory(WARM_DAG)
    tis = _carrier_deferred_while_windows_holds(r)
    carrier_try = tis["carrier_daily"]["try_number"]
    ran_on = tis["carrier_daily"]["hostname"]
    windows_on = tis["delay_windows"]["hostname"]
    assert {ran_on, windows_on} == set(WORKERS), tis  # one slot per pod: one each
    topology.signal_worker(ran_on, signal.SIGTERM)
    topology.wait_worker_exit(ran_on, timeout=120)
    still = topology.task_instance(r.dag_id, r.run_id, "carrier_daily")
    assert (still["state"], still["try_number"]) == ("deferred", carrier_try), still
    r.release("delay_windows-t1-2")
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)
    tries = topology.task_tries(r.dag_id, r.run_id, "carrier_daily")
    assert [(t["try_number"], t["state"]) for t in tries] == [(carrier_try, "success")], tries
    # it resumed on the pod still up (a deferred task resumes through the executor)
    assert tries[0]["hostname"] == windows_on, tries
    views = r.coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    r.assert_exactly_once()


@pytest.mark.topology_full
def test_triggerer_sigkill_while_a_stage_waits_for_its_final_checkpoint(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    """SIGKILL of the triggerer (its whole tree) while carrier_daily waits deferred on it: a
    new triggerer takes the trigger over, carrier_daily resumes in the same try once
    delay_windows acknowledges, closes once; every sink equals the reference."""
    r = run_factory(TRIGGERER_DAG)
    tis = _carrier_deferred_while_windows_holds(r)
    carrier_try = tis["carrier_daily"]["try_number"]
    old_job = int(
        r.wait(
            lambda: (r.tis()["carrier_daily"].get("trigger") or {}).get("triggerer_id"),
            "carrier_daily's trigger assigned to the triggerer",
        )
    )
    old_pid = topology.component_pid("triggerer")
    killed_at = time.time()
    topology.kill("triggerer")
    topology.start_component("triggerer")
    topology.wait_healthy(components=["triggerer"], since=killed_at, timeout=180)
    assert topology.component_pid("triggerer") not in (None, old_pid)
    still = topology.task_instance(r.dag_id, r.run_id, "carrier_daily")
    assert (still["state"], still["try_number"]) == ("deferred", carrier_try), still
    assert r.coord.stage("carrier_daily").lifecycle.value == "FINISHED"
    r.release("delay_windows-t1-2")
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)
    tries = topology.task_tries(r.dag_id, r.run_id, "carrier_daily")
    assert [(t["try_number"], t["state"]) for t in tries] == [(carrier_try, "success")], tries
    # the event that resumed it was fired by the new triggerer's job, not the killed one's
    logs = topology.logs_dir / f"dag_id={r.dag_id}" / f"run_id={r.run_id}" / "task_id=carrier_daily"
    fired = {
        int(p.name.rsplit(".", 2)[-2])
        for p in logs.glob(f"attempt={carrier_try}.log.trigger.*.log")
        if "Trigger fired event" in p.read_text(errors="replace")
    }
    assert fired and old_job not in fired, (old_job, fired)
    views = r.coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    r.assert_exactly_once()


def _stop(r: Run, mode: str) -> None:
    """The pipeline page's stop button: its REST call, as a user who may edit DAG runs."""
    path = f"/finalckpt/api/dags/{quote(r.dag_id, safe='')}/runs/{quote(r.run_id, safe='')}/stop"
    resp = r.cluster.request("POST", path, json={"mode": mode}, user="user")
    assert resp.status_code == 202, resp.text


def _both_branches_inside_their_second_batch(r: Run) -> dict[str, dict[str, Any]]:
    r.hold("delay_windows-t1-2", "carrier_daily-t1-2")
    r.trigger()
    r.wait(lambda: r.held("delay_windows-t1-2"), "delay_windows inside its second batch", 900)
    r.wait(lambda: r.held("carrier_daily-t1-2"), "carrier_daily inside its second batch")
    tis = r.tis()
    for stage in BRANCHES:
        assert tis[stage]["state"] == "running", tis[stage]
        assert len(r.finished_splits(stage)) == 1, stage
    return tis


@pytest.mark.topology_full
def test_stop_with_savepoint_then_resume_on_the_other_worker(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    """Stop with savepoint (REST) while both branches run; both suspend deferred; the pod that
    ran delay_windows shuts down warm; the resume (REST) runs delay_windows on the other pod,
    which processes only its split not in the savepoint; every sink equals the reference."""
    r = run_factory(SAVEPOINT_DAG)
    tis = _both_branches_inside_their_second_batch(r)
    windows_on = tis["delay_windows"]["hostname"]
    other = next(w for w in WORKERS if w != windows_on)
    before = {s: topology.task_tries(r.dag_id, r.run_id, s) for s in UPSTREAM}
    _stop(r, "savepoint")
    r.release("delay_windows-t1-2", "carrier_daily-t1-2")
    stop = r.wait(
        lambda: (s := r.coord.stop_request()) is not None and s.state.value != "REQUESTED" and s,
        "the savepoint",
    )
    assert stop.state.value == "COMPLETED", stop

    def both_suspended() -> dict[str, dict[str, Any]] | None:
        now = r.tis()
        ok = all(
            now[s]["state"] == "deferred"
            and (now[s].get("trigger") or {}).get("classpath") == RESUME_TRIGGER
            for s in BRANCHES
        )
        return now if ok else None

    r.wait(both_suspended, "both branches deferred on StageResumeTrigger", 300)
    done_at_savepoint = set(r.coord.stage("delay_windows").progress.finished_splits)
    topology.signal_worker(windows_on, signal.SIGTERM)
    topology.wait_worker_exit(windows_on, timeout=120)

    api = f"/finalckpt/api/dags/{quote(r.dag_id, safe='')}/runs/{quote(r.run_id, safe='')}"
    resumed = topology.request("POST", f"{api}/resume", json={}, user="user")
    assert resumed.status_code in (200, 202), resumed.text
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)

    windows = topology.task_tries(r.dag_id, r.run_id, "delay_windows")
    assert [(t["state"], t["hostname"]) for t in windows] == [("success", other)], windows
    manifest = topology.xcom(r.dag_id, r.run_id, "enrich", key="end_of_data")["manifest"]
    stage_run = topology.xcom(r.dag_id, r.run_id, "delay_windows", key="stage_run")
    assert set(stage_run["processed_splits"]) == set(manifest) - done_at_savepoint, stage_run
    for stage in UPSTREAM:  # finished before the stop: no Spark again
        after = topology.task_tries(r.dag_id, r.run_id, stage)
        assert len(after) == len(before[stage]) == 1, (stage, after)
    views = r.coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    r.assert_exactly_once()


@pytest.mark.topology_full
def test_stop_with_drain_while_both_branches_run(
    topology: TopologyCluster, run_factory: Callable[[str], Run]
) -> None:
    """Stop with drain (REST) while both branches run on the two pods: both finish drained,
    the run succeeds, the drained savepoint has every stage FULLY_FINISHED, and every sink
    equals the reference (the sources had read everything)."""
    r = run_factory(DRAIN_DAG)
    _both_branches_inside_their_second_batch(r)
    _stop(r, "drain")
    r.release("delay_windows-t1-2", "carrier_daily-t1-2")
    state = topology.wait_for_run(r.dag_id, r.run_id, timeout=900)
    assert state == "success", topology.log_tails(60)
    stop = r.coord.stop_request()
    assert stop is not None and stop.mode.value == "drain" and stop.state.value == "COMPLETED"
    for stage in (*BRANCHES, "publish"):
        eod = topology.xcom(r.dag_id, r.run_id, stage, key="end_of_data")
        assert eod["drain"] is True, (stage, eod)
    views = r.coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    for stage in BRANCHES:
        assert len(views[stage].progress.finished_splits) == 2, stage
    r.assert_exactly_once()
