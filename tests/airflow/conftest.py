"""Real Airflow for the Airflow tests: a temporary AIRFLOW_HOME with a migrated SQLite metadata DB.

Airflow reads its configuration once, when ``airflow`` is first imported, so the environment is
set when this conftest is imported: pytest imports it while collecting ``tests/airflow``, before
any test module of this directory (which import Airflow) and before any test runs. The session
fixture ``airflow_home`` then migrates the metadata database once (``airflow db migrate`` does
the same) and hands out the home directory; DAG files for ``dag.test()`` go to its ``dags``
folder (a DAG must be in a bundle: dag.test() refuses a DAG that was never serialized).

Everything finalckpt-specific from the caller's environment is removed, so the tests only see
the connections and settings they create themselves.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

_HOME = Path(tempfile.mkdtemp(prefix="finalckpt-airflow-home-"))
# Also removed when the session never reaches the fixture (collection error, -k deselecting all).
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
_AIRFLOW_PRELOADED = "airflow.settings" in sys.modules

_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(_HOME / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(_HOME / "plugins"),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(_HOME / "logs"),
    # Trigger kwargs (they hold the store URL) are Fernet-encrypted only when a key is set, as
    # the Helm chart does; without one Airflow stores them in clear text.
    "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
}

if not _AIRFLOW_PRELOADED:
    for _name in list(os.environ):
        if _name.startswith(("AIRFLOW__FINALCKPT__", "AIRFLOW_CONN_FINALCKPT")):
            del os.environ[_name]
    os.environ.update(_ENV)
    (_HOME / "dags").mkdir()
    (_HOME / "plugins").mkdir()


@dataclass(frozen=True)
class AirflowHome:
    path: Path

    @property
    def dags_folder(self) -> Path:
        return self.path / "dags"

    @property
    def logs_folder(self) -> Path:
        return self.path / "logs"


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[AirflowHome]:
    """The temporary AIRFLOW_HOME, its metadata database migrated to head."""
    if _AIRFLOW_PRELOADED:
        from airflow.configuration import AIRFLOW_HOME

        if Path(AIRFLOW_HOME).resolve() != _HOME.resolve():
            pytest.fail(
                f"Airflow was imported (AIRFLOW_HOME={AIRFLOW_HOME}) before tests/airflow/"
                "conftest.py could point it at a temporary home; run the Airflow tests in "
                "their own pytest process or keep other conftests from importing Airflow",
                pytrace=False,
            )
    from airflow import settings
    from airflow.utils import db

    if settings.engine is None:
        settings.configure_orm()
    db.upgradedb()
    try:
        yield AirflowHome(_HOME)
    finally:
        settings.dispose_orm()


@pytest.fixture
def write_dag(airflow_home: AirflowHome) -> Iterator[Callable[..., Any]]:
    """Write a DAG file into the dags folder and import it; returns the module's ``dag``.

    ``source`` is the file body (dedented); ``params`` become module-level constants
    (``repr``-ed), so a DAG parsed by Airflow sees the same values as the test.
    """

    written: list[Path] = []

    def write(source: str, **params: Any) -> Any:
        name = f"test_dag_{uuid.uuid4().hex[:12]}"
        header = "".join(f"{key} = {value!r}\n" for key, value in params.items())
        path = airflow_home.dags_folder / f"{name}.py"
        path.write_text(header + textwrap.dedent(source))
        written.append(path)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.dag

    yield write
    # Every dag.test() re-parses the whole bundle: keep it to the current test's files.
    for path in written:
        path.unlink(missing_ok=True)


@pytest.fixture
def local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin's settings on a fresh local store, as a README user starts: SQLite at
    ``tmp_path/coordination.db``, checkpoints under ``tmp_path/checkpoints``; the hook's cached
    engines are dropped before and after, so no test sees another's store. Yields ``tmp_path``.
    """
    from airflow_finalckpt.hooks import finalckpt as hook_module

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", f"sqlite:///{tmp_path}/coordination.db")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    hook_module.dispose_engines()
    yield tmp_path
    hook_module.dispose_engines()


@dataclass(frozen=True)
class ApiServer:
    """Airflow's api-server (public REST API, SimpleAuthManager's /auth, the plugin's
    /finalckpt app) served over HTTP by uvicorn in this process, with known users.
    """

    url: str
    #: user name -> (SimpleAuthManager role, password)
    users: dict[str, tuple[str, str]]

    def token(self, username: str, role: str | None) -> str:
        """A JWT the server accepts, for any user name and role (None: no role at all)."""
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        user = SimpleAuthManagerUser(username=username, role=role)
        return str(get_auth_manager().generate_jwt(user))


API_USERS = {"ann": ("ADMIN", "ann-secret"), "vic": ("VIEWER", "vic-secret")}


@pytest.fixture(scope="session")
def api_server(airflow_home: AirflowHome) -> Iterator[ApiServer]:
    """Airflow's own api-server app (``create_app("core")``, as ``airflow api-server`` serves
    it) on a free local port; the CLI reaches it over real HTTP like any client.
    """
    import json
    import socket
    import threading
    import time

    import uvicorn

    passwords = airflow_home.path / "simple_auth_manager_passwords.test.json"
    passwords.write_text(json.dumps({name: pw for name, (_, pw) in API_USERS.items()}))
    users = ",".join(f"{name}:{role}" for name, (role, _) in API_USERS.items())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", users)
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
        from airflow.api_fastapi.app import create_app
        from airflow.api_fastapi.common.http_access_log import HttpAccessLogMiddleware

        app = create_app("core")
        # the server shares this process's stdout with the CLI under test, whose stdout must
        # hold only its own output: no access log line per request
        app.user_middleware = [
            m for m in app.user_middleware if m.cls is not HttpAccessLogMiddleware
        ]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, name="airflow-api-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail("Airflow's api-server did not start", pytrace=False)
            time.sleep(0.05)
        try:
            yield ApiServer(f"http://127.0.0.1:{port}", dict(API_USERS))
        finally:
            server.should_exit = True
            thread.join(timeout=30)
