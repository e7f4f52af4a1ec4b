"""Nagle's algorithm off on the JVM side of this thread's py4j connection (py4j issue 516).

py4j 0.10.9.x (Spark 3.5 to 4.2) writes a reply longer than its 8 KB buffer in two writes; with
Nagle's algorithm on the JVM's socket and delayed ACKs on the Python side, the second write waits
~40 ms. The plan check reads plans as JSON (14-90 KB at the example's stages), so each checked
batch paid 40-90 ms for nothing (docs/benchmarks.md, "The py4j 40 ms stall"). py4j turns Nagle off
upstream (py4j pull request 592); until Spark ships that, a stage turns it off on the connection
its driver code runs on. A loopback RPC connection loses nothing by it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def disable_nagle(spark: Any) -> bool:
    """Set TCP_NODELAY on the JVM end of the calling thread's py4j connection.

    True when it is set (now or before); False where there is no such connection: a Spark
    Connect session (no py4j), py4j's non-pinned gateway mode, or a py4j that changed. Never
    raises: it only makes calls faster.
    """
    try:
        gateway = spark.sparkContext._gateway
        # Pinned-thread mode (PySpark's default): the JVM serves each Python thread on its own
        # connection and thread, so this call runs on the JVM thread that owns our connection.
        connection = gateway.java_gateway_server.getCallbackClient().getPerThreadConnection()
        if connection is None:
            return False
        socket = connection.getSocket()
        if not socket.getTcpNoDelay():
            socket.setTcpNoDelay(True)
        return True
    except Exception as exc:  # Connect sessions raise on sparkContext; other gateways lack it
        log.debug("py4j TCP_NODELAY not set (%s: %s)", type(exc).__name__, exc)
        return False
