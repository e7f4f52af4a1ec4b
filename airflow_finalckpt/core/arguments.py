"""Checks of a stage's DAG-file arguments, run when the DAG file is parsed.

A mistake in a stage's arguments must show as the DAG's import error, not after the stage's
Spark work: each check here takes a plain value and returns it (normalised) or raises
:class:`StageDefinitionError` naming the stage, the argument, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from airflow_finalckpt.core.errors import InvalidStageArgumentError
from airflow_finalckpt.core.graph import STAGE_ID_PATTERN


def argument_error(stage_id: str, name: str, value: object, rule: str) -> InvalidStageArgumentError:
    """The one-line error of a bad argument: stage, argument, value (shortened), rule."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidStageArgumentError(
        f"stage {stage_id!r}: argument {name}={shown} is invalid: {rule}"
    )


def check_stage_id(stage_id: object) -> str:
    """A stage id becomes a path component and a database key: one safe path segment."""
    if not isinstance(stage_id, str) or STAGE_ID_PATTERN.match(stage_id) is None:
        raise argument_error(
            str(stage_id),
            "stage_id",
            stage_id,
            "it must be 1-250 ASCII letters, digits, '_', '.' or '-', starting with a letter, "
            "digit or '_' (no '/', no leading '.', no spaces)",
        )
    return stage_id


def check_seconds(stage_id: str, name: str, value: object) -> float:
    """A duration in seconds: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise argument_error(stage_id, name, value, "must be a number of seconds > 0")
    if value <= 0:
        raise argument_error(stage_id, name, value, "must be > 0 seconds")
    return float(value)


def check_optional_seconds(stage_id: str, name: str, value: object) -> float | None:
    """None (the configured default) or a duration in seconds > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        rule = "must be a number of seconds > 0, or None for the default"
        raise argument_error(stage_id, name, value, rule)
    if value <= 0:
        raise argument_error(stage_id, name, value, "must be > 0 seconds, or None for the default")
    return float(value)


def check_choice(stage_id: str, name: str, value: object, allowed: Iterable[str]) -> str:
    """One of ``allowed`` (strings; an enum member of a string enum is its value)."""
    choices = list(allowed)
    text = value.value if hasattr(value, "value") else value
    if not isinstance(text, str) or text not in choices:
        rule = "allowed values are " + ", ".join(repr(c) for c in choices)
        raise argument_error(stage_id, name, value, rule)
    return text


def check_callable(stage_id: str, name: str, value: object, *, optional: bool) -> Any:
    """A function (``fn(ctx)``); None only when ``optional``."""
    if value is None and optional:
        return None
    if not callable(value):
        what = "a function fn(ctx) -> DataFrame | None" + (" or None" if optional else "")
        raise argument_error(stage_id, name, value, f"must be {what}")
    return value


def check_optional_text(stage_id: str, name: str, value: object) -> str | None:
    """None or a non-empty string."""
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise argument_error(stage_id, name, value, "must be a non-empty string or None")


def check_text(stage_id: str, name: str, value: object) -> str:
    """A non-empty string (a connection id)."""
    if isinstance(value, str) and value.strip():
        return value
    raise argument_error(stage_id, name, value, "must be a non-empty string")


def check_splits(stage_id: str, value: object) -> Any:
    """None (from the primary input), a callable returning split ids, an incremental source,
    or a list of distinct, non-empty split id strings.
    """
    if value is None or callable(value) or getattr(value, "is_incremental_source", False):
        return value  # an incremental source (airflow_finalckpt.sources) lists its own splits
    rule = (
        "must be a list of distinct non-empty split id strings, a callable returning one, an "
        "incremental source (LandingDirectory, IcebergAppends, DeltaAppends) or None"
    )
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise argument_error(stage_id, "splits", value, rule)
    items = list(value)
    if not all(isinstance(s, str) and s for s in items):
        raise argument_error(stage_id, "splits", value, rule)
    duplicates = sorted({s for s in items if items.count(s) > 1})
    if duplicates:
        raise argument_error(stage_id, "splits", value, f"{rule}; duplicated: {duplicates}")
    return items


def check_string_mapping(stage_id: str, name: str, value: object) -> dict[str, str]:
    """None or a mapping of string keys to string values (Spark settings)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise argument_error(stage_id, name, value, "must be a dict of str to str or None")
    return dict(value)


def check_bool(stage_id: str, name: str, value: object) -> bool:
    """True or False (no truthy strings: ``"false"`` would mean True)."""
    if not isinstance(value, bool):
        raise argument_error(stage_id, name, value, "must be True or False")
    return value


def check_unique_sink_ids(stage_id: str, sink_ids: Collection[str]) -> None:
    """One stage's sinks are keyed by id: two sinks with one id would leave one's staged data
    without a committer.
    """
    duplicates = sorted({s for s in sink_ids if list(sink_ids).count(s) > 1})
    if duplicates:
        raise argument_error(
            stage_id,
            "sinks",
            [f"<sink {s!r}>" for s in sink_ids],
            f"sink ids must be distinct within a stage; duplicated: {duplicates} "
            "(give each sink its own sink_id)",
        )


def check_instances(
    stage_id: str, name: str, values: object, accepted: Callable[[object], bool], what: str
) -> list[Any]:
    """A list whose items are all ``what`` (``accepted`` tells)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise argument_error(stage_id, name, values, f"must be a list of {what}")
    items = list(values)
    bad = [v for v in items if not accepted(v)]
    if bad:
        raise argument_error(stage_id, name, values, f"every item must be a {what}; got {bad[0]!r}")
    return items
