"""A real multi-process Spark cluster for tests: a standalone master and two workers on 127.0.0.1,
started from the installed pyspark (``spark-class ...Master`` / ``...Worker``), and a local Spark
Connect server (``spark-submit --class ...SparkConnectServer``).

Every daemon is a separate JVM with small memory (the CI box has 2 cores); ports are free
loopback ports picked at start-up. Workers are registered before a test sees the cluster (the
master's ``/json/`` document lists them ALIVE). Everything is killed at teardown. Airflow's own
settings point to a temporary AIRFLOW_HOME (the Spark provider's hook imports Airflow).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="finalckpt-cluster-airflow-home-"))
if "airflow.settings" not in sys.modules:
    os.environ.setdefault("AIRFLOW_HOME", str(_HOME))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import pyspark  # noqa: E402

SPARK_HOME = os.path.dirname(pyspark.__file__)
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DRIVER_MEMORY = "1g"  # a smaller heap fails Spark's minimum system memory check
PYTHON = sys.executable
#: The suite's JVM flags (tests/conftest.py sets them as SPARK_SUBMIT_OPTS, which only
#: spark-submit reads) for the cluster's daemons (SPARK_DAEMON_JAVA_OPTS) and, through the
#: tests' Spark conf, for its executors and cluster-mode drivers; without its ``-Dspark.*``
#: defaults (Spark refuses them in ``extraJavaOptions``; the tests set their own conf).
JVM_OPTS = " ".join(
    opt for opt in os.environ.get("SPARK_SUBMIT_OPTS", "").split() if not opt.startswith("-Dspark.")
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def spark_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": SPARK_HOME,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
            "PYSPARK_PYTHON": PYTHON,
            "PYSPARK_DRIVER_PYTHON": PYTHON,
            # spark-submit must find the venv's scripts first.
            "PATH": os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", ""),
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)


def start_daemon(name: str, args: list[str], workdir: Path, env: dict[str, str]) -> Daemon:
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,  # its own process group: killpg reaches the JVM
        )
    return Daemon(name, proc, log)


@dataclass
class StandaloneCluster:
    """A Spark standalone master with two workers, all on 127.0.0.1."""

    workdir: Path
    master_port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    rest_port: int = field(default_factory=free_port)
    master: Daemon | None = None
    workers: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as r:
            return dict(json.loads(r.read()))

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            return [w for w in self.state()["workers"] if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def start(self) -> StandaloneCluster:
        class_cmd = os.path.join(SPARK_HOME, "bin", "spark-class")
        env = spark_env({"SPARK_MASTER_OPTS": f"-Dspark.master.rest.port={self.rest_port}"})
        self.master = start_daemon(
            "master",
            [
                class_cmd,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.webui_port),
            ],
            self.workdir,
            env,
        )
        wait_until(self._master_up, 90, "the Spark master")
        for index in range(2):
            self.start_worker(index)
        wait_until(lambda: len(self.alive_workers()) >= 2, 90, "two registered workers")
        return self

    def _master_up(self) -> bool:
        assert self.master is not None
        if self.master.proc.poll() is not None:
            raise RuntimeError(f"Spark master exited:\n{self.master.tail()}")
        try:
            return self.state().get("status") == "ALIVE"
        except OSError:
            return False

    def start_worker(self, index: int) -> Daemon:
        class_cmd = os.path.join(SPARK_HOME, "bin", "spark-class")
        work_dir = self.workdir / f"worker{index}"
        work_dir.mkdir(exist_ok=True)
        worker = start_daemon(
            f"worker{index}-{len(self.workers)}",
            [
                class_cmd,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                "1",
                "--memory",
                WORKER_MEMORY,
                "--work-dir",
                str(work_dir),
                self.url,
            ],
            self.workdir,
            spark_env(),
        )
        self.workers.append(worker)
        return worker

    def live_worker_daemons(self) -> list[Daemon]:
        return [w for w in self.workers if w.proc.poll() is None]

    def ensure_two_workers(self) -> None:
        """After a test killed a worker: start a replacement, wait until it registered."""
        while len(self.live_worker_daemons()) < 2:
            self.start_worker(len(self.workers))
        wait_until(lambda: len(self.alive_workers()) >= 2, 90, "two registered workers")

    def stop(self) -> None:
        for daemon in [*self.workers, *([self.master] if self.master else [])]:
            daemon.kill(signal.SIGTERM)
            daemon.kill(signal.SIGKILL)


@pytest.fixture(scope="package")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A running standalone master with two registered workers (1 core, 1 GiB each)."""
    if shutil.which("java") is None:
        pytest.fail("Java 17 is required for the Spark cluster tests (java not on PATH)")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        cluster.start()
    except BaseException:
        logs = "\n".join(d.tail() for d in [*cluster.workers, *filter(None, [cluster.master])])
        cluster.stop()
        raise RuntimeError(f"the Spark standalone cluster did not start:\n{logs}") from None
    yield cluster
    cluster.stop()


@dataclass
class ConnectServer:
    url: str
    daemon: Daemon


@pytest.fixture(scope="package")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A local Spark Connect server (``local[1]``) from the pyspark distribution's connect jar."""
    jars = os.listdir(os.path.join(SPARK_HOME, "jars"))
    if not any(j.startswith("spark-connect_") for j in jars):
        pytest.fail(f"no spark-connect jar in {SPARK_HOME}/jars: cannot start a Connect server")
    workdir = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    daemon = start_daemon(
        "connect",
        [
            os.path.join(SPARK_HOME, "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[1]",
            "--driver-memory",
            DRIVER_MEMORY,
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "spark-internal",
        ],
        workdir,
        # spark-submit sizes the Connect server like a daemon (SPARK_DAEMON_MEMORY).
        spark_env({"SPARK_DAEMON_MEMORY": DRIVER_MEMORY}),
    )

    def up() -> bool:
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"Spark Connect server exited:\n{daemon.tail()}")
        return "Spark Connect server started" in daemon.log.read_text(errors="replace")

    try:
        wait_until(up, 120, "the Spark Connect server")
    except BaseException:
        daemon.kill()
        raise
    yield ConnectServer(f"sc://127.0.0.1:{port}", daemon)
    daemon.kill(signal.SIGTERM)
    daemon.kill(signal.SIGKILL)


@pytest.fixture(scope="session")
def airflow_dags_folder() -> Path:
    """Airflow's metadata database migrated (``dag.test()`` needs it) and its dags folder.

    Alone, this is the cluster tests' own AIRFLOW_HOME; in a pytest process that collected
    ``tests/airflow`` first, its temporary home (configured before Airflow was imported)."""
    from airflow import settings
    from airflow.configuration import conf
    from airflow.utils import db

    if settings.engine is None:
        settings.configure_orm()
    db.upgradedb()
    folder = Path(conf.get("core", "dags_folder"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
