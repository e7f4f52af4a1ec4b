"""Split assignment on restore: our StateAssignmentOperation.

A partially finished stage resumes with only its unfinished splits, spread over the Spark
parallelism it has *now* (which may differ from the one it had when the checkpoint was taken).
Everything here is deterministic: two attempts of the same stage must agree on who does what.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def _check_split_ids(splits: Iterable[object], what: str) -> list[str]:
    """Return the splits as a list; refuse non-string, empty and duplicate ids."""
    checked: list[str] = []
    seen: set[str] = set()
    duplicates: list[str] = []
    for split in splits:
        if not isinstance(split, str) or not split:
            raise ValueError(f"{what}: split ids must be non-empty strings, got {split!r}")
        if split in seen:
            duplicates.append(split)
        seen.add(split)
        checked.append(split)
    if duplicates:
        raise ValueError(f"{what}: duplicate split ids {sorted(set(duplicates))}")
    return checked


def _check_positive(value: object, name: str) -> int:
    # bool is an int subclass: True would silently mean 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def remaining_splits(
    all_splits: Sequence[str],
    finished: Collection[str],
    *,
    ignore_unknown_finished: bool = False,
) -> list[str]:
    """The splits still to process, in the order of ``all_splits``.

    A finished split that is not in ``all_splits`` means the stage's split list changed since
    the checkpoint (e.g. ranges re-cut for another parallelism); silently ignoring it could
    process data twice, so it is an error unless ``ignore_unknown_finished`` (for sources whose
    processed inputs legitimately disappear, such as files moved away after reading).
    """
    splits = _check_split_ids(all_splits, "all_splits")
    done = set(_check_split_ids(finished, "finished splits"))
    unknown = done.difference(splits)
    if unknown and not ignore_unknown_finished:
        raise ValueError(
            f"finished splits {sorted(unknown)} are not among the stage's current splits: the "
            "split list changed since the checkpoint, so resuming could process data twice "
            "(pass ignore_unknown_finished=True if those inputs were removed on purpose)"
        )
    return [split for split in splits if split not in done]


def assign_splits(splits: Sequence[str], parallelism: int) -> list[list[str]]:
    """Spread ``splits`` over ``parallelism`` workers in contiguous, balanced groups.

    Always returns exactly ``parallelism`` groups (some empty when there are fewer splits);
    group sizes differ by at most one, the first groups taking the extra splits. Contiguous
    groups keep neighbouring splits (adjacent ranges, files of one partition) together.
    """
    parallelism = _check_positive(parallelism, "parallelism")
    ordered = _check_split_ids(splits, "splits")
    base, extra = divmod(len(ordered), parallelism)
    groups: list[list[str]] = []
    start = 0
    for index in range(parallelism):
        size = base + (1 if index < extra else 0)
        groups.append(ordered[start : start + size])
        start += size
    return groups
