"""A real Airflow 3.3 deployment for end-to-end tests: api-server, scheduler (LocalExecutor),
triggerer and dag-processor as separate OS processes over a fresh PostgreSQL metadata database.

Usage::

    with AirflowCluster([Path("tests/e2e/dags")], expect_dags=["e2e_smoke_kill"]) as cluster:
        run_id = cluster.trigger_dag("e2e_smoke_kill", conf={"x": 1})
        assert cluster.wait_for_run("e2e_smoke_kill", run_id) == "success"

Isolation: every cluster has its own temporary AIRFLOW_HOME, metadata database, free loopback
ports (api-server, worker and triggerer log servers) and JWT/fernet secrets, and every process it
spawns carries the environment marker ``FINALCKPT_E2E_CLUSTER=<id>``. The marker is what makes
clean-up and task-process lookup robust: the task runner puts each task child in its own process
group, so killing the scheduler's process group alone would leak it. See docs/testing.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
import psutil

from tests.spark_cds import with_spark_cds

MARKER_ENV = "FINALCKPT_E2E_CLUSTER"
DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
COMPONENTS: tuple[str, ...] = ("api-server", "dag-processor", "scheduler", "triggerer")
# monitor/health key and heartbeat field of each component (api-server answers the request).
_HEALTH_KEYS = {
    "scheduler": ("scheduler", "latest_scheduler_heartbeat"),
    "triggerer": ("triggerer", "latest_triggerer_heartbeat"),
    "dag-processor": ("dag_processor", "latest_dag_processor_heartbeat"),
}
TERMINAL_RUN_STATES = ("success", "failed")

# name -> (role, password). Roles of the SimpleAuthManager, lowest to highest:
# VIEWER (read only), USER (+ edit DAGs and their runs), OP (+ pools, connections, variables...),
# ADMIN (everything).
DEFAULT_USERS: dict[str, tuple[str, str]] = {
    "admin": ("ADMIN", "admin"),
    "op": ("OP", "op"),
    "user": ("USER", "user"),
    "viewer": ("VIEWER", "viewer"),
}

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The cluster failed to start, a component died, or a wait timed out."""


class ApiError(ClusterError):
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        request = response.request
        super().__init__(
            f"{request.method} {request.url} -> {response.status_code}: {response.text[:2000]}"
        )


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.5,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned), or raise ClusterError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {text}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ----------------------------------------------------------------------------------- PostgreSQL


def pg_admin_url() -> Any:
    """The admin database (``FINALCKPT_TEST_PG_URL``, same variable as the rest of the suite)."""
    from sqlalchemy.engine import make_url

    url = make_url(os.environ.get("FINALCKPT_TEST_PG_URL") or DEFAULT_PG_ADMIN_URL)
    return url.set(drivername="postgresql+psycopg")


def _admin_engine() -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(
        pg_admin_url(),
        isolation_level="AUTOCOMMIT",  # CREATE/DROP DATABASE cannot run in a transaction
        poolclass=NullPool,
        connect_args={"connect_timeout": 5},
    )


def postgres_reachable() -> tuple[bool, str]:
    """(reachable, description) of the admin database."""
    from sqlalchemy import text

    admin = pg_admin_url()
    where = f"{admin.host}:{admin.port or 5432}/{admin.database}"
    try:
        engine = _admin_engine()
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return False, f"PostgreSQL not reachable at {where}: {first_line}"
    return True, where


def _create_database(name: str) -> str:
    from sqlalchemy import text

    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return pg_admin_url().set(database=name).render_as_string(hide_password=False)


def _clone_database(name: str, template: str) -> str:
    """A copy of ``template`` (no connection to it may be open): a file copy, far cheaper than
    ``airflow db migrate`` in a fresh Python process."""
    from sqlalchemy import text

    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        engine.dispose()
    return pg_admin_url().set(database=name).render_as_string(hide_password=False)


#: Migrated metadata databases of this process, by what the migration depends on (see
#: ``AirflowCluster._template_key``): the first cluster runs ``airflow db migrate`` and keeps a
#: copy; the next clusters with the same key start from a copy of it.
_TEMPLATES: dict[str, str] = {}


def drop_templates() -> None:
    """Drop this process's migrated template databases (at exit; ``reap_stale`` drops those of
    a process that could not)."""
    while _TEMPLATES:
        _key, name = _TEMPLATES.popitem()
        with contextlib.suppress(Exception):
            _drop_database(name)


atexit.register(drop_templates)


def _drop_database(name: str) -> None:
    from sqlalchemy import text

    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            # FORCE (PostgreSQL 13+) ends the connections of processes we could not stop.
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


# ----------------------------------------------------------------------------------- processes


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    # a component with its own environment and working directory (a Celery worker "pod" of
    # tests/e2e/topology_cluster.py); None: the cluster's
    env: dict[str, str] | None = None
    cwd: Path | None = None
    started_at: float = 0.0
    starts: int = 0

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class KilledProcess:
    pid: int
    cmdline: str
    ti_id: str
    try_number: int
    signal: int
    extra_pids: list[int] = field(default_factory=list)


def _airflow_argv() -> list[str]:
    script = Path(sys.executable).parent / "airflow"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "airflow"]


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()).strip()  # setproctitle pads titles with spaces
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _kill_procs(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            proc.send_signal(sig)


_HOME_RE = re.compile(r"airflow_e2e_(\d+_[0-9a-f]{8})_")


def cluster_id_of(proc: psutil.Process) -> str | None:
    """The id of the cluster a process belongs to, or None.

    Every cluster process starts with its cwd in the cluster's AIRFLOW_HOME (named
    ``airflow_e2e_<cluster id>_...``) and inherits it; that is the primary marker. The
    ``FINALCKPT_E2E_CLUSTER`` environment variable is only a fallback: Airflow calls
    setproctitle, which overwrites /proc/<pid>/environ of almost every Airflow process.
    """
    with contextlib.suppress(psutil.Error, OSError):
        match = _HOME_RE.search(proc.cwd())
        if match:
            return match.group(1)
    with contextlib.suppress(psutil.Error, OSError):
        return proc.environ().get(MARKER_ENV)
    return None


def _own_processes() -> Iterator[psutil.Process]:
    """Live, non-zombie processes of this user, except the current one."""
    uid = os.getuid()
    me = os.getpid()
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            if proc.pid == me or proc.info["uids"].real != uid:
                continue
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, TypeError):
            continue
        yield proc


def _atomic_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:6]}.tmp")  # not *.py: not parsed
    shutil.copyfile(src, tmp)  # fresh mtime: the dag-processor re-parses files changed since
    os.replace(tmp, dest)


def _dag_files(src: Path) -> list[Path]:
    """Files to copy, relative to ``src`` (a directory) or ``[name]`` (a file)."""
    if not src.is_dir():
        return [Path(src.name)]
    return [
        path.relative_to(src)
        for path in sorted(src.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


# ----------------------------------------------------------------------------------- the cluster


class AirflowCluster:
    """A disposable Airflow 3 deployment (see module docstring). Not thread-safe."""

    def __init__(
        self,
        dag_paths: Sequence[str | os.PathLike[str]] = (),
        *,
        extra_env: Mapping[str, str] | None = None,
        expect_dags: Iterable[str] = (),
        users: Mapping[str, tuple[str, str]] | None = None,
        database: Literal["postgres", "sqlite"] = "postgres",
        parallelism: int = 4,
        python_path: Sequence[str | os.PathLike[str]] = (),
        components: Sequence[str] = COMPONENTS,
        startup_timeout: float = 180.0,
        keep_home: bool | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        log_tail_lines: int = 80,
        reuse_migrated_db: bool = True,
    ) -> None:
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)}; known: {COMPONENTS}")
        self.dag_paths = [Path(p).resolve() for p in dag_paths]
        self.extra_env = dict(extra_env or {})
        self.expect_dags = list(expect_dags)
        self.users = dict(DEFAULT_USERS if users is None else users)
        self.database = database
        self.parallelism = parallelism
        self.python_path = [str(Path(p).resolve()) for p in python_path]
        self.component_names = [c for c in COMPONENTS if c in components]
        self.startup_timeout = startup_timeout
        if keep_home is None:
            keep_home = os.environ.get("FINALCKPT_E2E_KEEP") == "1"
        self.keep_home = keep_home
        self.log_tail_lines = log_tail_lines
        self.reuse_migrated_db = reuse_migrated_db and database == "postgres"
        self.migrated_from_template = False

        self.cluster_id = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.home = Path(tempfile.mkdtemp(prefix=f"airflow_e2e_{self.cluster_id}_", dir=base_dir))
        self.dags_folder = self.home / "dags"
        self.logs_dir = self.home / "logs"
        self.component_logs_dir = self.logs_dir / "components"
        self.db_name: str | None = None
        self.db_url: str | None = None
        self.api_port = 0
        self.base_url = ""
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None
        self.startup_phases: dict[str, float] = {}
        self.spark_cds_seconds = 0.0
        self._spark_cds = False
        self._spark_opts = ""
        self.failed = False
        self.killed: list[KilledProcess] = []
        self._components: dict[str, _Component] = {}
        self._http: httpx.Client | None = None
        self._tokens: dict[str, str] = {}
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> AirflowCluster:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(failed=exc_type is not None)

    def start(self) -> AirflowCluster:
        if self._started:
            return self
        self._started = True
        # once per machine, not part of the start-up (timeout): the Spark drivers' CDS archive
        built = time.monotonic()
        spark_opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
        self._spark_opts = with_spark_cds(spark_opts)  # tests/conftest.py may have added it
        self._spark_cds = self._spark_opts != spark_opts or "SharedArchiveFile" in spark_opts
        self.spark_cds_seconds = time.monotonic() - built
        t0 = time.monotonic()
        try:
            self._prepare_home()
            self._create_metadata_db()
            self.env = self._build_env()
            if not self.migrated_from_template:
                self._migrate()
                self._keep_template()
            self.startup_phases["db"] = time.monotonic() - t0
            self._http = httpx.Client(base_url=self.base_url, timeout=30.0)
            for name in self.component_names:
                self.start_component(name)
            self.wait_healthy(timeout=self.startup_timeout)
            self.startup_phases["healthy"] = time.monotonic() - t0
            if self.expect_dags:
                remaining = self.startup_timeout - (time.monotonic() - t0)
                self.wait_for_dags(self.expect_dags, timeout=max(remaining, 30.0))
                self.startup_phases["dags"] = time.monotonic() - t0
        except BaseException:
            self.stop(failed=True)
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self, *, failed: bool = False) -> None:
        """Stop every process (SIGTERM, then SIGKILL), drop the database, remove the home.

        The home (with all logs) is kept, and log tails are printed, when ``failed`` (or a test
        marked the cluster as failed) or ``keep_home``/``FINALCKPT_E2E_KEEP=1``.
        """
        if self._stopped:
            return
        self._stopped = True
        self.failed = self.failed or failed
        if self._http is not None:
            self._http.close()
            self._http = None
        if failed:  # a test that failed has printed them already (conftest)
            print(self.log_tails(), file=sys.stderr)
        self._terminate_all()
        if self.db_name is not None:
            try:
                _drop_database(self.db_name)
            except Exception as exc:
                print(f"[airflow-e2e] could not drop {self.db_name}: {exc}", file=sys.stderr)
        if self.failed or self.keep_home:
            print(f"[airflow-e2e] kept AIRFLOW_HOME with logs: {self.home}", file=sys.stderr)
        else:
            shutil.rmtree(self.home, ignore_errors=True)

    def _prepare_home(self) -> None:
        self.dags_folder.mkdir(parents=True)
        (self.home / "plugins").mkdir()
        self.component_logs_dir.mkdir(parents=True)
        seen: dict[Path, Path] = {}
        for src in self.dag_paths:
            for rel in _dag_files(src):
                if rel in seen:
                    raise ClusterError(f"{rel} is provided by both {seen[rel]} and {src}")
                seen[rel] = src
            self.add_dags(src)
        passwords = {name: password for name, (_role, password) in self.users.items()}
        (self.home / "passwords.json").write_text(json.dumps(passwords) + "\n")

    def _create_metadata_db(self) -> None:
        if self.database == "sqlite":
            self.db_url = f"sqlite:///{self.home / 'airflow.db'}"
            return
        ok, where = postgres_reachable()
        if not ok:
            raise ClusterError(where)
        name = f"airflow_e2e_{self.cluster_id}"
        template = _TEMPLATES.get(self._template_key()) if self.reuse_migrated_db else None
        if template is not None:
            self.db_url = _clone_database(name, template)
            self.migrated_from_template = True
        else:
            self.db_url = _create_database(name)
        self.db_name = name

    def _template_key(self) -> str:
        """What ``airflow db migrate`` writes besides the schema depends on: the admin database
        and the settings it reads (default pool size, log templates, external DB managers)."""
        relevant = ("AIRFLOW__CORE__", "AIRFLOW__DATABASE__", "AIRFLOW__LOGGING__")
        settings = sorted((k, v) for k, v in self.extra_env.items() if k.startswith(relevant))
        return repr((str(pg_admin_url()), settings))

    def _keep_template(self) -> None:
        """After the first migration: copy the fresh database as this process's template."""
        if not self.reuse_migrated_db or self.db_name is None:
            return
        key = self._template_key()
        if key in _TEMPLATES:
            return
        template = f"airflow_e2e_{os.getpid()}_template{len(_TEMPLATES)}"
        try:
            _clone_database(template, self.db_name)
        except Exception as exc:  # e.g. a connection still open: migrate next time
            print(f"[airflow-e2e] no template database: {exc}", file=sys.stderr)
            return
        _TEMPLATES[key] = template

    def _build_env(self) -> dict[str, str]:
        from cryptography.fernet import Fernet

        self.api_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        assert self.db_url is not None
        if self.database == "sqlite":
            async_url = self.db_url.replace("sqlite://", "sqlite+aiosqlite://", 1)
        else:
            # Airflow derives postgresql+asyncpg otherwise; psycopg 3 does async itself.
            async_url = self.db_url
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        users = ",".join(f"{name}:{role}" for name, (role, _pw) in self.users.items())
        cfg = {
            "AIRFLOW_HOME": str(self.home),
            MARKER_ENV: self.cluster_id,
            "PYTHONUNBUFFERED": "1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": async_url,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.home / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # One secret shared by every component: the scheduler signs the task tokens that
            # the api-server verifies; a per-process random default breaks task execution.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__EXPOSE_CONFIG": "True",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # Parse new DAG files quickly.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            # A file whose mtime is newer than its last parse is re-parsed within ~2 s whatever
            # this interval (see AirflowCluster.replace_dags for the exception).
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            # Default 30 s: a changed DAG would not get a new serialized version for up to 30 s
            # (and the api-server's DAG cache revalidates on the same interval).
            "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "1",
            # Fast reaction to crashes (defaults are minutes), still safe on 2 busy cores.
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "120",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "15",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
        }
        env.update(cfg)
        if self._spark_cds:  # the tasks' Spark drivers map their classes from it
            env["SPARK_SUBMIT_OPTS"] = self._spark_opts
        pythonpath = [*self.python_path]
        if os.environ.get("PYTHONPATH"):
            pythonpath.append(os.environ["PYTHONPATH"])
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        env.update(self.extra_env)
        return env

    def _migrate(self) -> None:
        log = self.component_logs_dir / "db-migrate.log"
        with log.open("wb") as out:
            proc = subprocess.run(
                [*_airflow_argv(), "db", "migrate"],
                env=self.env,
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=300,
                check=False,
            )
        if proc.returncode != 0:
            raise ClusterError(
                f"airflow db migrate failed ({proc.returncode}):\n{_tail(log, self.log_tail_lines)}"
            )

    # ------------------------------------------------------------------------- components

    def start_component(self, name: str) -> None:
        """(Re)start one component in its own session/process group, log appended to a file."""
        comp = self._components.get(name)
        if name not in COMPONENTS and comp is None:
            raise ValueError(f"unknown component {name!r}")
        if comp is None:
            argv = [*_airflow_argv(), name]
            if name == "api-server":
                argv += ["--host", "127.0.0.1", "--port", str(self.api_port)]
            comp = _Component(name, argv, self.component_logs_dir / f"{name}.log")
            self._components[name] = comp
        if comp.alive:
            raise ClusterError(f"{name} is already running (pid {comp.popen.pid})")  # type: ignore[union-attr]
        with comp.log_path.open("ab") as out:
            stamp = datetime.now(UTC).isoformat()
            out.write(f"\n===== [airflow-e2e] start #{comp.starts + 1} at {stamp} =====\n".encode())
            out.flush()
            comp.popen = subprocess.Popen(
                comp.argv,
                env=self.env if comp.env is None else comp.env,
                cwd=self.home if comp.cwd is None else comp.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        comp.starts += 1
        comp.started_at = time.time()

    def component_pid(self, name: str) -> int | None:
        comp = self._components.get(name)
        return comp.popen.pid if comp is not None and comp.alive else None  # type: ignore[union-attr]

    def kill(self, name: str, sig: int = signal.SIGKILL, *, timeout: float = 30.0) -> None:
        """Signal a component's whole process tree (its group plus every descendant, including
        task processes that live in their own groups) and wait until the main process is gone.

        With SIGKILL this is a host/pod crash: LocalExecutor workers and the tasks they run die
        with the scheduler; the triggerer's trigger runner dies with the triggerer."""
        comp = self._components.get(name)
        if comp is None or comp.popen is None:
            raise ClusterError(f"{name} was never started")
        pid = comp.popen.pid
        tree = _descendants(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        _kill_procs(tree, sig)
        try:
            comp.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            _kill_procs(_descendants(pid), signal.SIGKILL)
            comp.popen.wait(timeout=10)
        if sig == signal.SIGKILL:
            psutil.wait_procs(tree, timeout=10)

    def restart(
        self, name: str, sig: int = signal.SIGKILL, *, wait: bool = True, timeout: float = 90.0
    ) -> None:
        """Kill (default SIGKILL: crash) and start a component again; with ``wait``, return once
        it reports a heartbeat newer than the restart (api-server: once it answers)."""
        self.kill(name, sig)
        since = time.time()
        self.start_component(name)
        if wait:
            self.wait_healthy(components=[name], since=since, timeout=timeout)

    def _terminate_all(self, grace: float = 8.0) -> None:
        comps = [c for c in self._components.values() if c.popen is not None]
        tree: list[psutil.Process] = []
        for comp in comps:
            assert comp.popen is not None
            tree += _descendants(comp.popen.pid)
            if comp.alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(comp.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for comp in comps:
            assert comp.popen is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                comp.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for comp in comps:
            assert comp.popen is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(comp.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                comp.popen.wait(timeout=10)
        # Anything left: descendants in other groups (task runners), orphans reparented to init.
        leftovers = {p.pid: p for p in tree if p.is_running()}
        leftovers.update({p.pid: p for p in self.processes()})
        _kill_procs(leftovers.values(), signal.SIGKILL)
        psutil.wait_procs(list(leftovers.values()), timeout=10)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster (see ``cluster_id_of``)."""
        return [p for p in _own_processes() if cluster_id_of(p) == self.cluster_id]

    # ------------------------------------------------------------------------- waiting

    def health(self) -> dict[str, Any]:
        return self.api("GET", "/api/v2/monitor/health", auth=False)

    def _check_alive(self, names: Iterable[str]) -> None:
        for name in names:
            comp = self._components.get(name)
            if comp is not None and comp.popen is not None and not comp.alive:
                raise ClusterError(
                    f"{name} exited with {comp.popen.returncode}:\n"
                    f"{_tail(comp.log_path, self.log_tail_lines)}"
                )

    def wait_healthy(
        self,
        *,
        components: Sequence[str] | None = None,
        since: float | None = None,
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        """Wait until /api/v2/monitor/health reports the components healthy (with a heartbeat
        newer than ``since``, a ``time.time()``, when given)."""
        names = list(self.component_names if components is None else components)
        last: dict[str, Any] = {}

        def ready() -> bool:
            nonlocal last
            self._check_alive(names)
            try:
                last = self.health()
            except (httpx.HTTPError, ApiError):
                return False
            for name in names:
                if name == "api-server":
                    continue
                key, beat_field = _HEALTH_KEYS[name]
                info = last.get(key) or {}
                if info.get("status") != "healthy":
                    return False
                if since is not None:
                    beat = info.get(beat_field)
                    if not beat or datetime.fromisoformat(beat).timestamp() <= since:
                        return False
            return True

        wait_until(ready, timeout=timeout, message=lambda: f"health of {names}: {last}")
        return last

    def wait_for_dags(
        self, dag_ids: Iterable[str], *, timeout: float = 90.0, fail_on_import_errors: bool = True
    ) -> None:
        """Wait until the dag-processor serialized every DAG; fail fast on import errors."""
        pending = set(dag_ids)

        def parsed() -> bool:
            self._check_alive(self.component_names)
            for dag_id in sorted(pending):
                resp = self.request("GET", f"/api/v2/dags/{quote(dag_id, safe='')}")
                if resp.status_code == 200:
                    pending.discard(dag_id)
            if pending and fail_on_import_errors:
                errors = self.import_errors()
                if errors:
                    text = "\n".join(
                        f"{e.get('filename')}:\n{e.get('stack_trace')}" for e in errors
                    )
                    raise ClusterError(
                        f"DAG import errors (waiting for {sorted(pending)}):\n{text}"
                    )
            return not pending

        wait_until(parsed, timeout=timeout, interval=1.0, message=lambda: f"DAGs {sorted(pending)}")

    def import_errors(self) -> list[dict[str, Any]]:
        return self.api("GET", "/api/v2/importErrors", params={"limit": 100})["import_errors"]

    def add_dags(
        self, src: str | os.PathLike[str], *, dest: str | None = None, wait: Iterable[str] = ()
    ) -> Path:
        """Copy DAG files into the dags folder: a file as ``dest`` (default: its name), a
        directory's *contents* into ``dest`` (default: the dags folder itself, whose root is on
        ``sys.path``, so modules beside the DAG files import by their plain names). Existing
        files are overwritten, each atomically: the dag-processor never parses a half-written
        file. New files are parsed within ~2 s. Optionally wait for DAG ids. Returns the
        destination."""
        src = Path(src).resolve()
        if src.is_dir():
            target = self.dags_folder / (dest or "")
            for rel in _dag_files(src):
                _atomic_copy(src / rel, target / rel)
        else:
            target = self.dags_folder / (dest or src.name)
            _atomic_copy(src, target)
        wait = list(wait)
        if wait:
            self.wait_for_dags(wait)
        return target

    def reparse_dag(self, dag_id: str) -> None:
        """Ask the dag-processor to re-parse the file of ``dag_id`` now (priority request)."""
        details = self.api("GET", f"/api/v2/dags/{quote(dag_id, safe='')}/details")
        self.api("PUT", f"/api/v2/parseDagFile/{details['file_token']}")

    def replace_dags(
        self,
        src: str | os.PathLike[str],
        dag_id: str,
        *,
        dest: str | None = None,
        timeout: float = 60.0,
    ) -> int:
        """Update an already parsed DAG's file(s) and wait until a new DAG version is
        serialized; returns its version number. (A change only becomes a new version when the
        serialized DAG changes: tasks, arguments, ... ; with the unversioned local bundle, task
        code always runs from the current file anyway.)

        Re-parse requests are repeated every few seconds: a parse that runs right after the
        copy may not serialize (e.g. one run for a DAG-run callback) and the file's new mtime
        is then hidden until ``min_file_process_interval`` (30 s here).
        """
        before = max((v["version_number"] for v in self.dag_versions(dag_id)), default=0)
        self.add_dags(src, dest=dest)
        last_request = 0.0

        def new_version() -> int | None:
            nonlocal last_request
            latest = max((v["version_number"] for v in self.dag_versions(dag_id)), default=0)
            if latest > before:
                return latest
            if time.monotonic() - last_request > 4.0:
                self.reparse_dag(dag_id)
                last_request = time.monotonic()
            return None

        return wait_until(
            new_version, timeout=timeout, interval=1.0, message=f"a new version of {dag_id}"
        )

    def dag_versions(self, dag_id: str) -> list[dict[str, Any]]:
        """Serialized versions of a DAG, oldest first (a new one appears when it changes)."""
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagVersions"
        resp = self.api("GET", path, params={"limit": 100, "order_by": "version_number"})
        return resp["dag_versions"]

    # ------------------------------------------------------------------------- REST

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            raise ClusterError("cluster is not running")
        return self._http

    def token(self, user: str = "admin", password: str | None = None) -> str:
        """A JWT for ``user`` from ``POST /auth/token`` (SimpleAuthManager); cached per user."""
        if password is None and user in self._tokens:
            return self._tokens[user]
        if password is None:
            if user not in self.users:
                raise KeyError(f"unknown user {user!r}; configured: {sorted(self.users)}")
            password = self.users[user][1]
        resp = self.http.post("/auth/token", json={"username": user, "password": password})
        if resp.status_code not in (200, 201):
            raise ApiError(resp)
        token = resp.json()["access_token"]
        if password == self.users.get(user, (None, None))[1]:
            self._tokens[user] = token
        return token

    def request(
        self,
        method: str,
        path: str,
        *,
        user: str | None = "admin",
        token: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """A raw request (no status check): as ``user``, with an explicit ``token``, or
        anonymous with ``user=None``. Use it to assert 401/403."""
        headers = dict(kwargs.pop("headers", None) or {})
        bearer = token or (self.token(user) if user else None)
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        resp = self.http.request(method, path, headers=headers, **kwargs)
        if resp.status_code == 401 and token is None and user in self._tokens:
            self._tokens.pop(user, None)  # expired: log in again once
            headers["Authorization"] = f"Bearer {self.token(user)}"
            resp = self.http.request(method, path, headers=headers, **kwargs)
        return resp

    def api(
        self,
        method: str,
        path: str,
        *,
        user: str = "admin",
        auth: bool = True,
        expect: Sequence[int] = (200, 201),
        **kwargs: Any,
    ) -> Any:
        """JSON of a successful API call; raises ApiError on any other status."""
        resp = self.request(method, path, user=user if auth else None, **kwargs)
        if resp.status_code not in expect:
            raise ApiError(resp)
        return resp.json() if resp.content else None

    @staticmethod
    def _run_path(dag_id: str, run_id: str) -> str:
        return f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"

    def pause(self, dag_id: str, paused: bool = True, *, user: str = "admin") -> None:
        self.api(
            "PATCH",
            f"/api/v2/dags/{quote(dag_id, safe='')}",
            json={"is_paused": paused},
            user=user,
        )

    def unpause(self, dag_id: str, *, user: str = "admin") -> None:
        self.pause(dag_id, False, user=user)

    def trigger_dag(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        *,
        unpause: bool = True,
        user: str = "admin",
    ) -> str:
        """Create a manual DAG run (unpausing the DAG first by default); returns its run_id."""
        if unpause:
            self.unpause(dag_id, user=user)
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id is not None:
            body["dag_run_id"] = run_id
        resp = self.api(
            "POST", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", json=body, user=user
        )
        return resp["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", self._run_path(dag_id, run_id))

    def wait_for_run(
        self,
        dag_id: str,
        run_id: str,
        states: Sequence[str] = TERMINAL_RUN_STATES,
        *,
        timeout: float = 120.0,
    ) -> str:
        """Wait until the run is in one of ``states``; returns the state."""
        last: dict[str, Any] = {}

        def done() -> str | None:
            nonlocal last
            self._check_alive(self.component_names)
            last = self.dag_run(dag_id, run_id)
            return last["state"] if last["state"] in states else None

        def why() -> str:
            tis = {
                ti["task_id"]: (ti["state"], ti["try_number"])
                for ti in self._safe_tis(dag_id, run_id)
            }
            return f"run {dag_id}/{run_id} in {list(states)} (now {last.get('state')}, tasks {tis})"

        return wait_until(done, timeout=timeout, interval=1.0, message=why)

    def _safe_tis(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        try:
            return self.task_instances(dag_id, run_id)
        except Exception:
            return []

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Task instances of a run (state, try_number, pid, hostname, id, trigger, ...)."""
        return self.api(
            "GET", f"{self._run_path(dag_id, run_id)}/taskInstances", params={"limit": 1000}
        )["task_instances"]

    def task_instance(
        self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
    ) -> dict[str, Any]:
        path = f"{self._run_path(dag_id, run_id)}/taskInstances/{quote(task_id, safe='')}"
        if map_index >= 0:
            path += f"/{map_index}"
        return self.api("GET", path)

    def task_tries(
        self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Every try of a task instance (history plus the current one)."""
        path = f"{self._run_path(dag_id, run_id)}/taskInstances/{quote(task_id, safe='')}"
        path += f"/{map_index}/tries" if map_index >= 0 else "/tries"
        return self.api("GET", path, params={"limit": 100})["task_instances"]

    def wait_for_task(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        states: Sequence[str] = ("running",),
        *,
        map_index: int = -1,
        try_number: int | None = None,
        timeout: float = 120.0,
        interval: float = 0.5,
    ) -> dict[str, Any]:
        """Wait until the task instance is in one of ``states`` (and at ``try_number``)."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            self._check_alive(self.component_names)
            last = self.task_instance(dag_id, run_id, task_id, map_index=map_index)
            if last["state"] in states and (try_number is None or last["try_number"] == try_number):
                return last
            return None

        return wait_until(
            reached,
            timeout=timeout,
            interval=interval,
            message=lambda: (
                f"{dag_id}/{run_id}/{task_id} in {list(states)} try {try_number} "
                f"(now {last.get('state')} try {last.get('try_number')})"
            ),
        )

    def clear_task(
        self,
        dag_id: str,
        run_id: str,
        task_ids: str | Sequence[str],
        *,
        only_failed: bool = False,
        include_downstream: bool = False,
        include_upstream: bool = False,
        reset_dag_runs: bool = True,
        user: str = "admin",
    ) -> list[dict[str, Any]]:
        """Clear task instances of one run (they are scheduled again); returns the cleared TIs."""
        ids = [task_ids] if isinstance(task_ids, str) else list(task_ids)
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": ids,
            "only_failed": only_failed,
            "include_downstream": include_downstream,
            "include_upstream": include_upstream,
            "reset_dag_runs": reset_dag_runs,
        }
        resp = self.api(
            "POST",
            f"/api/v2/dags/{quote(dag_id, safe='')}/clearTaskInstances",
            json=body,
            user=user,
        )
        return resp["task_instances"]

    def logs(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, *, map_index: int = -1
    ) -> str:
        """Full task log of one try through the API, rendered one event per line."""
        path = (
            f"{self._run_path(dag_id, run_id)}/taskInstances/{quote(task_id, safe='')}"
            f"/logs/{try_number}"
        )
        resp = self.api(
            "GET",
            path,
            params={"full_content": "true", "map_index": map_index},
            headers={"Accept": "application/json"},
        )
        lines = []
        for item in resp.get("content") or []:
            if isinstance(item, str):
                lines.append(item)
                continue
            rest = {k: v for k, v in item.items() if k not in ("timestamp", "event", "level")}
            extra = " ".join(f"{k}={v}" for k, v in rest.items())
            lines.append(
                f"{item.get('timestamp') or ''} [{item.get('level') or ''}] "
                f"{item.get('event', '')} {extra}".rstrip()
            )
        return "\n".join(lines)

    def xcom(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        key: str = "return_value",
        *,
        map_index: int = -1,
    ) -> Any:
        """The deserialized value of one XCom entry."""
        path = (
            f"{self._run_path(dag_id, run_id)}/taskInstances/{quote(task_id, safe='')}"
            f"/xcomEntries/{quote(key, safe='')}"
        )
        return self.api("GET", path, params={"map_index": map_index, "deserialize": "true"})[
            "value"
        ]

    # ------------------------------------------------------------------------- task processes

    def find_task_process(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        map_index: int = -1,
        try_number: int | None = None,
        timeout: float = 60.0,
    ) -> tuple[psutil.Process, dict[str, Any]]:
        """The OS process running the task code of a *running* task instance, with the TI.

        Airflow 3 runs a task as supervisor (LocalExecutor worker, title
        ``airflow worker -- LocalExecutor: <ti id>``) + forked child (title
        ``airflow worker -- <ti id>``, its own process group). The TI's ``id`` changes with every
        try, and the API's ``pid`` is the child's pid; both are cross-checked against processes
        carrying this cluster's marker.
        """
        found: tuple[psutil.Process, dict[str, Any]] | None = None

        def lookup() -> bool:
            nonlocal found
            ti = self.task_instance(dag_id, run_id, task_id, map_index=map_index)
            if ti["state"] != "running":
                return False
            if try_number is not None and ti["try_number"] != try_number:
                return False
            ti_id = str(ti["id"])
            child_title = f"airflow worker -- {ti_id}"
            candidates = self.processes()
            for proc in candidates:
                if _cmdline(proc) == child_title:
                    found = (proc, ti)
                    return True
            # The child sets its title only after its start-up message; until then, trust the
            # API pid when its parent is this try's supervisor.
            pid = ti.get("pid")
            for proc in candidates:
                if proc.pid != pid:
                    continue
                with contextlib.suppress(psutil.Error):
                    parent = proc.parent()
                    if parent is not None and ti_id in _cmdline(parent):
                        found = (proc, ti)
                        return True
            return False

        wait_until(
            lookup,
            timeout=timeout,
            interval=0.3,
            message=f"the process of {dag_id}/{run_id}/{task_id}",
        )
        assert found is not None
        return found

    def kill_task_process(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        map_index: int = -1,
        try_number: int | None = None,
        sig: int = signal.SIGKILL,
        target: Literal["task", "supervisor"] = "task",
        tree: bool = False,
        timeout: float = 60.0,
    ) -> KilledProcess:
        """Signal the process running a task instance (waits until it is running).

        ``target="task"`` (default) kills the child that runs the task code: the supervisor
        survives, reports the failure and Airflow retries (a crash or OOM kill of user code).
        ``target="supervisor"`` kills the LocalExecutor worker process instead (with ``tree``
        also its child): nobody reports, the scheduler detects it by heartbeat timeout
        (``[scheduler] task_instance_heartbeat_timeout``, 30 s here).
        ``tree=True`` also kills every descendant (e.g. a Spark JVM started by the task).
        """
        child, ti = self.find_task_process(
            dag_id, run_id, task_id, map_index=map_index, try_number=try_number, timeout=timeout
        )
        victim = child
        if target == "supervisor":
            parent = child.parent()
            if parent is None:
                raise ClusterError(f"no supervisor for pid {child.pid}")
            victim = parent
        elif target != "task":
            raise ValueError(f"target must be 'task' or 'supervisor', not {target!r}")
        extra = victim.children(recursive=True) if tree else []
        record = KilledProcess(
            pid=victim.pid,
            cmdline=_cmdline(victim),
            ti_id=str(ti["id"]),
            try_number=int(ti["try_number"]),
            signal=int(sig),
            extra_pids=[p.pid for p in extra],
        )
        victim.send_signal(sig)
        _kill_procs(extra, sig)
        if sig == signal.SIGKILL:
            psutil.wait_procs([victim, *extra], timeout=10)
        self.killed.append(record)
        return record

    # ------------------------------------------------------------------------- diagnostics

    def cli(
        self, *args: str, check: bool = True, timeout: float = 180.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` against this cluster (same env); returns the completed process."""
        proc = subprocess.run(
            [*_airflow_argv(), *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            command = " ".join(args)
            raise ClusterError(
                f"airflow {command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def component_log(self, name: str) -> str:
        return (self.component_logs_dir / f"{name}.log").read_text(errors="replace")

    def log_files(self) -> Iterator[Path]:
        """Component logs, then task (and trigger) logs; not the per-file parsing logs."""
        yield from sorted(self.component_logs_dir.glob("*.log"))
        for path in sorted(self.logs_dir.rglob("*.log")):
            parts = path.relative_to(self.logs_dir).parts
            if parts[0] not in ("components", "dag_processor") and path.is_file():
                yield path

    def log_tails(self, lines: int | None = None) -> str:
        """Tails of every component log and task log, for failure reports."""
        n = lines or self.log_tail_lines
        parts = [f"===== airflow-e2e cluster {self.cluster_id} home={self.home} ====="]
        for path in self.log_files():
            parts.append(f"----- {path.relative_to(self.home)} (last {n} lines) -----")
            parts.append(_tail(path, n))
        return "\n".join(parts)


def reap_stale() -> list[str]:
    """Kill processes and drop databases left by clusters whose owning process is gone (a test
    run killed with SIGKILL cannot clean up). Clusters of live processes are never touched, so
    concurrent test runs are safe. Returns what was reaped."""
    reaped: list[str] = []
    orphans: list[psutil.Process] = []
    for proc in _own_processes():
        owner = cluster_id_of(proc)
        if owner and not _owner_alive(owner):
            orphans.append(proc)
            reaped.append(f"process {proc.pid} ({_cmdline(proc)[:80]})")
    _kill_procs(orphans, signal.SIGKILL)
    psutil.wait_procs(orphans, timeout=10)
    ok, _ = postgres_reachable()
    if ok:
        from sqlalchemy import text

        engine = _admin_engine()
        try:
            with engine.connect() as conn:
                names = conn.execute(
                    text("SELECT datname FROM pg_database WHERE datname LIKE 'airflow_e2e_%'")
                ).scalars()
                stale = [n for n in names if not _owner_alive(n.removeprefix("airflow_e2e_"))]
        finally:
            engine.dispose()
        for name in stale:
            _drop_database(name)
            reaped.append(f"database {name}")
    return reaped


def _owner_alive(cluster_id: str) -> bool:
    try:
        pid = int(cluster_id.split("_", 1)[0])
    except ValueError:
        return True  # not ours: leave it alone
    return psutil.pid_exists(pid)
