"""Adaptive split batches: how many splits the next batch takes, from measured throughput.

A batch is the unit of durability (a crash redoes at most the batch in flight, a stop with
savepoint answers at the next batch boundary), not of the user's thinking. So its size follows a
*duration*: ``target_s``. The rules here are pure functions over plain values; the runtime feeds
them the seconds each batch took and persists the resulting estimate, so a resumed attempt (or
the next run of the same DAG) starts from what was measured. Before anything was measured, a
stage whose splits have known sizes (input bytes) assumes a conservative throughput
(``DEFAULT_COLD_BYTES_PER_S``), so a small input runs as one batch; only splits of unknown size
start with a probe of ``probe_splits``.

Cost model: a batch of weight ``w`` (splits, or input bytes where the splits declare a size)
takes ``fixed_s + per_unit_s * w``. One sample cannot separate the two, so it is read as all
per-unit cost, which over-estimates the marginal cost: a batch sized from it never overshoots the
target (with fixed cost >= 0). From two samples of different weights on, a least-squares fit
over the recent samples separates them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The default target duration of a batch. At 30 s the fixed cost of a batch (one Spark job to
#: read, one to write, one coordinator transaction: ~0.3-1 s on local Spark) is 1-3 % of it, a
#: crash redoes at most ~30 s of work and a stop with savepoint waits at most ~30 s
#: (docs/benchmarks.md has the measured curve).
DEFAULT_TARGET_BATCH_S = 30.0
#: Splits of the very first batch when nothing was measured yet and the splits' sizes are unknown
#: (source splits: a split id says nothing about how much it reads).
DEFAULT_PROBE_SPLITS = 1
#: Input bytes per second assumed for the first batch of a stage when nothing was measured yet
#: but every pending split's size is known (upstream output parts from their files, a source's
#: splits from its ``split_bytes``): the batch takes about ``target_s * cold_bytes_per_s`` bytes,
#: so a stage whose input fits runs as one batch and a big one starts near the target.
#: Evidence (docs/benchmarks.md, the example on local[2], input MB/s of whole one-batch stages,
#: so fixed costs included): quiet machine (load 1-2), ingest 4-5 MB/s on its day files (17.5 MB
#: x1, 34 MB x10), enrich 2-3.6 MB/s on ingest's parts (6.9 / 34.5 MB), delay_windows 6-35 MB/s;
#: overloaded (load 18-29 on 2 cores, 2026-11-27 16:23-16:45) ingest 0.25-0.5, enrich 0.15-0.18,
#: delay_windows 1.2-8.7 MB/s. 1 MB/s keeps the first batch within the target up to a 2-4x
#: slowdown of the dearest stage and splits nothing the example reads at x1 or x10 (the x10
#: day files, 34 MB, are one batch: the 4 MB over 30 MB are a tail that joins). Overloaded, a
#: big first batch may run up to ~6x the target (x10 enrich: 34 MB in 199 s); a default slow
#: enough for that (0.15 MB/s) would cut x1 ingest, 4 s on a quiet machine, into 4 batches, each
#: paying the per-batch fixed cost. The spread is per transform (enrich slowest, delay_windows
#: fastest, both reading parts), not source vs parts, so one default serves both; the measured
#: fit sizes every later batch.
DEFAULT_COLD_BYTES_PER_S = 1_000_000.0
#: Upper bound on splits per batch (a batch is one Spark job reading all its splits).
DEFAULT_MAX_BATCH_SPLITS = 10_000
#: A batch may grow at most this many times over the largest batch measured.
MAX_GROWTH = 64.0
#: A tail smaller than this fraction of a batch joins the batch before it.
TAIL_FRACTION = 0.25
#: Samples the fit uses (the most recent ones).
FIT_WINDOW = 6


@dataclass(frozen=True)
class BatchPolicy:
    """``fixed``: a fixed split count (``batch_size=N``); else sized to ``target_s`` seconds."""

    target_s: float = DEFAULT_TARGET_BATCH_S
    fixed: int | None = None
    probe_splits: int = DEFAULT_PROBE_SPLITS
    max_splits: int = DEFAULT_MAX_BATCH_SPLITS
    cold_bytes_per_s: float = DEFAULT_COLD_BYTES_PER_S

    def __post_init__(self) -> None:
        if self.fixed is not None and (isinstance(self.fixed, bool) or self.fixed < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or 'auto', got {self.fixed!r}")
        if not (isinstance(self.target_s, int | float) and self.target_s > 0):
            raise ValueError(f"target_batch_s must be a number > 0, got {self.target_s!r}")
        if self.probe_splits < 1 or self.max_splits < 1:
            raise ValueError("probe_splits and max_splits must be >= 1")
        if not self.cold_bytes_per_s > 0:
            raise ValueError(f"cold_bytes_per_s must be > 0, got {self.cold_bytes_per_s!r}")

    @property
    def auto(self) -> bool:
        """Whether batch sizes adapt to the measured throughput (no fixed size given)."""
        return self.fixed is None

    def describe(self) -> str:
        """The policy in words, for logs and the UI."""
        return f"batches of {self.fixed}" if self.fixed else f"auto batches of ~{self.target_s:g}s"


def policy_from(
    batch_size: int | str | None,
    target_batch_s: float | None = None,
    max_splits: int = DEFAULT_MAX_BATCH_SPLITS,
) -> BatchPolicy:
    """The policy of a stage argument: ``"auto"`` / None (adaptive) or a positive int."""
    target = DEFAULT_TARGET_BATCH_S if target_batch_s is None else target_batch_s
    if batch_size is None or batch_size == "auto":
        return BatchPolicy(target_s=target, max_splits=max_splits)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ValueError(f"batch_size must be an integer >= 1 or 'auto', got {batch_size!r}")
    return BatchPolicy(target_s=target, fixed=batch_size, max_splits=max_splits)


@dataclass(frozen=True)
class BatchSample:
    """One measured batch: its splits, its weight (splits or bytes) and its seconds."""

    splits: int
    weight: float
    seconds: float


@dataclass(frozen=True)
class Throughput:
    """The fitted cost model; ``by_bytes``: weights are input bytes, else split counts."""

    fixed_s: float
    per_unit_s: float
    by_bytes: bool = False
    samples: tuple[BatchSample, ...] = field(default=())

    def seconds(self, weight: float) -> float:
        """Predicted seconds of a batch of ``weight`` units under this model."""
        return self.fixed_s + self.per_unit_s * weight

    def units_per_s(self) -> float:
        """Units (splits or bytes) per second beyond the fixed cost; infinite if free."""
        return 1.0 / self.per_unit_s if self.per_unit_s > 0 else math.inf

    def rate(self) -> str:
        """E.g. ``2.00 splits/s + 1.50s per batch`` or ``12.3 MB/s + 0.40s per batch``."""
        if self.by_bytes:
            speed = f"{self.units_per_s() / 1e6:.1f} MB/s"
        else:
            speed = f"{self.units_per_s():.2f} splits/s"
        return f"{speed} + {self.fixed_s:.2f}s per batch"

    def describe(self) -> str:
        """The latest batch and the rate, for logs, ``finalckpt progress`` and the UI."""
        if not self.samples:
            return self.rate()
        last = self.samples[-1]
        return f"last batch {last.splits} splits in {last.seconds:.1f}s, {self.rate()}"

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able form for the stored hint (``from_dict`` reads it back)."""
        return {
            "fixed_s": self.fixed_s,
            "per_unit_s": self.per_unit_s,
            "by_bytes": self.by_bytes,
            "samples": [[s.splits, s.weight, s.seconds] for s in self.samples],
        }

    @classmethod
    def from_dict(cls, doc: object) -> Throughput | None:
        """None for anything that is not a well-formed estimate (a hint, never an error)."""
        try:
            assert isinstance(doc, dict)
            samples = tuple(
                BatchSample(int(n), float(w), float(s)) for n, w, s in doc.get("samples", [])
            )
            fixed, per_unit = float(doc["fixed_s"]), float(doc["per_unit_s"])
            if not (fixed >= 0 and per_unit > 0 and math.isfinite(fixed + per_unit)):
                return None
            return cls(fixed, per_unit, bool(doc.get("by_bytes", False)), samples)
        except (AssertionError, KeyError, TypeError, ValueError):
            return None


def fit(samples: Sequence[BatchSample], *, by_bytes: bool = False) -> Throughput | None:
    """The cost model of the recent samples (None without a usable sample)."""
    usable = [s for s in samples if s.weight > 0 and s.seconds >= 0][-FIT_WINDOW:]
    if not usable:
        return None
    # Upper bound of the marginal cost: the cheapest per-unit cost seen with fixed cost 0.
    bound = min(max(s.seconds, 1e-6) / s.weight for s in usable)
    fixed, per_unit = 0.0, bound
    weights = [s.weight for s in usable]
    if len(set(weights)) >= 2:
        n = len(usable)
        mean_w = sum(weights) / n
        mean_s = sum(s.seconds for s in usable) / n
        var = sum((w - mean_w) ** 2 for w in weights)
        cov = sum((s.weight - mean_w) * (s.seconds - mean_s) for s in usable)
        slope = cov / var
        intercept = mean_s - slope * mean_w
        if slope > 0 and intercept >= 0:
            fixed, per_unit = intercept, min(slope, bound)
        elif slope > 0:
            fixed, per_unit = 0.0, min(slope, bound)
    return Throughput(fixed, per_unit, by_bytes, tuple(usable))


def cold_throughput(policy: BatchPolicy, *, by_bytes: bool) -> Throughput | None:
    """The assumed model before anything was measured: the policy's conservative bytes per
    second when the weights are input bytes; None (probe ``probe_splits``) for split counts.
    """
    if not by_bytes:
        return None
    return Throughput(0.0, 1.0 / policy.cold_bytes_per_s, by_bytes=True)


def next_batch_size(
    policy: BatchPolicy,
    throughput: Throughput | None,
    pending_weights: Sequence[float],
    *,
    by_bytes: bool = False,
) -> int:
    """How many of the pending splits (in order, with their weights) the next batch takes;
    ``by_bytes``: the weights are input bytes (sized from ``cold_throughput`` when nothing was
    measured yet, instead of a probe).
    """
    pending = len(pending_weights)
    if pending == 0:
        return 0
    if policy.fixed is not None:
        return min(policy.fixed, pending)
    cap = min(policy.max_splits, pending)
    if throughput is None:
        throughput = cold_throughput(policy, by_bytes=by_bytes)
    if throughput is None:
        return min(policy.probe_splits, cap)
    # A fixed cost near or over the target cannot be amortized below it: give the work at
    # least half the target then (the batch takes at most fixed + target / 2).
    work_s = max(policy.target_s - throughput.fixed_s, policy.target_s / 2)
    budget = work_s / throughput.per_unit_s
    largest = max((s.weight for s in throughput.samples), default=0.0)
    if largest > 0:
        budget = min(budget, largest * MAX_GROWTH)
    taken, total = 0, 0.0
    for weight in pending_weights[:cap]:
        if taken and total + weight > budget:
            break
        taken += 1
        total += weight
    rest = sum(pending_weights[taken:cap])
    if taken < cap and cap == pending and rest <= TAIL_FRACTION * max(total, 1e-9):
        taken = cap  # a small tail joins this batch instead of paying a batch of its own
    return max(1, taken)
