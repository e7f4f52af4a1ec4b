"""What a stop with drain does to a source stage, as pure rules: a fact source stops taking
input; a dimension (a source its downstream stages read whole, e.g. a broadcast table joined
through ``ctx.upstream``) reads all its input, so the facts read are joined with all of it.
"""

from __future__ import annotations

from collections.abc import Iterable

#: A stage's ``on_drain``: stop taking input, or read all of it.
ON_DRAIN_CHOICES = ("stop", "complete")


def check_on_drain(stage_id: str, value: str | None) -> str | None:
    """``value`` if it is a choice or None (the default); ValueError naming the stage else."""
    if value is not None and value not in ON_DRAIN_CHOICES:
        raise ValueError(
            f"stage {stage_id!r}: on_drain must be one of {list(ON_DRAIN_CHOICES)} or None "
            f"(the default: dimensions complete), got {value!r}"
        )
    return value


def default_on_drain(stage_id: str, is_source: bool, primaries: Iterable[str | None]) -> str:
    """``"complete"`` for a source with downstream stages none of which takes it as its primary
    input (``primaries``: each downstream stage's primary input, None if it has none); else
    ``"stop"``.
    """
    found = list(primaries)
    return "complete" if is_source and found and stage_id not in found else "stop"
