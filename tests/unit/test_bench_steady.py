"""The pure parts of the steady-state, cold-profile and x100 benchmarks: the rotation order, the
input cache, the /proc and JVM figures' arithmetic, the cold profile's run order and its
cold-minus-warm table, and the x100 plans. Nothing here starts Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import x100
from benchmarks.cold_profile import differences, sequence
from benchmarks.common import Case
from benchmarks.pipelines import COMPLETE_MARKER, STAGES, cached
from benchmarks.process_stats import (
    children_of,
    deltas,
    parse_status_kb,
    peak_rss_mb,
    reset_peak_rss,
    sum_peaks,
)
from benchmarks.run import OPT_IN, resolve
from benchmarks.steady_state import DOWNSTREAM_SECONDS, _paired, rotation

STATUS = """Name:\tjava
VmPeak:\t 4221016 kB
VmHWM:\t  946872 kB
VmRSS:\t  900000 kB
Threads:\t42
"""


def _stages(name: str, runs: list[tuple[float, float, float, float]]) -> Case:
    case = Case(name)
    for run in runs:
        for stage, seconds in zip(STAGES, run, strict=True):
            case.add(f"{stage}_s", seconds)
    return case


def test_paired_enrich_to_publish_ratios_cancel_a_drift_that_moves_both_sides() -> None:
    # the machine slows down 2x between the repetitions; ours is 10 % dearer in both
    plain = _stages("plain", [(9.0, 1.0, 1.0, 1.0), (1.0, 2.0, 2.0, 2.0)])
    ours = _stages("ours", [(1.0, 1.1, 1.1, 1.1), (9.0, 2.2, 2.2, 2.2)])
    assert _paired(ours, plain, DOWNSTREAM_SECONDS) == pytest.approx([1.1, 1.1])


@pytest.mark.parametrize("reps", [2, 4])
def test_rotation_gives_every_side_the_same_mean_position(reps: int) -> None:
    sides = ("plain", "ours", "ours-cold")
    orders = [rotation(rep, sides) for rep in range(reps)]
    assert orders[0] == ["plain", "ours", "ours-cold"]
    assert orders[1] == ["ours-cold", "ours", "plain"]
    means = {s: sum(o.index(s) for o in orders) / reps for s in sides}
    assert len(set(means.values())) == 1, means


def test_rotation_of_two_sides_is_abba() -> None:
    order = [side for rep in range(2) for side in rotation(rep, ("plain", "ours"))]
    assert order == ["plain", "ours", "ours", "plain"]


def test_cached_builds_once_and_reuses(tmp_path: Path) -> None:
    built: list[Path] = []

    def build(dest: Path) -> None:
        built.append(dest)
        (dest / "data.txt").write_text("rows")

    first = cached(tmp_path, "flights-2d-x100", build)
    again = cached(tmp_path, "flights-2d-x100", build)
    assert first == again == tmp_path / "flights-2d-x100"
    assert len(built) == 1 and built[0].name == "flights-2d-x100.tmp"
    assert (first / "data.txt").read_text() == "rows"
    assert (first / COMPLETE_MARKER).exists()
    assert not (tmp_path / "flights-2d-x100.tmp").exists()


def test_cached_never_uses_an_interrupted_build(tmp_path: Path) -> None:
    def broken(dest: Path) -> None:
        (dest / "half.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        cached(tmp_path, "k", broken)
    assert not (tmp_path / "k").exists()
    # a directory left without the marker (e.g. killed before it) is rebuilt, not used
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "stale.txt").write_text("stale")
    done = cached(tmp_path, "k", lambda dest: (dest / "new.txt").write_text("new"))
    assert sorted(p.name for p in done.iterdir()) == [COMPLETE_MARKER, "new.txt"]


def test_status_fields_in_kb() -> None:
    assert parse_status_kb(STATUS, "VmHWM") == 946872
    assert parse_status_kb(STATUS, "VmRSS") == 900000
    assert parse_status_kb(STATUS, "VmSwap") is None
    assert parse_status_kb(STATUS, "Threads") is None  # no kB figure: not a memory field


def test_peak_rss_reset_and_children_from_a_proc_tree(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7" / "task" / "7").mkdir(parents=True)
    (proc / "7" / "task" / "8").mkdir(parents=True)
    (proc / "7" / "status").write_text(STATUS)
    (proc / "7" / "task" / "7" / "children").write_text("11 12 ")
    (proc / "7" / "task" / "8" / "children").write_text("13")
    assert peak_rss_mb(7, proc) == pytest.approx(946872 / 1024)
    assert peak_rss_mb(99, proc) is None
    assert children_of(7, proc) == [11, 12, 13]
    assert children_of(99, proc) == []
    assert reset_peak_rss(7, proc) is True
    assert (proc / "7" / "clear_refs").read_text() == "5"
    assert reset_peak_rss(99, proc) is False


def test_deltas_subtract_counters_and_keep_gauges() -> None:
    before = {"jit_ms": 100.0, "gc_ms": 5.0, "classes_loaded": 9000.0, "jvm_heap_peak_mb": 1.0}
    after = {"jit_ms": 350.0, "gc_ms": 5.0, "classes_loaded": 9040.0, "jvm_heap_peak_mb": 700.0}
    assert deltas(before, after) == {
        "jit_ms": 250.0,
        "gc_ms": 0.0,
        "classes_loaded": 40.0,
        "jvm_heap_peak_mb": 700.0,
    }
    assert deltas({}, {"jit_ms": 3.0}) == {}


def test_heap_peak_sums_the_heap_pools_only() -> None:
    pools = [("HEAP", 300e6), ("NON_HEAP", 80e6), ("HEAP", 200e6)]
    assert sum_peaks(pools) == pytest.approx(500.0)


def test_cold_profile_order_opens_with_the_chosen_side() -> None:
    assert sequence("plain")[:2] == ["plain", "ours-cold"]
    assert sequence("ours")[:2] == ["ours-cold", "plain"]
    for first in ("plain", "ours"):
        rest = sequence(first)[2:]
        assert rest == ["plain", "ours-warm", "ours-cold"] * 2


def test_cold_minus_warm_ranks_product_functions_by_extra_seconds() -> None:
    cold = [{"a": 3.0, "b": 1.0}, {"a": 5.0, "b": 1.0, "c": 0.5}]
    warm = [{"a": 2.0, "b": 1.5}, {"a": 2.0, "b": 0.5}]
    rows = differences(cold, warm, top=2)
    assert [r["function"] for r in rows] == ["a", "c"]
    assert rows[0] == {"function": "a", "cold_s": 4.0, "warm_s": 2.0, "extra_s": 2.0}
    assert rows[1]["extra_s"] == 0.25  # a function only one cold run called: its mean


def test_x100_is_opt_in_with_aliases() -> None:
    assert "steady_state_overhead_x100" not in resolve(None)
    assert "resume_savings_x100" not in resolve(None)
    assert {"steady_state_overhead_x100", "resume_savings_x100"} <= set(OPT_IN)
    assert resolve(["overhead_x100", "resume_x100"]) == [
        "steady_state_overhead_x100",
        "resume_savings_x100",
    ]


def test_x100_resume_plan_gives_enrich_eight_splits_at_the_default_target() -> None:
    plan = x100.resume_plan(quick=False)
    assert plan["row_scale"] == 100 and plan["days"] == 365
    assert plan["ingest_batch_size"] == 46  # ceil(365 / 8): 8 ingest parts, enrich's splits
    assert plan["target_batch_s"] == {"enrich": 30.0}
    assert x100.resume_plan(quick=True)["days"] == x100.QUICK_DAYS
