"""Rules a pipeline's definition follows, over plain values: what the DAG file shows once it is
whole (stage ids, edges, primary inputs, sinks), so the operators refuse a mistake when the DAG
file is parsed instead of when a task runs (issue 37).

- one ``stage_id`` per task: the store keys a stage's progress and checkpoints by it;
- ``primary_input`` names an upstream stage, and a stage without splits of its own has one to
  read: its splits are that stage's output parts;
- sink ids are unique in the pipeline (the store keys a sink's transactions by them), and no
  two sinks write one target (a table directory, a database table): each would commit every
  row, so one input row would become two committed rows.

Each rule returns one-line messages naming the stages and sinks; the adapters raise them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SinkDecl:
    """A sink as declared: its id and what it writes (None: not known before the task runs)."""

    sink_id: str
    target: str | None = None


@dataclass(frozen=True)
class StageDecl:
    """A stage task as the DAG declares it."""

    task_id: str
    stage_id: str
    #: the stage ids of its upstream stage tasks
    upstream: tuple[str, ...] = ()
    primary_input: str | None = None
    #: whether it declares ``splits=`` (a source) instead of reading an upstream's parts
    own_splits: bool = False
    sinks: tuple[SinkDecl, ...] = ()


def duplicate_stage_ids(stages: Sequence[StageDecl]) -> list[str]:
    """One message per stage id that two tasks carry."""
    first: dict[str, str] = {}
    errors = []
    for stage in stages:
        if stage.stage_id in first:
            errors.append(
                f"stage id {stage.stage_id!r} is given to two tasks ({first[stage.stage_id]!r} "
                f"and {stage.task_id!r}); stage ids must be unique in a pipeline"
            )
        else:
            first[stage.stage_id] = stage.task_id
    return errors


def input_errors(stage: StageDecl) -> list[str]:
    """``primary_input`` names an upstream stage; a stage without splits has one input."""
    upstream = sorted(stage.upstream)
    if stage.primary_input is not None and stage.primary_input not in upstream:
        return [
            f"stage {stage.stage_id!r}: primary_input {stage.primary_input!r} is not an "
            f"upstream stage (its upstream stages: {upstream})"
        ]
    if not stage.own_splits and stage.primary_input is None and len(upstream) != 1:
        return [
            f"stage {stage.stage_id!r} needs `splits` (a source stage) or `primary_input` "
            f"(it has {len(upstream)} upstream stages)"
        ]
    return []


def sink_clashes(owned: Sequence[tuple[str, SinkDecl]]) -> list[str]:
    """Sinks (each with its stage id) that share an id or a target: one message per clash."""
    by_id: dict[str, str] = {}
    by_target: dict[str, tuple[str, str]] = {}
    errors = []
    for stage_id, sink in owned:
        if sink.sink_id in by_id and by_id[sink.sink_id] != stage_id:
            errors.append(
                f"sink id {sink.sink_id!r} is used by stages {by_id[sink.sink_id]!r} and "
                f"{stage_id!r}; sink ids must be unique in a pipeline"
            )
        by_id.setdefault(sink.sink_id, stage_id)
        if sink.target is None:
            continue
        if sink.target in by_target:
            other_sink, other_stage = by_target[sink.target]
            errors.append(
                f"sinks {other_sink!r} (stage {other_stage!r}) and {sink.sink_id!r} (stage "
                f"{stage_id!r}) both write {sink.target}; give a table one sink in a pipeline "
                "(each sink commits every row it is given)"
            )
        else:
            by_target[sink.target] = (sink.sink_id, stage_id)
    return errors


def definition_errors(stages: Sequence[StageDecl]) -> list[str]:
    """Every rule above over a whole pipeline, in the order a reader would fix them."""
    errors = duplicate_stage_ids(stages)
    for stage in stages:
        errors += input_errors(stage)
    errors += sink_clashes([(stage.stage_id, sink) for stage in stages for sink in stage.sinks])
    return errors
