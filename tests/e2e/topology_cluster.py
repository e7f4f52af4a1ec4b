"""The topology tier's deployment: an Airflow 3 cluster run the way the official Helm chart runs
it with the CeleryExecutor, on 127.0.0.1 (tests/e2e/test_topology.py, docs/deploying.md).

Beside ``AirflowCluster``'s api-server, scheduler, dag-processor and triggerer (one metadata
database on PostgreSQL), it starts:

- a private ``redis-server`` on a free port, keeping nothing on disk (``--save ''``,
  ``--appendonly no``), as the Celery broker; ``restart_redis`` restarts it empty (a broker
  pod restarted without persistence: every queued message is lost);
- two ``airflow celery worker`` processes ("pods") with different ``--celery-hostname``s, each
  with its own ``AIRFLOW_HOME``, working directory, ``HOME``, ``TMPDIR``, Spark local
  directory, log folder and log-server port, and its own task-instance hostname (the
  ``[core] hostname_callable`` returns the pod's name, as each pod's own hostname would).

What both workers see, as a Helm user gives it to them on purpose:

- the DAG folder, read-only (git-sync's volume);
- ``data_dir``, standing for a ReadWriteMany PersistentVolumeClaim (``finalckpt-data``)
  mounted at the same path in every worker: the example's input files, the checkpoint
  storage and the sinks' tables. The object store this would be is not run here: its fsspec
  driver (s3fs) needs botocore, which pins python-dateutil<3, and constraints/newest.txt pins
  4.0.0 (docs/deploying.md);
- ``control_dir``: the tests' gate files (test control only; no product code reads it).

The Celery result backend is the metadata database (the chart's default), the task-instance
heartbeat timeout 30 s (AirflowCluster's), so a SIGKILLed worker's tasks are failed and
retried within about a minute.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from .airflow_cluster import (
    AirflowCluster,
    ClusterError,
    _airflow_argv,
    _Component,
    _descendants,
    _kill_procs,
    _tail,
    free_port,
    wait_until,
)

WORKERS = ("worker-a", "worker-b")
#: the ``[core] hostname_callable`` of the workers: the pod name from the environment
HOSTNAME_CALLABLE = "tests.e2e.topology_hostname.pod_hostname"
REPO = Path(__file__).resolve().parents[2]


class TopologyCluster(AirflowCluster):
    """AirflowCluster with the CeleryExecutor, a private Redis and two Celery workers."""

    def __init__(
        self,
        dag_paths: Sequence[str | os.PathLike[str]] = (),
        *,
        workers: Sequence[str] = WORKERS,
        worker_concurrency: int = 2,
        extra_env: Mapping[str, str] | None = None,
        expect_dags: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dag_paths,
            extra_env=extra_env,
            expect_dags=expect_dags,
            python_path=[REPO],
            **kwargs,
        )
        self.worker_names = list(workers)
        self.worker_concurrency = worker_concurrency
        self.redis_port = 0
        self.data_dir = self.home / "pvc" / "finalckpt-data"
        self.control_dir = self.home / "test-control"

    # ------------------------------------------------------------------------- lifecycle

    def start(self) -> TopologyCluster:
        if self._started:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.control_dir.mkdir(parents=True, exist_ok=True)
        self.redis_port = free_port()
        super().start()
        try:
            self._start_redis()
            for name in self.worker_names:
                self._register_worker(name)
                self.start_component(name)
            for name in self.worker_names:
                self.wait_worker_ready(name)
            self._make_dags_read_only()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def _build_env(self) -> dict[str, str]:
        env = super()._build_env()
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                # the chart's default: results in the metadata database
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + (self.db_url or ""),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
                "AIRFLOW__CELERY__OPERATION_TIMEOUT": "5",
                "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
                "FINALCKPT_TOPOLOGY_DATA": str(self.data_dir),
                "FINALCKPT_TOPOLOGY_CONTROL": str(self.control_dir),
            }
        )
        env.update(self.extra_env)
        return env

    def _start_redis(self) -> None:
        redis_dir = self.home / "redis"
        redis_dir.mkdir(exist_ok=True)
        argv = [
            "redis-server",
            "--port",
            str(self.redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(redis_dir),
        ]
        comp = _Component("redis", argv, self.component_logs_dir / "redis.log", cwd=redis_dir)
        self._components["redis"] = comp
        self.start_component("redis")
        self._wait_redis()

    def _wait_redis(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=2)

        def pong() -> bool:
            self._check_alive(["redis"])
            with contextlib.suppress(redis.RedisError):
                return bool(client.ping())
            return False

        try:
            wait_until(pong, timeout=30, interval=0.2, message="redis-server answering PING")
        finally:
            client.close()

    def restart_redis(self) -> None:
        """SIGKILL the broker and start it again, empty (no persistence: queued tasks lost)."""
        self.kill("redis")
        self.start_component("redis")
        self._wait_redis()

    def _register_worker(self, name: str) -> None:
        pod = self.home / "pods" / name
        dirs = {key: pod / key for key in ("home", "airflow", "tmp", "logs", "spark", "work")}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        env.update(
            {
                "AIRFLOW_HOME": str(dirs["airflow"]),
                "HOME": str(dirs["home"]),
                "TMPDIR": str(dirs["tmp"]),
                "SPARK_LOCAL_DIRS": str(dirs["spark"]),
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(dirs["logs"]),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE,
                "FINALCKPT_TOPOLOGY_POD": name,
            }
        )
        argv = [
            *_airflow_argv(),
            "celery",
            "worker",
            "--celery-hostname",
            name,
            "--concurrency",
            str(self.worker_concurrency),
            "--without-mingle",
            "--without-gossip",
        ]
        log = self.component_logs_dir / f"{name}.log"
        self._components[name] = _Component(name, argv, log, env=env, cwd=dirs["work"])

    def worker_logs_dir(self, name: str) -> Path:
        return self.home / "pods" / name / "logs"

    def _make_dags_read_only(self) -> None:
        """What git-sync gives the pods: files nobody writes (``add_dags`` replaces a file
        whole, which a read-only file allows)."""
        for path in self.dags_folder.rglob("*"):
            if path.is_file():
                path.chmod(0o444)

    # ------------------------------------------------------------------------- workers

    def worker_alive(self, name: str) -> bool:
        comp = self._components.get(name)
        return comp is not None and comp.alive

    def wait_worker_ready(self, name: str, *, since_start: int | None = None) -> None:
        """Wait until the worker's log says Celery is ready (of its latest start)."""
        comp = self._components[name]
        marker = f"===== [airflow-e2e] start #{comp.starts}"

        def ready() -> bool:
            self._check_alive([name])
            text = comp.log_path.read_text(errors="replace")
            return f"{name} ready." in text.rsplit(marker, 1)[-1]

        wait_until(
            ready,
            timeout=180,
            interval=0.5,
            message=lambda: f"celery worker {name} ready:\n{_tail(comp.log_path, 40)}",
        )

    def kill_worker_tree(self, name: str) -> list[int]:
        """SIGKILL a worker pod: its main process and every descendant (pool processes, the
        task supervisors, the task processes in their own groups, their Spark JVMs) at once.
        Returns the pids killed."""
        comp = self._components[name]
        if comp.popen is None or not comp.alive:
            raise ClusterError(f"{name} is not running")
        root = psutil.Process(comp.popen.pid)
        tree = [root, *_descendants(root.pid)]
        _kill_procs(tree, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(comp.popen.pid, signal.SIGKILL)
        comp.popen.wait(timeout=30)
        psutil.wait_procs(tree, timeout=10)
        return [p.pid for p in tree]

    def start_worker(self, name: str) -> None:
        self.start_component(name)
        self.wait_worker_ready(name)

    def worker_processes(self, name: str) -> list[psutil.Process]:
        comp = self._components[name]
        if comp.popen is None or not comp.alive:
            return []
        return [psutil.Process(comp.popen.pid), *_descendants(comp.popen.pid)]

    def signal_worker(self, name: str, sig: int) -> None:
        comp = self._components[name]
        if comp.popen is None or not comp.alive:
            raise ClusterError(f"{name} is not running")
        comp.popen.send_signal(sig)

    def wait_worker_exit(self, name: str, timeout: float = 300) -> int:
        comp = self._components[name]
        assert comp.popen is not None
        try:
            return comp.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{name} did not exit within {timeout:.0f}s") from exc

    def log_tails(self, lines: int | None = None) -> str:
        """The cluster's log tails, then each worker pod's task logs."""
        n = lines or self.log_tail_lines
        parts = [super().log_tails(lines)]
        for name in self.worker_names:
            for path in sorted(self.worker_logs_dir(name).rglob("*.log")):
                parts.append(f"----- {name}: {path.relative_to(self.home)} (last {n}) -----")
                parts.append(_tail(path, n))
        return "\n".join(parts)
