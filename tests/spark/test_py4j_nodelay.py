"""Nagle's algorithm off on the stage's py4j connection (``spark.py4j_nodelay``), on real Spark.

Each Python thread gets its own py4j connection (PySpark's pinned-thread mode), so every check
runs in a new thread: the connection it opens starts with Nagle on, as py4j 0.10.9.x leaves it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from pyspark.sql import SparkSession

from airflow_finalckpt.spark.py4j_nodelay import disable_nagle
from airflow_finalckpt.spark.stage import SparkStageLogic
from airflow_finalckpt.storage import CheckpointStorage

T = TypeVar("T")


def _in_new_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a fresh Python thread (a fresh py4j connection); its result or its error."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


def _nodelay(spark: SparkSession) -> bool:
    """TCP_NODELAY of the JVM end of the calling thread's py4j connection."""
    gateway = spark.sparkContext._gateway
    connection = gateway.java_gateway_server.getCallbackClient().getPerThreadConnection()
    return bool(connection.getSocket().getTcpNoDelay())


def test_disable_nagle_sets_nodelay_on_this_threads_connection(spark: SparkSession) -> None:
    def check() -> tuple[bool, bool, bool, bool]:
        before = _nodelay(spark)
        first = disable_nagle(spark)
        again = disable_nagle(spark)
        return before, first, again, _nodelay(spark)

    before, first, again, after = _in_new_thread(check)
    assert before is False, "py4j left Nagle off already: py4j_nodelay may be dropped"
    assert (first, again, after) == (True, True, True)


def test_a_stage_turns_nagle_off_when_it_first_uses_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))

    def check() -> tuple[bool, bool]:
        logic = SparkStageLogic(lambda: spark, storage, "key", "s", lambda ctx: None)
        before = _nodelay(spark)
        assert logic.spark is spark
        return before, _nodelay(spark)

    assert _in_new_thread(check) == (False, True)


def test_no_py4j_connection_is_no_error() -> None:
    class ConnectLike:
        """A session without a py4j gateway, as a Spark Connect session is."""

        @property
        def sparkContext(self) -> Any:
            raise NotImplementedError("sparkContext is not supported in Spark Connect")

    # py4j's non-pinned gateway mode: a callback client without per-thread connections
    server = SimpleNamespace(getCallbackClient=lambda: object())
    non_pinned = SimpleNamespace(
        sparkContext=SimpleNamespace(_gateway=SimpleNamespace(java_gateway_server=server))
    )

    assert disable_nagle(ConnectLike()) is False
    assert disable_nagle(non_pinned) is False
