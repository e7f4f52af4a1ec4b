"""Adaptive split batches: the sizing rules on plain values (core/batching.py)."""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.batching import (
    DEFAULT_COLD_BYTES_PER_S,
    MAX_GROWTH,
    BatchPolicy,
    BatchSample,
    Throughput,
    cold_throughput,
    fit,
    next_batch_size,
    policy_from,
)


def test_policy_from_accepts_auto_and_positive_ints_only() -> None:
    assert policy_from("auto").auto
    assert policy_from(None, 12).target_s == 12
    assert policy_from(7).fixed == 7
    for bad in (0, -1, True, "7", 2.5):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1 or 'auto'"):
            policy_from(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_batch_s must be a number > 0"):
        policy_from("auto", 0)


def test_fixed_policy_cuts_fixed_batches() -> None:
    assert next_batch_size(BatchPolicy(fixed=3), None, [1.0] * 10) == 3
    assert next_batch_size(BatchPolicy(fixed=3), None, [1.0] * 2) == 2


def test_first_batch_of_splits_of_unknown_size_is_the_probe() -> None:
    assert next_batch_size(BatchPolicy(probe_splits=2), None, [1.0] * 100) == 2
    assert next_batch_size(BatchPolicy(), None, [1.0] * 100) == 1
    assert next_batch_size(BatchPolicy(), None, []) == 0
    assert cold_throughput(BatchPolicy(), by_bytes=False) is None


def test_a_cold_stage_whose_input_fits_the_target_runs_as_one_batch() -> None:
    # 20 upstream parts of 1 MB: 20 MB <= 30 s at the default 1 MB/s, no probe
    assert DEFAULT_COLD_BYTES_PER_S * 30 >= 20e6
    assert next_batch_size(BatchPolicy(target_s=30), None, [1e6] * 20, by_bytes=True) == 20
    # the same splits weighed as counts (sizes unknown) still probe
    assert next_batch_size(BatchPolicy(target_s=30), None, [1e6] * 20) == 1


def test_a_cold_stage_with_big_input_starts_with_a_batch_near_the_target() -> None:
    policy = BatchPolicy(target_s=10, cold_bytes_per_s=2e6)  # 20 MB per batch
    assert next_batch_size(policy, None, [3e6] * 100, by_bytes=True) == 6  # 18 MB, 7 is 21 MB
    # one part bigger than the budget is still a batch of its own
    assert next_batch_size(policy, None, [50e6, 30e6], by_bytes=True) == 1
    # a tiny target splits even a small input
    assert next_batch_size(BatchPolicy(target_s=0.001), None, [1e4] * 5, by_bytes=True) == 1
    # a measured model wins over the cold default (10 s at 1 byte/s: 10 bytes)
    measured = Throughput(0.0, 1.0, by_bytes=True, samples=(BatchSample(1, 1.0, 1.0),))
    assert next_batch_size(policy, measured, [1.0] * 100, by_bytes=True) == 10
    with pytest.raises(ValueError, match="cold_bytes_per_s must be > 0"):
        BatchPolicy(cold_bytes_per_s=0)


def test_one_sample_is_read_as_all_per_split_cost_so_the_next_batch_never_overshoots() -> None:
    # 1 split took 2 s (of which, unknown to the sizer, 1.5 s fixed): 15 splits for 30 s.
    model = fit([BatchSample(1, 1.0, 2.0)])
    assert model is not None and model.fixed_s == 0 and model.per_unit_s == pytest.approx(2.0)
    size = next_batch_size(BatchPolicy(target_s=30), model, [1.0] * 1000)
    assert size == 15
    assert 1.5 + 0.5 * size <= 30  # the true cost of that batch stays under the target


def test_two_samples_separate_fixed_and_per_split_cost() -> None:
    samples = [BatchSample(1, 1.0, 1.5 + 0.5), BatchSample(15, 15.0, 1.5 + 7.5)]
    model = fit(samples)
    assert model is not None
    assert model.fixed_s == pytest.approx(1.5) and model.per_unit_s == pytest.approx(0.5)
    assert next_batch_size(BatchPolicy(target_s=30), model, [1.0] * 1000) == 57


def test_growth_is_bounded_by_the_largest_batch_measured() -> None:
    model = fit([BatchSample(1, 1.0, 0.001)])
    assert next_batch_size(BatchPolicy(target_s=30), model, [1.0] * 10_000) == MAX_GROWTH


def test_a_small_tail_joins_the_batch_and_max_splits_caps_it() -> None:
    model = Throughput(0.0, 1.0, samples=(BatchSample(10, 10.0, 10.0),))
    assert next_batch_size(BatchPolicy(target_s=10), model, [1.0] * 12) == 12  # tail 2 <= 25 %
    assert next_batch_size(BatchPolicy(target_s=10), model, [1.0] * 14) == 10  # tail 4 > 25 %
    assert next_batch_size(BatchPolicy(target_s=10, max_splits=4), model, [1.0] * 12) == 4


def test_byte_weights_size_batches_by_input_bytes() -> None:
    model = Throughput(0.0, 1e-6, by_bytes=True, samples=(BatchSample(1, 1e6, 1.0),))
    # 10 s at 1 MB/s: a 6 MB split, then 3 MB and 2 MB fit, the 4 MB one does not.
    weights = [6e6, 3e6, 1e6, 4e6, 9e6, 9e6]
    assert next_batch_size(BatchPolicy(target_s=10), model, weights) == 3
    # one huge split still makes a batch of its own
    assert next_batch_size(BatchPolicy(target_s=10), model, [50e6, 40e6]) == 1


def test_a_fixed_cost_over_the_target_still_makes_progress() -> None:
    model = Throughput(40.0, 1.0, samples=(BatchSample(5, 5.0, 45.0),))
    # half the target goes to work: 15 splits, the batch takes 55 s instead of 41 s per split
    assert next_batch_size(BatchPolicy(target_s=30), model, [1.0] * 100) == 15


def test_noisy_samples_never_give_a_negative_or_zero_cost() -> None:
    # bigger batch measured faster: the fit falls back to the per-split bound
    model = fit([BatchSample(1, 1.0, 3.0), BatchSample(10, 10.0, 2.0)])
    assert model is not None and model.per_unit_s > 0 and model.fixed_s >= 0
    assert fit([]) is None
    assert fit([BatchSample(0, 0.0, 1.0)]) is None


def test_throughput_round_trips_and_foreign_hints_are_ignored() -> None:
    model = fit([BatchSample(1, 1.0, 2.0), BatchSample(4, 4.0, 5.0)], by_bytes=True)
    assert model is not None
    assert Throughput.from_dict(model.to_dict()) == model
    for junk in (None, [], {"fixed_s": -1, "per_unit_s": 1}, {"fixed_s": 0, "per_unit_s": 0}):
        assert Throughput.from_dict(junk) is None
    assert Throughput.from_dict({"fixed_s": "x", "per_unit_s": 1}) is None
