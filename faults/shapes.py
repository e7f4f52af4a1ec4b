"""Branching graphs for the concurrent fault campaign: diamond, fan-out/fan-in and wide.

The stages reuse the fake pipeline's logic (:mod:`faults.fake`): sources
generate rows, ``agg`` stages keep event-time windows, ``relay`` stages pass rows through (a
join of several upstream stages is a relay: its splits are all their output parts) and
``publish`` stages stage every row they read in the run's two sinks. Every agg writes its window
rows with its own key prefix, so all publishers share the sinks and :func:`reference_rows`
computes the one expected table straight from the generators, without any stage code.

- ``diamond``: ``a -> b, a -> c, b + c -> d``: two windowed branches run at once and fan in;
  beside them ``a -> e``, a side branch that aggregates and publishes itself (so ``d`` may run
  while ``e`` still does).
- ``fan``: three sources ``s1, s2, s3 -> join``, then a short branch ``join -> wa -> pa`` and a
  long one ``join -> wb -> rb -> pb``: two publishers, finishing at different times.
- ``wide``: ``src -> x, y, z -> pub``: three branches at once.

A checkpoint that stays pending while a later one completes (FLIP-147's out-of-order
completion) needs three running stages (see ``docs/guarantees.md``), so every random shape has
three that run side by side (``Shape.parallel``): ``b, c, e``; ``s1, s2, s3``; ``x, y, z``.
- ``branching``: the README's branching example (``examples/nycflights13/branching.py``) in
  small: ``ingest, weather -> enrich``, then ``enrich -> delay_windows -> publish`` and
  ``enrich -> carrier_daily``, which aggregates and publishes in one stage (the role
  ``agg+publish``). Its scenarios (:mod:`faults.scenarios`): a branch failing for good while
  its sibling waits, two DAG runs on one pipeline key. Not among the random shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StateHandle
from airflow_finalckpt.runtime.runner import Batch, BatchOutput
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.storage import CheckpointStorage
from faults.fake import (
    COLUMNS,
    AggLogic,
    FakeData,
    GenLogic,
    PublishLogic,
    _FakeLogic,
)

SOURCE = "source"
AGG = "agg"
RELAY = "relay"
PUBLISH = "publish"
#: Windows staged in the sinks by the stage itself (the example's ``carrier_daily``).
AGG_PUBLISH = "agg+publish"
#: The roles whose stages write to the sinks.
PUBLISHING = frozenset({PUBLISH, AGG_PUBLISH})
#: The roles that compute windows (what ``reference_rows`` computes).
WINDOWED = frozenset({AGG, AGG_PUBLISH})


@dataclass(frozen=True)
class StageDef:
    """One stage of a shape: its role, its upstream stages (in split order) and parameters."""

    stage_id: str
    role: str
    upstream: tuple[str, ...] = ()
    #: Sources: the generated input.
    data: FakeData | None = None
    #: Aggs: window length and the prefix of their keys in the sinks.
    window: int = 30
    prefix: str = ""


@dataclass(frozen=True)
class Shape:
    name: str
    stages: tuple[StageDef, ...]
    #: Three or more stages that run side by side (same upstream): what it takes for a
    #: checkpoint to stay pending while a later one completes (the planner's straggler runs).
    parallel: tuple[str, ...] = ()

    @property
    def stage_ids(self) -> tuple[str, ...]:
        return tuple(s.stage_id for s in self.stages)

    def stage(self, stage_id: str) -> StageDef:
        return next(s for s in self.stages if s.stage_id == stage_id)

    def graph(self) -> StageGraph:
        edges = [(up, s.stage_id) for s in self.stages for up in s.upstream]
        return StageGraph.from_edges(self.stage_ids, edges)

    def roles(self, *roles: str) -> tuple[str, ...]:
        return tuple(s.stage_id for s in self.stages if s.role in roles)

    def descendants(self, stage_id: str) -> set[str]:
        """Every stage downstream of ``stage_id`` (Airflow's upstream_failed when it fails)."""
        found: set[str] = set()
        for stage in self.stages:
            if stage_id in stage.upstream:
                found |= {stage.stage_id, *self.descendants(stage.stage_id)}
        return found

    def ancestors(self, stage_id: str) -> set[str]:
        """Every stage upstream of ``stage_id``."""
        found: set[str] = set()
        for up in self.stage(stage_id).upstream:
            found |= {up, *self.ancestors(up)}
        return found

    def sources_of(self, stage_id: str) -> list[StageDef]:
        """The source stages feeding ``stage_id``, in split order (depth first)."""
        stage = self.stage(stage_id)
        if stage.role == SOURCE:
            return [stage]
        found: list[StageDef] = []
        for up in stage.upstream:
            found += [s for s in self.sources_of(up) if s not in found]
        return found


_DATA = FakeData(splits=6)
_SECOND = FakeData(splits=4, keys=4, first=6)
_THIRD = FakeData(splits=3, keys=2, first=10)

SHAPES: dict[str, Shape] = {
    "diamond": Shape(
        "diamond",
        (
            StageDef("a", SOURCE, data=_DATA),
            StageDef("b", AGG, ("a",), window=30, prefix="b:"),
            StageDef("c", AGG, ("a",), window=20, prefix="c:"),
            StageDef("d", PUBLISH, ("b", "c")),
            StageDef("e", AGG_PUBLISH, ("a",), window=40, prefix="e:"),
        ),
        parallel=("b", "c", "e"),
    ),
    "fan": Shape(
        "fan",
        (
            StageDef("s1", SOURCE, data=_DATA),
            StageDef("s2", SOURCE, data=_SECOND),
            StageDef("s3", SOURCE, data=_THIRD),
            StageDef("join", RELAY, ("s1", "s2", "s3")),
            StageDef("wa", AGG, ("join",), window=30, prefix="a:"),
            StageDef("pa", PUBLISH, ("wa",)),
            StageDef("wb", AGG, ("join",), window=20, prefix="b:"),
            StageDef("rb", RELAY, ("wb",)),
            StageDef("pb", PUBLISH, ("rb",)),
        ),
        parallel=("s1", "s2", "s3"),
    ),
    "wide": Shape(
        "wide",
        (
            StageDef("src", SOURCE, data=FakeData(splits=8)),
            StageDef("x", AGG, ("src",), window=30, prefix="x:"),
            StageDef("y", AGG, ("src",), window=20, prefix="y:"),
            StageDef("z", AGG, ("src",), window=40, prefix="z:"),
            StageDef("pub", PUBLISH, ("x", "y", "z")),
        ),
        parallel=("x", "y", "z"),
    ),
    "branching": Shape(
        "branching",
        (
            StageDef("ingest", SOURCE, data=_DATA),
            StageDef("weather", SOURCE, data=_SECOND),
            StageDef("enrich", RELAY, ("ingest", "weather")),
            StageDef("delay_windows", AGG, ("enrich",), window=20, prefix="d:"),
            StageDef("publish", PUBLISH, ("delay_windows",)),
            StageDef("carrier_daily", AGG_PUBLISH, ("enrich",), window=30, prefix="c:"),
        ),
    ),
}
#: The shapes random concurrent runs are drawn from (``--shapes``' default).
RANDOM_SHAPES = ("diamond", "fan", "wide")


class PrefixedAgg(AggLogic):
    """Event-time windows whose sink keys carry the stage's prefix (branches share sinks)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        pipeline_key: str,
        stage_id: str,
        data: FakeData,
        prefix: str,
    ) -> None:
        super().__init__(storage, pipeline_key, stage_id, data)
        self.prefix = prefix

    def _fire(self, until: int) -> list[dict[str, Any]]:
        return [{**row, "key": self.prefix + row["key"]} for row in super()._fire(until)]


class PublishingAgg(PrefixedAgg):
    """Windows staged in the sinks by the aggregating stage itself, in the transaction of the
    batch (or of the finish) that fires them: the example's ``carrier_daily``."""

    def __init__(
        self,
        storage: CheckpointStorage,
        pipeline_key: str,
        stage_id: str,
        data: FakeData,
        prefix: str,
        sinks: Sequence[TwoPhaseCommitSink],
    ) -> None:
        super().__init__(storage, pipeline_key, stage_id, data, prefix)
        self.sinks = list(sinks)
        self._txn_ids: Any = {}

    def process(self, batch: Batch, txn_ids: Any) -> BatchOutput:
        self._txn_ids = txn_ids
        return super().process(batch, txn_ids)

    def finish(self, drain: bool, txn_ids: Any) -> BatchOutput:
        self._txn_ids = txn_ids
        return super().finish(drain, txn_ids)

    def _output(
        self, key: str, fired: list[dict[str, Any]], state: tuple[StateHandle, ...]
    ) -> BatchOutput:
        import pandas as pd

        if fired:
            frame = pd.DataFrame(fired, columns=list(COLUMNS))
            for sink in self.sinks:
                sink.write_pandas(self._txn_ids[sink.sink_id], frame)
        return BatchOutput(state=state, watermark=self.watermark)


class RelayLogic(_FakeLogic):
    """Passes the rows of its splits (upstream parts) on as its own parts: a join, a map."""

    def process(self, batch: Batch, txn_ids: Any) -> BatchOutput:
        return BatchOutput(parts=(self.write_part(batch.key, self.read_parts(batch.splits)),))

    def finish(self, drain: bool, txn_ids: Any) -> BatchOutput:
        return BatchOutput()


def make_logic(
    shape: Shape,
    stage_id: str,
    storage: CheckpointStorage,
    pipeline_key: str,
    sinks: Sequence[TwoPhaseCommitSink],
) -> _FakeLogic:
    stage = shape.stage(stage_id)
    if stage.role == SOURCE:
        assert stage.data is not None
        return GenLogic(storage, pipeline_key, stage_id, stage.data)
    if stage.role == AGG:
        # window length from the stage; lateness from the source data (rows stay on time)
        data = FakeData(window=stage.window)
        return PrefixedAgg(storage, pipeline_key, stage_id, data, stage.prefix)
    if stage.role == AGG_PUBLISH:
        data = FakeData(window=stage.window)
        return PublishingAgg(storage, pipeline_key, stage_id, data, stage.prefix, sinks)
    if stage.role == RELAY:
        return RelayLogic(storage, pipeline_key, stage_id)
    return PublishLogic(storage, pipeline_key, stage_id, sinks)


def windows(rows: Sequence[dict[str, Any]], window: int, prefix: str) -> list[dict[str, Any]]:
    """Tumbling windows per key, computed without any stage code."""
    acc: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        start = row["event"] // window * window
        a = acc.setdefault((prefix + row["key"], start), [0, 0, row["event"], row["event"]])
        a[0] += 1
        a[1] += row["value"]
        a[2] = min(a[2], row["event"])
        a[3] = max(a[3], row["event"])
    return [
        dict(zip(COLUMNS, (key, start, *a), strict=True)) for (key, start), a in sorted(acc.items())
    ]


def reference_rows(shape: Shape, failed: Sequence[str] = ()) -> list[dict[str, Any]]:
    """What the sinks must hold after a run of ``shape``: every agg's windows over the rows of
    the sources feeding it; with ``failed`` stages (failed for good), only the aggs whose
    input and windows reach a sink without passing one of them."""
    expected: list[dict[str, Any]] = []
    for stage in shape.stages:
        if stage.role not in WINDOWED:
            continue
        path = {stage.stage_id, *shape.ancestors(stage.stage_id)}
        if (path | shape.descendants(stage.stage_id)) & set(failed):
            continue
        rows = [
            row
            for source in shape.sources_of(stage.stage_id)
            if source.data is not None
            for split in source.data.split_ids()
            for row in source.data.rows(split)
        ]
        expected += windows(rows, stage.window, stage.prefix)
    return expected


def stage_splits(shape: Shape, stage_id: str, manifests: dict[str, Sequence[str]]) -> list[str]:
    """A stage's splits: a source's generated splits, else its upstream stages' output parts in
    upstream order (what the end_of_data manifests carry, like Airflow XComs)."""
    stage = shape.stage(stage_id)
    if stage.role == SOURCE:
        assert stage.data is not None
        return list(stage.data.split_ids())
    return [part for up in stage.upstream for part in manifests[up]]
