"""The installed ``finalckpt`` console script on its default path: through an Airflow api-server
(here a stand-in HTTP server answering the routes it calls), never the coordination store,
and ``--json`` prints exactly one JSON document even when Airflow logs while it loads its
config (a short ``api_password`` makes the secrets masker warn; that warning went to stdout).
The real api-server: tests/airflow/test_api_app.py and tests/e2e/test_stop_api.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

SCRIPT = str(Path(sys.executable).parent / "finalckpt")
RESUMED = {
    "request_id": 4,
    "mode": "savepoint",
    "state": "RESUMED",
    "savepoint_id": 3,
    "savepoint_path": "/ckpt/k/chk-3/_metadata",
    "requested_by": "user",
    "requested_at": 1.0,
    "finished_at": 2.0,
    "failure_reason": None,
}


class FakeApiServer(BaseHTTPRequestHandler):
    """``POST /auth/token`` and ``POST /finalckpt/api/.../resume``; records what it was asked."""

    calls: ClassVar[list[tuple[str, str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        self.calls.append((self.path, self.headers.get("authorization", ""), body))
        if self.path == "/auth/token":
            code, answer = 201, {"access_token": "jwt-of-" + body["username"]}
        elif self.path == "/finalckpt/api/dags/flights/runs/manual__1/resume":
            code, answer = 200, RESUMED
        else:
            code, answer = 404, {"detail": "no pipeline run is known for DAG run 'x'"}
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), FakeApiServer)
    FakeApiServer.calls = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_resume_goes_through_the_api_server_and_json_is_alone_on_stdout(
    api_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow_home"),
        AIRFLOW__FINALCKPT__API_URL=api_url,
        AIRFLOW__FINALCKPT__API_USERNAME="user",
        AIRFLOW__FINALCKPT__API_PASSWORD="user",  # short: Airflow's masker warns about it
        # nothing listens there: a command that opened the store would fail
        AIRFLOW__FINALCKPT__STORE_URL="postgresql+psycopg://nobody@127.0.0.1:9/nowhere",
    )
    result = subprocess.run(
        [SCRIPT, "resume", "flights", "manual__1", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == RESUMED
    assert [(path, auth) for path, auth, _ in FakeApiServer.calls] == [
        ("/auth/token", ""),
        ("/finalckpt/api/dags/flights/runs/manual__1/resume", "Bearer jwt-of-user"),
    ]
    assert FakeApiServer.calls[0][2] == {"username": "user", "password": "user"}

    unknown = subprocess.run(
        [SCRIPT, "resume", "flights", "nope", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.strip().splitlines()[-1] == (
        "error: no pipeline run is known for DAG run 'x'"
    )
