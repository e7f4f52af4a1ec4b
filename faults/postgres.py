"""Private PostgreSQL clusters for the external faults: a server the campaign may crash,
restart or cut off without touching the machine's shared one.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Self

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def postgres_unavailable(bindir: Path = PG_BIN) -> str | None:
    """Why a private PostgreSQL cluster cannot be started here, or None."""
    if not (bindir / "initdb").exists() or not (bindir / "pg_ctl").exists():
        return f"PostgreSQL 15 binaries not found in {bindir}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root but there is no 'postgres' user to run the private cluster"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """A throw-away PostgreSQL cluster on a free port (trust auth on 127.0.0.1), so a test can
    restart a server without touching the shared one."""

    def __init__(self, bindir: Path = PG_BIN) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="finalckpt-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.restarts = 0

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _command(self, args: tuple[str, ...]) -> list[str]:
        """The command line running ``args`` as the server's user."""
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return [*as_postgres, *args]

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            self._command(args), stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}\n{tail}")

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._pg_ctl("-l", str(self.root / "server.log"), "-o", options, "start")

    def restart(self, mode: str = "immediate") -> None:
        """``immediate`` is a crash (no shutdown checkpoint, WAL recovery at start)."""
        self._pg_ctl("-l", str(self.root / "server.log"), "-m", mode, "restart")
        self.restarts += 1

    def stop(self) -> None:
        """Stop (if running) and delete the cluster."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self._pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
