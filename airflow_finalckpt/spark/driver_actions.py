"""See the Spark actions a transform runs on the driver while the stage calls it.

A transform that collects its batch (``collect()``, ``toPandas()``, a ``count()`` used in a
filter) and builds its result from what came back returns a frame whose plan is a local
relation or a literal: the plan check (``core.plan_check``) cannot see that the result depends
on the batch. So the DataFrame methods that run a job and hand its result to the driver (or
replace a frame's plan by its computed rows) are wrapped, once per process, on the DataFrame
class of the session in use: classic (pyspark 3.5's ``pyspark.sql.dataframe.DataFrame``, 4.x's
``pyspark.sql.classic.dataframe.DataFrame``) or the Spark Connect client's (its actions run on
the server, but they are called here, on the client's frames, whose plans the check already
reads). A wrapper only calls through unless the calling thread has a watch open
(``watching``); with one, it reports the frame and the method's name before the call, once
per outermost call (``head`` calls ``take`` calls ``collect``: one report). The watch (the stage
logic) decides from the frame's plan whether it reads the batch's input: an action over a
dimension table or keyed state is not one on the batch.

Why not Spark jobs (the job group or the status tracker around the call): a transform's own
reads start jobs too (Parquet footers, CSV schema inference of the batch's files), and which
frame a job ran for is not visible from Python without parsing plans from the UI store; jobs
cannot tell an action on the batch from a read of its input, frames can.

Not seen: jobs started without a DataFrame method (``spark.sparkContext`` RDDs built by hand),
``foreach``/``foreachPartition`` (nothing comes back but accumulators), actions on threads the
transform starts (the watch is per thread), and a batch written somewhere by the transform and
read back (docs/protocol.md lists these).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

#: DataFrame methods (and properties) that run a Spark job and give its result to the driver,
#: or replace the frame's plan by its computed rows (``checkpoint``, ``rdd``, ``toJSON``).
ACTIONS = (
    "collect",
    "toPandas",
    "toArrow",
    "_collect_as_arrow",
    "count",
    "take",
    "head",
    "first",
    "tail",
    "toLocalIterator",
    "isEmpty",
    "checkpoint",
    "localCheckpoint",
    "approxQuantile",
    "corr",
    "cov",
    "crosstab",
    "toJSON",
    "rdd",
)
_MARK = "__finalckpt_driver_action__"

#: Called with the frame and the method's name (never raises into the user's call).
Watch = Callable[[Any, str], None]


class _Local(threading.local):
    watch: Watch | None = None
    inside: bool = False


_local = _Local()
_install_lock = threading.Lock()


@contextmanager
def watching(watch: Watch | None) -> Iterator[None]:
    """Report the actions this thread runs inside the block to ``watch`` (None: report
    nothing, e.g. while a factory builds an input the same for every batch).
    """
    previous = _local.watch
    _local.watch = watch
    try:
        yield
    finally:
        _local.watch = previous


def unwatched() -> AbstractContextManager[None]:
    """A block whose actions are not the transform's own on its batch (a constant input's
    factory, the runtime's helpers).
    """
    return watching(None)


def install(session: Any) -> None:
    """Wrap the actions of ``session``'s DataFrame class (idempotent, thread-safe)."""
    cls = frame_class(session)
    if cls is None or cls.__dict__.get(_MARK):
        return
    with _install_lock:
        if cls.__dict__.get(_MARK):
            return
        for name in ACTIONS:
            original = inspect.getattr_static(cls, name, None)
            if original is not None:
                setattr(cls, name, _wrapped_attribute(cls, name, original))
        setattr(cls, _MARK, True)


def uninstall(session: Any) -> None:
    """Undo ``install`` (tests plant the bug of a blind check with it)."""
    cls = frame_class(session)
    if cls is None or not cls.__dict__.get(_MARK):
        return
    with _install_lock:
        for name in ACTIONS:
            value = cls.__dict__.get(name)
            original = getattr(_function_of(value), _MARK, None)
            if original is not None:
                if original is _INHERITED:
                    delattr(cls, name)
                else:
                    setattr(cls, name, original)
        delattr(cls, _MARK)


def frame_class(session: Any) -> type | None:
    """The DataFrame class a session's frames are (None: not a PySpark session)."""
    module = type(session).__module__
    if module.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame

        return ConnectFrame
    if not module.startswith("pyspark.sql"):
        return None
    try:
        found = importlib.import_module("pyspark.sql.classic.dataframe")  # pyspark >= 4.0
    except ImportError:
        found = importlib.import_module("pyspark.sql.dataframe")  # 3.5: the classic one
    frame: type = found.DataFrame
    return frame


#: Marks a wrapper of a method the class inherited (uninstall deletes it instead).
_INHERITED = object()


def _function_of(value: Any) -> Any:
    if isinstance(value, property):
        return value.fget
    if isinstance(value, functools.cached_property):
        return value.func
    return value


def _wrapped_attribute(cls: type, name: str, original: Any) -> Any:
    restore = original if name in cls.__dict__ else _INHERITED
    if isinstance(original, property) and original.fget is not None:
        return property(_reporting(name, original.fget, restore), doc=original.__doc__)
    if isinstance(original, functools.cached_property):
        cached = functools.cached_property(_reporting(name, original.func, restore))
        cached.__set_name__(cls, name)
        return cached
    return _reporting(name, original, restore)


def _reporting(name: str, call: Callable[..., Any], restore: Any) -> Callable[..., Any]:
    """``call`` that first reports its frame to the thread's watch (outermost call only)."""

    @functools.wraps(call)
    def action(self: Any, *args: Any, **kwargs: Any) -> Any:
        watch = _local.watch
        if watch is None or _local.inside:
            return call(self, *args, **kwargs)
        _local.inside = True
        try:
            watch(self, name)
            return call(self, *args, **kwargs)
        finally:
            _local.inside = False

    setattr(action, _MARK, restore)
    return action
