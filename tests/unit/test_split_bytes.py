"""A source's declared split sizes (``split_bytes=``): the parse-time check, the run-time
lookup, ``sizing.file_bytes`` on real files, and how the batch sizer uses them cold."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_finalckpt.core.batching import DEFAULT_COLD_BYTES_PER_S, BatchPolicy
from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    InvalidStageArgumentError,
    StageDefinitionError,
    is_permanent,
)
from airflow_finalckpt.core.split_bytes import check_split_bytes, declared_bytes
from airflow_finalckpt.runtime.batches import BatchSizer
from airflow_finalckpt.sizing import file_bytes


def test_check_accepts_none_a_mapping_or_a_callable_for_a_source() -> None:
    assert check_split_bytes("s", None, own_splits=True) is None
    assert check_split_bytes("s", None, own_splits=False) is None
    assert check_split_bytes("s", {"a": 0, "b": 5, "c": None}, own_splits=True) == {
        "a": 0,
        "b": 5,
        "c": None,
    }
    fn = len
    assert check_split_bytes("s", fn, own_splits=True) is fn


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (123, "must be a dict of split id -> bytes"),
        ("a", "must be a dict of split id -> bytes"),
        ({"a": -1}, "got ('a', -1)"),
        ({"a": 1.5}, "got ('a', 1.5)"),
        ({"a": True}, "got ('a', True)"),
        ({1: 10}, "got (1, 10)"),
    ],
)
def test_check_refuses_anything_else_naming_stage_argument_and_rule(
    value: object, detail: str
) -> None:
    with pytest.raises(InvalidStageArgumentError) as caught:
        check_split_bytes("ingest", value, own_splits=True)
    message = str(caught.value)
    assert message.startswith("stage 'ingest': argument split_bytes=")
    assert detail in message
    assert "\n" not in message


def test_check_refuses_split_bytes_on_a_stage_whose_splits_are_upstream_parts() -> None:
    with pytest.raises(InvalidStageArgumentError, match="only a stage with its own splits="):
        check_split_bytes("enrich", {"a": 1}, own_splits=False)


def test_declared_bytes_from_a_mapping_and_a_callable() -> None:
    assert declared_bytes("s", None, ["a", "b"]) == [None, None]
    assert declared_bytes("s", {"a": 3}, ["a", "b"]) == [3, None]
    assert declared_bytes("s", lambda s: len(s) * 10, ["a", "bcd"]) == [10, 30]


def test_a_callable_returning_a_non_size_is_a_permanent_error_naming_the_split() -> None:
    with pytest.raises(StageDefinitionError, match=r"returned '12' for split 'a'") as caught:
        declared_bytes("ingest", lambda s: "12", ["a"])
    assert is_permanent(caught.value)
    with pytest.raises(StageDefinitionError, match="returned -1"):
        declared_bytes("ingest", lambda s: -1, ["a"])


def test_a_callable_that_raises_fails_the_attempt_retryably_naming_the_split() -> None:
    def broken(split: str) -> int:
        raise OSError("store away")

    with pytest.raises(FinalCheckpointError, match="split_bytes raised on split 'a': OSError"):
        declared_bytes("ingest", broken, ["a"])
    try:
        declared_bytes("ingest", broken, ["a"])
    except FinalCheckpointError as exc:
        assert not is_permanent(exc)


def test_file_bytes_sizes_files_and_directories_and_none_for_missing(tmp_path: Path) -> None:
    (tmp_path / "day=1.parquet").write_bytes(b"x" * 100)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a").write_bytes(b"x" * 7)
    (tmp_path / "dir" / "b").write_bytes(b"x" * 5)
    by_template = file_bytes(f"{tmp_path}/day={{split}}.parquet")
    assert by_template("1") == 100
    assert by_template("2") is None  # unknown, not 0: the stage then weighs splits by count
    assert file_bytes()(str(tmp_path / "dir")) == 12
    assert file_bytes()(f"file://{tmp_path}/day=1.parquet") == 100
    assert file_bytes(lambda s: str(tmp_path / s))("dir") == 12


def test_file_bytes_needs_the_split_field_in_a_template() -> None:
    with pytest.raises(ValueError, match=r"has no \{split\} field"):
        file_bytes("/data/day.parquet")


def test_file_bytes_pickles(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "a").write_bytes(b"x" * 3)
    sized = pickle.loads(pickle.dumps(file_bytes(f"{tmp_path}/{{split}}")))
    assert sized("a") == 3


def _sizer_of(sizes: dict[str, int | None], target_s: float = 30.0) -> BatchSizer:
    policy = BatchPolicy(target_s=target_s)
    return BatchSizer(policy, lambda splits: declared_bytes("s", sizes, splits))


def test_a_cold_source_whose_declared_input_fits_runs_as_one_batch() -> None:
    days = [f"d{i:03d}" for i in range(365)]
    # the example's year at x10: ~34 MB of day files
    sizer = _sizer_of(dict.fromkeys(days, 93_000))
    assert sizer.next_size(days) == 365
    assert sizer.by_bytes


def test_a_cold_source_with_big_declared_input_starts_near_the_target() -> None:
    days = [f"d{i:03d}" for i in range(1000)]
    sizer = _sizer_of(dict.fromkeys(days, 10_000_000))  # 10 GB in all
    first = sizer.next_size(days)
    budget = 30.0 * DEFAULT_COLD_BYTES_PER_S
    assert 1 <= first < len(days)
    assert first * 10_000_000 <= budget < (first + 1) * 10_000_000


def test_one_split_of_unknown_size_falls_back_to_the_probe() -> None:
    days = ["a", "b", "c"]
    sizer = _sizer_of({"a": 10, "b": None, "c": 10})
    assert sizer.next_size(days) == 1
    assert sizer.by_bytes is False
