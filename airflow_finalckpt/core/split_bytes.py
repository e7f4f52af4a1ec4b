"""Input bytes a source stage declares for its splits (``split_bytes=``), before running them.

A source's split ids (days, file names, offsets ...) say nothing about how much each reads, so
without a size its first auto batch is a one-split probe and its second is sized from one
sample. With a size per split, the cold first batch is sized from bytes at the policy's
conservative throughput (``core.batching.cold_throughput``): a source whose input fits the
target runs as one batch, like its warm runs. Sizes are advisory: a split without one
(``None``) makes the stage weigh its splits by count, as if nothing were declared.

``split_bytes`` is a mapping of split id to bytes, or a callable of one split id (called where
the stage's Spark driver runs, once per split and attempt, so it sees the driver's files:
``airflow_finalckpt.sizing.file_bytes`` sizes splits that name files or directories).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from airflow_finalckpt.core.arguments import argument_error
from airflow_finalckpt.core.errors import FinalCheckpointError, StageDefinitionError

#: Bytes per split id: a mapping, or a function of one split id (None: size unknown).
SplitBytes: TypeAlias = Mapping[str, int | None] | Callable[[str], int | None]

_RULE = (
    "must be a dict of split id -> bytes (an int >= 0, or None for unknown), a callable of one "
    "split id returning that, or None"
)


def _is_size(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def check_split_bytes(stage_id: str, value: object, *, own_splits: bool) -> Any:
    """Parse time: None, a callable, or a mapping of str to bytes; only for a stage that
    declares its own splits (a downstream stage's splits are upstream parts, sized from their
    files).
    """
    if value is None:
        return None
    if not own_splits:
        raise argument_error(
            stage_id,
            "split_bytes",
            value,
            "only a stage with its own splits= (a source) declares split sizes; this stage's "
            "splits are its primary input's output parts, sized from their files: remove "
            "split_bytes",
        )
    if callable(value):
        return value
    if not isinstance(value, Mapping):
        raise argument_error(stage_id, "split_bytes", value, _RULE)
    bad = [(k, v) for k, v in value.items() if not isinstance(k, str) or not _is_size(v)]
    if bad:
        raise argument_error(stage_id, "split_bytes", value, f"{_RULE}; got {bad[0]!r}")
    return dict(value)


def declared_bytes(
    stage_id: str, split_bytes: SplitBytes | None, splits: Sequence[str]
) -> list[int | None]:
    """Run time: the declared bytes of each split (None: unknown). A callable that raises
    fails the attempt (retried: it may read a store that is briefly away); one that returns
    anything but an int >= 0 or None is the DAG's bug (permanent).
    """
    if split_bytes is None:
        return [None] * len(splits)
    if isinstance(split_bytes, Mapping):
        return [split_bytes.get(s) for s in splits]
    sizes: list[int | None] = []
    for split in splits:
        try:
            size = split_bytes(split)
        except Exception as exc:
            raise FinalCheckpointError(
                f"stage {stage_id!r}: split_bytes raised on split {split!r}: "
                f"{type(exc).__name__}: {exc} (return None for a split of unknown size)"
            ) from exc
        if not _is_size(size):
            raise StageDefinitionError(
                f"stage {stage_id!r}: split_bytes returned {size!r} for split {split!r}; it "
                "must return an int >= 0 (bytes) or None (unknown)"
            )
        sizes.append(size)
    return sizes
