"""Where a stage task's seconds go, measured inside the task process of a real Airflow.

Imported by the benchmark's DAG file (``benchmarks/airflow_dags/``) in every process that parses
it; ``install()`` wraps, at class level and once per process, the calls whose time is not the
stage's Spark work: the store's settings and engine (``FinalCkptHook``), database connects
(``psycopg.connect``, ``sqlite3.connect``), every public ``Coordinator`` method, the throughput
hints, the sinks' two-phase commit, state files, XCom push / pull, the SparkSession's start and
stop. Each operator's ``execute`` (and ``execute_complete``, after the final checkpoint's
deferral) then logs one line ``FINALCKPT_BENCH_PROFILE {json}`` to the task log: wall-clock
enter / exit, the process's start, when the DAG file was parsed, whether it deferred, and the
seconds per category. ``benchmarks.airflow_real`` reads those lines back through the REST API.

Timing is exclusive (a nested category's seconds are not counted again in the outer one) and
only on the thread running ``execute``: the attempt lease's heartbeat thread does not add to
the task's wall time. The wrappers cost a ``perf_counter`` pair per call: nothing next to
Spark's work. No product code changes for this.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

MARK = "FINALCKPT_BENCH_PROFILE"

_PARSE = {"started": 0.0, "parsed": 0.0}
_INSTALLED: set[str] = set()


def mark_parse_started() -> None:
    """Called first thing by the DAG file: the task's parse starts here (first parse only)."""
    if not _PARSE["started"]:
        _PARSE["started"] = time.time()


def mark_parsed() -> None:
    """Called last by the DAG file: the task's DAG is parsed."""
    if not _PARSE["parsed"]:
        _PARSE["parsed"] = time.time()


class PhaseTimer:
    """Exclusive seconds and call counts per category, on one thread, between begin and end."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[Any]] = []
        self._thread: int | None = None

    def begin(self) -> None:
        self.seconds, self.calls, self._stack = {}, {}, []
        self._thread = threading.get_ident()

    def end(self) -> tuple[dict[str, float], dict[str, int]]:
        self._thread = None
        return dict(self.seconds), dict(self.calls)

    def wrap(self, fn: Callable[..., Any], category: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._thread != threading.get_ident():
                return fn(*args, **kwargs)
            frame = [category, self.clock(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                elapsed = self.clock() - frame[1]
                self.seconds[category] = self.seconds.get(category, 0.0) + elapsed - frame[2]
                self.calls[category] = self.calls.get(category, 0) + 1
                if self._stack:
                    self._stack[-1][2] += elapsed

        timed._bench_timed = True  # type: ignore[attr-defined]
        return timed


TIMER = PhaseTimer()


def _done(fn: Any) -> bool:
    return bool(getattr(fn, "_bench_timed", False))


def _wrap_methods(owner: Any, names: tuple[str, ...], category: str) -> None:
    for name in names:
        original = getattr(owner, name, None)
        if original is not None and not _done(original):
            setattr(owner, name, TIMER.wrap(original, category))


def _public_methods(cls: type) -> tuple[str, ...]:
    """Public functions of ``cls`` and of its bases in the product (the coordinator's reads
    live in a base class)."""
    import inspect

    names = {
        n
        for klass in cls.__mro__
        if klass.__module__.startswith("airflow_finalckpt")
        for n, m in vars(klass).items()
        if not n.startswith("_") and inspect.isfunction(m)
    }
    return tuple(sorted(names))


def _process_started() -> float:
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except Exception:  # pragma: no cover - psutil is an Airflow dependency
        return 0.0


def profiled(original: Callable[..., Any], phase: str) -> Callable[..., Any]:
    """``execute`` / ``execute_complete`` that logs one profile line when it ends (also when
    it raises ``TaskDeferred``: the stage goes to the triggerer)."""

    def run(self: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        TIMER.begin()
        enter = time.time()
        outcome = "returned"
        try:
            return original(self, context, *args, **kwargs)
        except BaseException as exc:
            outcome = "deferred" if type(exc).__name__ == "TaskDeferred" else "raised"
            raise
        finally:
            seconds, calls = TIMER.end()
            doc = {
                "phase": phase,
                "task_id": getattr(self, "task_id", None),
                "pid": os.getpid(),
                "process_started": _process_started(),
                "parse_started": _PARSE["started"],
                "parsed": _PARSE["parsed"],
                "enter": enter,
                "exit": time.time(),
                "outcome": outcome,
                "seconds": {k: round(v, 4) for k, v in seconds.items()},
                "calls": calls,
            }
            self.log.info("%s %s", MARK, json.dumps(doc, sort_keys=True))

    run._bench_timed = True  # type: ignore[attr-defined]
    return run


def _wrap_execute(cls: type, names: tuple[str, ...]) -> None:
    for name in names:
        original = getattr(cls, name)
        if not _done(original):
            setattr(cls, name, profiled(original, name))


def _install_common() -> None:
    import sqlite3

    import psycopg
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from pyspark.sql import SparkSession

    _wrap_methods(psycopg, ("connect",), "db_connect")
    _wrap_methods(sqlite3, ("connect",), "db_connect")
    _wrap_methods(RuntimeTaskInstance, ("xcom_push", "xcom_pull"), "xcom")
    _wrap_methods(SparkSession.Builder, ("getOrCreate",), "spark_session")
    _wrap_methods(SparkSession, ("stop",), "spark_stop")


def _install_ours() -> None:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.hooks.finalckpt import FinalCkptHook
    from airflow_finalckpt.operators.spark_launch import SparkLaunchMixin
    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
    from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
    from airflow_finalckpt.spark.stage import SparkStageLogic
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.storage.hints import StorageThroughputHints

    _wrap_methods(FinalCkptHook, ("get_settings", "get_storage", "get_engine"), "store_setup")
    _wrap_methods(Coordinator, _public_methods(Coordinator), "coordinator")
    _wrap_methods(StorageThroughputHints, ("load", "save"), "hints")
    for sink in (ParquetTableSink, SqlTableSink):
        _wrap_methods(sink, ("write_spark",), "sink_write")
        _wrap_methods(sink, ("precommit", "commit", "abort"), "sink_2pc")
    _wrap_methods(CheckpointStorage, ("write_state", "read_state"), "state_io")
    _wrap_methods(SparkStageLogic, ("persist_state", "read_state"), "state_io")
    _wrap_methods(SparkLaunchMixin, ("_spark_session",), "spark_session")
    _wrap_execute(FinalCheckpointStageOperator, ("execute", "execute_complete"))


def _install_plain() -> None:
    from airflow.providers.apache.spark.decorators.pyspark import _PySparkDecoratedOperator

    _wrap_execute(_PySparkDecoratedOperator, ("execute",))


def install() -> None:
    """Wrap everything, once per process (the DAG file may be parsed more than once)."""
    for name, step in (("common", _install_common), ("ours", _install_ours)):
        if name not in _INSTALLED:
            _INSTALLED.add(name)
            step()
    if "plain" not in _INSTALLED:
        _INSTALLED.add("plain")
        _install_plain()
