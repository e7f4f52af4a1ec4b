"""Clear recomputes, retry resumes (core.rerun) on a REAL Airflow (api-server, scheduler,
dag-processor, triggerer, LocalExecutor, PostgreSQL), on the stop tests' cluster:

- a clear of a succeeded stage after its logic changed recomputes it (the fixed output is
  there; before this rule the clear re-published the old output);
- a clear of a succeeded stage whose sink declares no slice fails at once (not retried) with
  the rule's message; after ``finalckpt reset`` the next clear appends, as asked;
- Asset events after clears: one per new commit (the recompute after the reset), none for a
  clear that committed nothing (a stage without a sink, a refused clear), and a failed stage
  cleared after its tries failed resumes, commits once and announces it once;
- a SIGKILL mid-stage is retried by Airflow and the retry resumes (it does not recompute the
  finished split);
- retention removes that real pipeline's files and store rows (``finalckpt gc
  --retention-days 0``), and ``finalckpt pipelines list --json`` parses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.repository import pipeline_of_dag_run

from .airflow_cluster import AirflowCluster
from .ui_cluster import _environment as ui_environment
from .ui_cluster import store_url as ui_store_url
from .ui_cluster import ui_cluster, wait_for

DAG = "finalckpt_e2e_rerun"
NUMBERS = {1, 2, 3, 4}


@pytest.fixture
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    c = ui_cluster(airflow_cluster)
    c.wait_for_dags([DAG])
    return c


def _work() -> Path:
    return ui_environment()[1] / "rerun"


def _coordinator(run_id: str) -> Coordinator:
    engine = make_engine(ui_store_url())
    key = pipeline_of_dag_run(engine, DAG, run_id)
    assert key is not None, f"no pipeline for {run_id}"
    return Coordinator(engine, key)


def _scaled_values(run_id: str) -> list[tuple[int, int]]:
    """(n, value) rows of ``scaled``'s committed output parts, sorted."""
    coord = _coordinator(run_id)
    view = coord.stage("scaled")
    assert view.lifecycle is StageLifecycle.CLOSED
    assert view.final_snapshot is not None and view.final_snapshot.end_of_data is not None
    storage = CheckpointStorage(str(ui_environment()[1] / "checkpoints"))
    base = Path(storage.pipeline_dir(coord.pipeline_key))
    frames = [pd.read_parquet(base / part) for part in view.final_snapshot.end_of_data.manifest]
    rows = pd.concat(frames)
    return sorted(zip(rows["n"].astype(int), rows["value"].astype(int), strict=True))


def _published_rows() -> int:
    return len(pd.read_parquet(_work() / "published"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    finalckpt = Path(sys.executable).with_name("finalckpt")
    env = {
        **os.environ,
        "AIRFLOW__FINALCKPT__STORE_URL": ui_store_url(),
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(ui_environment()[1] / "checkpoints"),
    }
    return subprocess.run(
        [str(finalckpt), *args], capture_output=True, text=True, env=env, timeout=120
    )


def _events(cluster: AirflowCluster, run_id: str) -> list[dict[str, Any]]:
    """The Asset events the DAG run's tasks emitted, oldest first (Airflow's REST API)."""
    events = cluster.api(
        "GET",
        "/api/v2/assets/events",
        params={"source_dag_id": DAG, "limit": 100, "order_by": "timestamp"},
    )["asset_events"]
    return [e for e in events if e["source_run_id"] == run_id]


def _announced(cluster: AirflowCluster, run_id: str) -> list[tuple[str, int]]:
    """(task, checkpoint id) of each Asset event of the DAG run."""
    return [(e["source_task_id"], e["extra"]["checkpoint_id"]) for e in _events(cluster, run_id)]


def _run(cluster: AirflowCluster) -> str:
    run_id = cluster.trigger_dag(DAG)
    assert cluster.wait_for_run(DAG, run_id, timeout=600) == "success"
    return run_id


def test_clear_of_a_succeeded_stage_recomputes_and_a_retry_resumes(
    cluster: AirflowCluster,
) -> None:
    work = _work()
    work.mkdir(parents=True, exist_ok=True)
    (work / "factor").write_text("2")
    run_id = _run(cluster)
    assert _scaled_values(run_id) == [(n, 2 * n) for n in sorted(NUMBERS)]
    first_try = cluster.task_instance(DAG, run_id, "scaled")["try_number"]
    published = _published_rows()
    assert published == len(NUMBERS)
    [(task, first_commit)] = _announced(cluster, run_id)  # only the stage with a sink
    assert task == "published"

    # the logic changes; a clear of the succeeded stage recomputes it (no re-publication)
    (work / "factor").write_text("3")
    cluster.clear_task(DAG, run_id, "scaled")
    cluster.wait_for_task(
        DAG, run_id, "scaled", ("success",), try_number=first_try + 1, timeout=600
    )
    assert _scaled_values(run_id) == [(n, 3 * n) for n in sorted(NUMBERS)]
    log = cluster.logs(DAG, run_id, "scaled", first_try + 1)
    assert "was cleared after it succeeded" in log and "recomputing it from scratch" in log
    assert "no Spark job submitted" not in log
    assert _published_rows() == published  # its sibling was not cleared
    assert _announced(cluster, run_id) == [("published", first_commit)]  # scaled has no sink
    # the run ended again before the next clear: a clear while the scheduler marks the run
    # successful can be overwritten by it (seen at load 35: published stayed unscheduled)
    assert cluster.wait_for_run(DAG, run_id, timeout=600) == "success"

    # a sink without a declared slice: the clear fails at once, naming the ways out
    pub_try = cluster.task_instance(DAG, run_id, "published")["try_number"]
    cluster.clear_task(DAG, run_id, "published")
    failed = cluster.wait_for_task(DAG, run_id, "published", ("failed",), timeout=600)
    assert failed["try_number"] == pub_try + 1  # permanent: not retried
    log = cluster.logs(DAG, run_id, "published", pub_try + 1)
    assert "which declare no slice" in log and f"finalckpt reset {DAG} {run_id}" in log
    assert _published_rows() == published
    assert _announced(cluster, run_id) == [("published", first_commit)]  # refused: no commit
    assert cluster.wait_for_run(DAG, run_id, timeout=600) == "failed"
    # accepting an append: reset, then clear again
    reset = _cli("reset", DAG, run_id, "--stage", "published", "--direct-store")
    assert reset.returncode == 0, reset.stderr
    assert "reset stages published" in reset.stdout
    cluster.clear_task(DAG, run_id, "published")
    cluster.wait_for_task(
        DAG, run_id, "published", ("success",), try_number=pub_try + 2, timeout=600
    )
    assert _published_rows() == 2 * published
    # the recompute committed again: exactly one more event, for its own checkpoint
    announced = _announced(cluster, run_id)
    assert len(announced) == 2 and announced[0] == ("published", first_commit), announced
    assert announced[1][0] == "published" and announced[1][1] > first_commit, announced

    # a SIGKILL mid-stage: Airflow retries, the retry resumes from the finished split
    (work / "hold").write_text("1")
    (work / "first-batch-done").unlink(missing_ok=True)
    (work / "held").unlink(missing_ok=True)
    killed_run = cluster.trigger_dag(DAG)
    wait_for(lambda: (work / "held").exists(), "scaled held after its first batch", timeout=600)
    killed = cluster.kill_task_process(DAG, killed_run, "scaled", tree=True)
    (work / "hold").unlink()  # only now: the killed try never got past its first batch
    assert cluster.wait_for_run(DAG, killed_run, timeout=600) == "success"
    log = cluster.logs(DAG, killed_run, "scaled", killed.try_number + 1)
    assert "1 of 4 splits already finished, 3 to process" in log
    assert "recomputing" not in log
    assert _scaled_values(killed_run) == [(n, 3 * n) for n in sorted(NUMBERS)]

    # retention of a real pipeline: expired now, its files and rows go, the list parses
    key = _coordinator(killed_run).pipeline_key
    pipeline_dir = ui_environment()[1] / "checkpoints" / key
    assert pipeline_dir.is_dir()
    gc = _cli("gc", "--pipeline", key, "--retention-days", "0", "--json")
    assert gc.returncode == 0, gc.stderr
    removed = json.loads(gc.stdout)["retention"]["removed"]
    assert [r["pipeline_key"] for r in removed] == [key]
    assert removed[0]["files"] > 0 and removed[0]["store_rows"] > 0
    assert not pipeline_dir.exists()
    listed = _cli("pipelines", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    keys = {p["pipeline_key"] for p in json.loads(listed.stdout)["pipelines"]}
    assert key not in keys and _coordinator(run_id).pipeline_key in keys


def test_a_cleared_failed_stage_resumes_and_announces_its_one_commit_once(
    cluster: AirflowCluster,
) -> None:
    """``published`` fails after its first batch on both tries (the run fails, nothing is
    committed or announced); cleared, it resumes from that batch, commits once and emits one
    Asset event: none for the failed tries, none extra for the clear."""
    work = _work()
    work.mkdir(parents=True, exist_ok=True)
    (work / "published-first-batch").unlink(missing_ok=True)
    (work / "fail-published").write_text("1")
    before = _published_rows() if (work / "published").exists() else 0
    run_id = cluster.trigger_dag(DAG)
    try:
        assert cluster.wait_for_run(DAG, run_id, timeout=600) == "failed"
    finally:
        (work / "fail-published").unlink(missing_ok=True)
    failed = cluster.task_instance(DAG, run_id, "published")
    assert (failed["state"], failed["try_number"]) == ("failed", 2), failed  # 1 retry
    assert _announced(cluster, run_id) == [] and _published_rows() == before

    cluster.clear_task(DAG, run_id, "published")
    cluster.wait_for_task(DAG, run_id, "published", ("success",), try_number=3, timeout=600)
    log = cluster.logs(DAG, run_id, "published", 3)
    assert "recomputing" not in log  # a clear of a failed stage resumes
    assert _published_rows() == before + len(NUMBERS)  # every row once
    closed_on = _coordinator(run_id).stage("published").closed_checkpoint_id
    assert _announced(cluster, run_id) == [("published", closed_on)]
