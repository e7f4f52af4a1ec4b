"""A network partition between the pipeline and its PostgreSQL store.

The private cluster of :class:`~faults.external.PrivatePostgres` runs in a network namespace of
its own, reached over a veth pair (``10.213.<n>.1`` here, ``.2`` there). :meth:`cut` takes the
host end of the link down: packets in flight and every retransmission go nowhere, and nothing
answers, as when a switch, a security group or a zone fails (not a refused connection, which
the operating system would report at once). :meth:`restore` brings it back; connections that
survived carry on. Needs root and ``ip`` (iproute2); the tests skip with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from faults.postgres import PG_BIN, PrivatePostgres, postgres_unavailable

#: Third octet of the /30 a cluster's veth pair uses (several clusters: several octets).
_SUBNET_BASE = 213


def partition_unavailable(bindir: Path = PG_BIN) -> str | None:
    """Why a partitionable PostgreSQL cannot run here, or None."""
    reason = postgres_unavailable(bindir)
    if reason is not None:
        return reason
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"fcprobe{os.getpid() % 100000}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"`ip netns add` refused: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class PartitionedPostgres(PrivatePostgres):
    """A private PostgreSQL behind a link the test can cut and restore."""

    def __init__(self, bindir: Path = PG_BIN) -> None:
        super().__init__(bindir)
        tag = f"{os.getpid() % 10000}{self.port % 100}"
        self.netns = f"fcpg{tag}"
        self.host_link, self.inner_link = f"fch{tag}", f"fcn{tag}"
        octet = (os.getpid() + self.port) % 250
        subnet = f"10.{_SUBNET_BASE}.{octet}"
        self.host_ip, self.server_ip = f"{subnet}.1", f"{subnet}.2"
        self.cuts: list[tuple[float, float | None]] = []  # (cut at, restored at), monotonic
        self._restorer: threading.Timer | None = None

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.server_ip}:{self.port}/postgres"

    def _command(self, args: tuple[str, ...]) -> list[str]:
        """Inside the namespace: the server listens on its side of the link."""
        return ["ip", "netns", "exec", self.netns, *super()._command(args)]

    def start(self) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.inner_link)
        _ip("link", "set", self.inner_link, "netns", self.netns)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_link)
        _ip("link", "set", self.host_link, "up")
        inner = ("netns", "exec", self.netns, "ip")
        _ip(*inner, "addr", "add", f"{self.server_ip}/30", "dev", self.inner_link)
        _ip(*inner, "link", "set", self.inner_link, "up")
        _ip(*inner, "link", "set", "lo", "up")
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"),
            *("-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"),
        )
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.server_ip} -c fsync=on "
            f"-c synchronous_commit=on"
        )
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 10.0.0.0/8 trust\n"
        )
        self._pg_ctl("-l", str(self.root / "server.log"), "-o", options, "start")

    def cut(self, seconds: float | None = None) -> None:
        """Take the link down; with ``seconds``, bring it back after that long (a timer)."""
        _ip("link", "set", self.host_link, "down")
        self.cuts.append((time.monotonic(), None))
        if seconds is not None:
            self._restorer = threading.Timer(seconds, self.restore)
            self._restorer.daemon = True
            self._restorer.start()

    def restore(self) -> None:
        _ip("link", "set", self.host_link, "up")
        if self.cuts and self.cuts[-1][1] is None:
            self.cuts[-1] = (self.cuts[-1][0], time.monotonic())

    def wait_restored(self, timeout: float) -> float:
        """Block until the last cut ended; its end (monotonic)."""
        if self._restorer is not None:
            self._restorer.join(timeout)
        end = self.cuts[-1][1] if self.cuts else None
        if end is None:
            raise RuntimeError("the link was not restored")
        return end

    def stop(self) -> None:
        if self._restorer is not None:
            self._restorer.cancel()
        with contextlib.suppress(RuntimeError):
            self.restore()
        super().stop()
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.host_link)
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", self.netns)
