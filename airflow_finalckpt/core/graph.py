"""The pipeline graph: stages, their data edges, and a fingerprint of the shape.

A stage is identified by a stable ``stage_id`` (FLIP-147's operator uid): it is what maps state
from a checkpoint onto a changed DAG. ``task_id`` is the Airflow task that runs the stage today;
it defaults to the stage id and may change without losing state.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_finalckpt.core.errors import InvalidGraphError

#: Stage ids end up in file paths and URLs: keep them to Airflow's task-id alphabet.
STAGE_ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}\Z")


@dataclass(frozen=True)
class Stage:
    """One stage: its id, the stages whose output it reads, and the Airflow task running it."""

    stage_id: str
    upstream: tuple[str, ...] = ()
    task_id: str | None = None

    @property
    def airflow_task_id(self) -> str:
        """The task id in the DAG: ``task_id`` when given, else the stage id."""
        return self.task_id or self.stage_id


@dataclass(frozen=True)
class StageGraph:
    """An immutable, validated DAG of stages."""

    stages: Mapping[str, Stage]
    _downstream: Mapping[str, tuple[str, ...]] = field(
        repr=False, compare=False, default_factory=dict
    )

    @classmethod
    def build(cls, stages: Iterable[Stage]) -> StageGraph:
        """Validate and build a graph; raises InvalidGraphError naming the problem."""
        by_id: dict[str, Stage] = {}
        for stage in stages:
            _check_stage(stage, by_id)
            by_id[stage.stage_id] = stage
        _check_references(by_id)
        downstream: dict[str, list[str]] = {sid: [] for sid in by_id}
        for stage in by_id.values():
            for up in stage.upstream:
                downstream[up].append(stage.stage_id)
        graph = cls(
            stages=dict(sorted(by_id.items())),
            _downstream={k: tuple(sorted(v)) for k, v in downstream.items()},
        )
        graph._check_acyclic()
        return graph

    @classmethod
    def from_edges(cls, stage_ids: Iterable[str], edges: Iterable[tuple[str, str]]) -> StageGraph:
        """Build from stage ids and (upstream, downstream) pairs."""
        ups: dict[str, list[str]] = {sid: [] for sid in stage_ids}
        for up, down in edges:
            if down not in ups:
                raise InvalidGraphError(f"edge {up!r} -> {down!r} names unknown stage {down!r}")
            ups[down].append(up)
        return cls.build(Stage(sid, tuple(u)) for sid, u in ups.items())

    def _check_acyclic(self) -> None:
        white, grey, black = 0, 1, 2
        color = dict.fromkeys(self.stages, white)
        for root in self.stages:
            if color[root] != white:
                continue
            path: list[str] = [root]
            iters: list[Iterator[str]] = [iter(self._downstream[root])]
            color[root] = grey
            while iters:
                nxt = next(iters[-1], None)
                if nxt is None:
                    color[path.pop()] = black
                    iters.pop()
                elif color[nxt] == grey:
                    cycle = [*path[path.index(nxt) :], nxt]
                    raise InvalidGraphError("cycle between stages: " + " -> ".join(cycle))
                elif color[nxt] == white:
                    color[nxt] = grey
                    path.append(nxt)
                    iters.append(iter(self._downstream[nxt]))

    # -- queries ---------------------------------------------------------------------------

    def __contains__(self, stage_id: object) -> bool:
        return stage_id in self.stages

    def __len__(self) -> int:
        return len(self.stages)

    @property
    def stage_ids(self) -> list[str]:
        """Every stage id, sorted."""
        return list(self.stages)

    def upstream(self, stage_id: str) -> tuple[str, ...]:
        """The stages whose output ``stage_id`` reads."""
        return self.stages[stage_id].upstream

    def downstream(self, stage_id: str) -> tuple[str, ...]:
        """The stages that read the output of ``stage_id``, sorted."""
        return self._downstream[stage_id]

    def sources(self) -> list[str]:
        """Stages without upstream stages: they read the pipeline's input."""
        return [sid for sid, s in self.stages.items() if not s.upstream]

    def topological_order(self) -> list[str]:
        """Stage ids, every stage after all its upstream stages (ties broken by id)."""
        indegree = {sid: len(s.upstream) for sid, s in self.stages.items()}
        # A heap of the ready ids: the smallest first, as re-sorting a list after every stage
        # did, in O(N log N) instead of O(N^2 log N) (every trigger orders the graph).
        ready = [sid for sid, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            sid = heapq.heappop(ready)
            order.append(sid)
            for down in self._downstream[sid]:
                indegree[down] -= 1
                if indegree[down] == 0:
                    heapq.heappush(ready, down)
        return order

    def ancestors(self, stage_id: str) -> set[str]:
        """Every stage ``stage_id`` depends on, directly or through others."""
        seen: set[str] = set()
        todo = list(self.upstream(stage_id))
        while todo:
            sid = todo.pop()
            if sid not in seen:
                seen.add(sid)
                todo.extend(self.upstream(sid))
        return seen

    # -- identity and (de)serialization ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, as checkpoint metadata stores it (``from_dict`` reads it)."""
        return {
            "stages": [
                {"stage_id": s.stage_id, "upstream": sorted(s.upstream), "task_id": s.task_id}
                for s in self.stages.values()
            ]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageGraph:
        """The graph of ``to_dict`` output, validated like ``build``; malformed input is an
        InvalidGraphError.
        """
        try:
            stages = [_stage_from_dict(s) for s in data["stages"]]
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidGraphError(f"malformed graph description: {exc!r}") from exc
        return cls.build(stages)

    @property
    def fingerprint(self) -> str:
        """sha256 of the shape (stage ids and edges); task ids do not count."""
        shape = [[sid, sorted(s.upstream)] for sid, s in self.stages.items()]
        blob = json.dumps(shape, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def _stage_from_dict(data: Mapping[str, Any]) -> Stage:
    """One stage of ``StageGraph.to_dict`` output, refusing anything that is not that shape."""
    stage_id, upstream, task_id = data["stage_id"], data.get("upstream", []), data.get("task_id")
    if not isinstance(stage_id, str):
        raise TypeError(f"stage_id must be a string, got {stage_id!r}")
    if not isinstance(upstream, list | tuple) or not all(isinstance(u, str) for u in upstream):
        raise TypeError(f"upstream of {stage_id!r} must be a list of stage ids, got {upstream!r}")
    if task_id is not None and not isinstance(task_id, str):
        raise TypeError(f"task_id of {stage_id!r} must be a string or null, got {task_id!r}")
    return Stage(stage_id=stage_id, upstream=tuple(upstream), task_id=task_id)


def _check_stage(stage: Stage, earlier: Mapping[str, Stage]) -> None:
    """One stage before it joins ``earlier``: ids of the allowed shape, its id not taken, no
    upstream stage listed twice.
    """
    if not isinstance(stage.stage_id, str) or not STAGE_ID_PATTERN.match(stage.stage_id):
        raise InvalidGraphError(
            f"invalid stage id {stage.stage_id!r}: use 1-250 characters of letters, "
            "digits, '_', '.' and '-', not starting with '.' or '-'"
        )
    if stage.stage_id in earlier:
        raise InvalidGraphError(f"duplicate stage id {stage.stage_id!r}")
    if stage.task_id is not None and not (
        isinstance(stage.task_id, str) and STAGE_ID_PATTERN.match(stage.task_id)
    ):
        raise InvalidGraphError(
            f"stage {stage.stage_id!r} has an invalid task id {stage.task_id!r}: use "
            "1-250 characters of letters, digits, '_', '.' and '-'"
        )
    if len(set(stage.upstream)) != len(stage.upstream):
        raise InvalidGraphError(f"stage {stage.stage_id!r} lists an upstream stage twice")


def _check_references(by_id: Mapping[str, Stage]) -> None:
    """Across stages: one stage per Airflow task, every upstream stage known."""
    task_ids: dict[str, str] = {}
    for stage in by_id.values():
        other = task_ids.setdefault(stage.airflow_task_id, stage.stage_id)
        if other != stage.stage_id:
            raise InvalidGraphError(
                f"stages {other!r} and {stage.stage_id!r} both run as task "
                f"{stage.airflow_task_id!r}"
            )
        for up in stage.upstream:
            if up not in by_id:
                raise InvalidGraphError(f"stage {stage.stage_id!r} depends on unknown stage {up!r}")
