"""Split assignment: remaining splits, balanced redistribution, batching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.assignment import assign_splits, remaining_splits
from airflow_finalckpt.core.batching import policy_from
from airflow_finalckpt.runtime.runner import BatchSizer

SPLITS = [f"part-{i:03d}" for i in range(10)]


# -- remaining_splits -------------------------------------------------------------------------


def test_remaining_splits_keeps_the_original_order() -> None:
    finished = {"part-007", "part-000", "part-003"}
    left = remaining_splits(SPLITS, finished)
    assert left == [s for s in SPLITS if s not in finished]
    assert left[0] == "part-001" and left[-1] == "part-009"


def test_remaining_splits_does_not_sort() -> None:
    assert remaining_splits(["z", "b", "y", "a"], {"y"}) == ["z", "b", "a"]


def test_remaining_splits_with_nothing_finished_and_everything_finished() -> None:
    assert remaining_splits(SPLITS, frozenset()) == SPLITS
    assert remaining_splits(SPLITS, set(SPLITS)) == []


def test_remaining_splits_refuses_finished_splits_it_does_not_know() -> None:
    with pytest.raises(ValueError, match=r"\['range-0-50'\] are not among"):
        remaining_splits(SPLITS, {"part-001", "range-0-50"})


def test_remaining_splits_can_ignore_vanished_inputs_on_request() -> None:
    left = remaining_splits(SPLITS, {"part-001", "gone.csv"}, ignore_unknown_finished=True)
    assert left == [s for s in SPLITS if s != "part-001"]


def test_remaining_splits_refuses_duplicates_and_bad_ids() -> None:
    with pytest.raises(ValueError, match=r"all_splits: duplicate split ids \['b'\]"):
        remaining_splits(["a", "b", "b"], set())
    with pytest.raises(ValueError, match="non-empty strings, got ''"):
        remaining_splits(["a", ""], set())
    with pytest.raises(ValueError, match="non-empty strings, got 3"):
        remaining_splits(["a"], {3})  # type: ignore[arg-type]


# -- assign_splits ----------------------------------------------------------------------------


def test_assign_splits_contiguous_and_balanced() -> None:
    groups = assign_splits(SPLITS, 3)
    assert groups == [SPLITS[0:4], SPLITS[4:7], SPLITS[7:10]]


def test_assign_splits_more_workers_than_splits_gives_empty_groups() -> None:
    groups = assign_splits(["a", "b"], 4)
    assert groups == [["a"], ["b"], [], []]


def test_assign_splits_parallelism_one_and_no_splits() -> None:
    assert assign_splits(SPLITS, 1) == [SPLITS]
    assert assign_splits([], 2) == [[], []]


def test_assign_splits_is_deterministic() -> None:
    assert assign_splits(SPLITS, 4) == assign_splits(list(SPLITS), 4)


@pytest.mark.parametrize("parallelism", [0, -1, 1.5, "2", None, True])
def test_assign_splits_refuses_bad_parallelism(parallelism: object) -> None:
    with pytest.raises(ValueError, match="parallelism must be an integer >= 1") as info:
        assign_splits(SPLITS, parallelism)  # type: ignore[arg-type]
    assert repr(parallelism) in str(info.value)


def test_assign_splits_refuses_duplicate_splits() -> None:
    with pytest.raises(ValueError, match=r"duplicate split ids \['a'\]"):
        assign_splits(["a", "b", "a"], 2)


def test_redistributing_the_unfinished_splits_of_a_partial_stage() -> None:
    # 365 splits, 120 finished at the checkpoint, now resumed on 8 executors.
    all_splits = [f"day-{i:03d}" for i in range(365)]
    finished = set(all_splits[::3][:120])
    groups = assign_splits(remaining_splits(all_splits, finished), 8)
    flat = [s for group in groups for s in group]
    assert len(flat) == 245
    assert not finished & set(flat)
    assert {len(g) for g in groups} == {30, 31}


@settings(max_examples=300, deadline=None)
@given(
    splits=st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=60),
    parallelism=st.integers(min_value=1, max_value=20),
)
def test_assign_splits_properties(splits: list[str], parallelism: int) -> None:
    groups = assign_splits(splits, parallelism)
    assert len(groups) == parallelism
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1
    flat = [s for group in groups for s in group]
    assert sorted(flat) == sorted(splits)  # every split exactly once
    assert flat == splits  # contiguous groups keep the input order
    assert groups == assign_splits(list(splits), parallelism)


# -- fixed batches (batch_size=N, cut by the runtime's BatchSizer) ----------------------------


def _cut(splits: list[str], size: int) -> list[list[str]]:
    sizer = BatchSizer(policy_from(size))
    chunks, pending = [], list(splits)
    while pending:
        chunks.append(pending[: sizer.next_size(pending)])
        pending = pending[len(chunks[-1]) :]
    return chunks


def test_fixed_batches_chunk_in_order_with_a_short_last_batch() -> None:
    assert _cut(SPLITS, 4) == [SPLITS[0:4], SPLITS[4:8], SPLITS[8:10]]
    assert _cut(SPLITS, 10) == [SPLITS]
    assert _cut(SPLITS, 100) == [SPLITS]
    assert _cut([], 3) == []


@pytest.mark.parametrize("size", [0, -5, 2.0, "3"])
def test_fixed_batches_refuse_a_bad_batch_size(size: object) -> None:
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        policy_from(size)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    splits=st.lists(st.text(min_size=1, max_size=4), unique=True, max_size=50),
    size=st.integers(min_value=1, max_value=12),
)
def test_fixed_batches_properties(splits: list[str], size: int) -> None:
    chunks = _cut(splits, size)
    assert [s for chunk in chunks for s in chunk] == splits
    assert all(1 <= len(chunk) <= size for chunk in chunks)
    assert all(len(chunk) == size for chunk in chunks[:-1])
