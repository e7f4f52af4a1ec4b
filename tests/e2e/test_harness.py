"""Proves the e2e harness itself against a real Airflow 3 cluster (LocalExecutor, PostgreSQL):
a SIGKILLed task process is retried, a deferred task completes through the real triggerer (also
across a triggerer crash), and the SimpleAuthManager roles behave as documented."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from .airflow_cluster import AirflowCluster, wait_until

pytestmark = pytest.mark.postgres

SMOKE_DAGS = Path(__file__).parent / "dags"
KILL_DAG = "e2e_smoke_kill"
DEFER_DAG = "e2e_smoke_defer"


@pytest.fixture(scope="module")
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    return airflow_cluster([SMOKE_DAGS], expect_dags=[KILL_DAG, DEFER_DAG])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_cluster_is_up(cluster: AirflowCluster) -> None:
    health = cluster.health()
    for key in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
        assert health[key]["status"] == "healthy", health
    assert cluster.startup_seconds is not None
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in cluster.startup_phases.items())
    print(f"\n[airflow-e2e] start-up {cluster.startup_seconds:.1f}s (cumulative: {phases})")
    for component in ("api-server", "scheduler", "triggerer", "dag-processor"):
        assert cluster.component_pid(component) is not None, component
    own = {p.pid for p in cluster.processes()}
    assert {cluster.component_pid(c) for c in ("scheduler", "triggerer")} <= own


def test_sigkilled_task_process_is_retried(cluster: AirflowCluster, tmp_path: Path) -> None:
    progress = tmp_path / "progress.txt"
    run_id = cluster.trigger_dag(KILL_DAG, conf={"progress_file": str(progress)})
    wait_until(
        lambda: "attempt=1 tick=1" in _lines(progress),
        timeout=120,
        message=lambda: f"first try progress (file: {_lines(progress)})",
    )

    killed = cluster.kill_task_process(KILL_DAG, run_id, "sleeper", try_number=1)
    assert killed.cmdline == f"airflow worker -- {killed.ti_id}"
    assert _lines(progress)[0] == f"attempt=1 pid={killed.pid} start"

    t0 = time.monotonic()
    assert cluster.wait_for_run(KILL_DAG, run_id, timeout=120) == "success"
    print(f"\n[airflow-e2e] kill -> run success in {time.monotonic() - t0:.1f}s")

    ti = cluster.task_instance(KILL_DAG, run_id, "sleeper")
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    assert str(ti["id"]) != killed.ti_id  # every try has its own TI id
    tries = {t["try_number"]: t["state"] for t in cluster.task_tries(KILL_DAG, run_id, "sleeper")}
    assert tries[2] == "success" and tries[1] != "success", tries

    lines = _lines(progress)
    starts = [line for line in lines if line.endswith(" start")]
    assert [s.split()[0] for s in starts] == ["attempt=1", "attempt=2"], lines
    assert "attempt=1 done" not in lines and lines[-1] == "attempt=2 done", lines
    assert f"pid={killed.pid}" not in starts[1]

    first = cluster.logs(KILL_DAG, run_id, "sleeper", 1)
    second = cluster.logs(KILL_DAG, run_id, "sleeper", 2)
    assert "SIGKILL" in first and "Done." in second
    print(f"[airflow-e2e] try 1 log ends: {first.splitlines()[-1][:200]}")


def test_deferred_task_completes_via_triggerer(cluster: AirflowCluster, tmp_path: Path) -> None:
    progress = tmp_path / "defer.txt"
    # The trigger fires well after the deferring process exited: a trigger firing before the
    # scheduler processed that exit fails the task (apache/airflow#71580 / #72716, Airflow 3.3)
    run_id = cluster.trigger_dag(DEFER_DAG, conf={"progress_file": str(progress), "seconds": 12})
    ti = cluster.wait_for_task(DEFER_DAG, run_id, "deferred", ("deferred",), interval=0.2)
    assert ti["trigger"] and "temporal" in ti["trigger"]["classpath"], ti["trigger"]

    assert cluster.wait_for_run(DEFER_DAG, run_id, timeout=90) == "success"
    lines = _lines(progress)
    assert lines[0].startswith("deferring try=1") and lines[1].startswith("resumed try=1"), lines
    ti = cluster.task_instance(DEFER_DAG, run_id, "deferred")
    assert (ti["state"], ti["try_number"]) == ("success", 1)
    # The trigger really ran in the triggerer: it writes its own log next to the task's.
    task_logs = cluster.logs_dir / f"dag_id={DEFER_DAG}" / f"run_id={run_id}" / "task_id=deferred"
    trigger_logs = [p.read_text() for p in task_logs.glob("attempt=1.log.trigger.*.log")]
    assert any("Trigger fired event" in text for text in trigger_logs), trigger_logs


def test_deferred_task_survives_triggerer_crash(cluster: AirflowCluster, tmp_path: Path) -> None:
    progress = tmp_path / "defer-crash.txt"
    run_id = cluster.trigger_dag(DEFER_DAG, conf={"progress_file": str(progress), "seconds": 14})
    cluster.wait_for_task(DEFER_DAG, run_id, "deferred", ("deferred",), interval=0.2)
    old_pid = cluster.component_pid("triggerer")

    t0 = time.monotonic()
    cluster.restart("triggerer")  # SIGKILL of the whole triggerer tree, then start again
    assert cluster.component_pid("triggerer") not in (None, old_pid)
    assert cluster.wait_for_run(DEFER_DAG, run_id, timeout=120) == "success"
    print(f"\n[airflow-e2e] triggerer crash -> run success in {time.monotonic() - t0:.1f}s")
    lines = _lines(progress)
    assert [line.split()[0] for line in lines] == ["deferring", "resumed"], lines


def test_scheduler_crash_mid_task_recovers(cluster: AirflowCluster, tmp_path: Path) -> None:
    """SIGKILL of the scheduler's whole tree (LocalExecutor workers and the running task die
    with it, like a pod crash); the new scheduler fails the orphaned try and the retry wins."""
    progress = tmp_path / "scheduler-crash.txt"
    run_id = cluster.trigger_dag(KILL_DAG, conf={"progress_file": str(progress)})
    wait_until(lambda: "attempt=1 tick=1" in _lines(progress), timeout=120, message="try 1")
    task_pid = int(_lines(progress)[0].split("pid=")[1].split()[0])

    t0 = time.monotonic()
    cluster.restart("scheduler")
    assert not psutil.pid_exists(task_pid) or psutil.Process(task_pid).status() == "zombie"
    assert cluster.wait_for_run(KILL_DAG, run_id, timeout=150) == "success"
    print(f"\n[airflow-e2e] scheduler crash -> run success in {time.monotonic() - t0:.1f}s")
    ti = cluster.task_instance(KILL_DAG, run_id, "sleeper")
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    assert _lines(progress)[-1] == "attempt=2 done"


def test_users_roles_and_tokens(cluster: AirflowCluster) -> None:
    dag_path = f"/api/v2/dags/{DEFER_DAG}"
    assert cluster.request("GET", dag_path, user=None).status_code == 401
    # No credentials: 401. A token that does not verify: 403 (Airflow 3.3 behaviour).
    assert cluster.request("GET", dag_path, token="not-a-jwt").status_code == 403
    bad = cluster.http.post("/auth/token", json={"username": "admin", "password": "wrong"})
    assert bad.status_code == 401

    assert cluster.request("GET", dag_path, user="viewer").status_code == 200
    # VIEWER: read only; USER and above may edit DAGs and their runs.
    denied = cluster.request("PATCH", dag_path, user="viewer", json={"is_paused": True})
    assert denied.status_code == 403
    trigger = cluster.request(
        "POST", f"{dag_path}/dagRuns", user="viewer", json={"logical_date": None}
    )
    assert trigger.status_code == 403
    for user in ("user", "op", "admin"):
        resp = cluster.request("PATCH", dag_path, user=user, json={"is_paused": False})
        assert resp.status_code == 200, (user, resp.text)
