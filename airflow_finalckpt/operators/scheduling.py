"""What a stage takes from the Airflow run it works for: the run's context as plain values
(``core.run_context``), the ``splits`` callable called with it, the empty-input rule, and the
sink slices checked when the DAG is parsed. Plain functions, so the operator only wires them.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from time import time
from typing import Any

from airflow_finalckpt.core.arguments import check_splits
from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.operators.publishing import primary_splits
from airflow_finalckpt.sources.base import IncrementalSource

#: A stage's ``splits``: a list, or a callable taking nothing or the run's context.
ListedSplits = Sequence[str] | Callable[[], Sequence[str]] | Callable[[RunContext], Sequence[str]]
#: ... or an incremental source (``airflow_finalckpt.sources``: what is new since the last run).
SplitsArg = ListedSplits | IncrementalSource


def run_context_of(context: Mapping[str, Any]) -> RunContext:
    """The run's logical date, data interval, partition key and date, params, run id and conf
    from the task context (the DAG run's when the context has none).
    """
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    partition_key = context.get("partition_key", getattr(dag_run, "partition_key", None))
    partition_date = context.get("partition_date", getattr(dag_run, "partition_date", None))
    return RunContext.of(
        dag_id=getattr(dag, "dag_id", None),
        run_id=context.get("run_id"),
        logical_date=context.get("logical_date"),
        data_interval_start=context.get("data_interval_start"),
        data_interval_end=context.get("data_interval_end"),
        partition_key=partition_key,
        partition_date=partition_date,
        params=dict(context.get("params") or {}),
        conf=dict(getattr(dag_run, "conf", None) or {}),
    )


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in kinds or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


def call_splits(stage_id: str, splits: ListedSplits, run: RunContext) -> list[str]:
    """The splits of a source stage: a list as is; a callable with the run's context (or
    without arguments, as before), e.g. ``lambda run: files_of(run.data_interval_start)``.
    """
    if not callable(splits):
        return list(splits)
    declared = splits(run) if _takes_an_argument(splits) else splits()  # type: ignore[call-arg]
    if isinstance(declared, str):
        raise StageDefinitionError(
            f"stage {stage_id!r}: the splits callable returned one string {declared[:40]!r}; "
            "return a list of split ids"
        )
    return list(check_splits(stage_id, declared))


def declared_splits(
    stage: Any,
    manifests: Mapping[str, list[str]],
    context: Any,
    claim: Callable[[Any], list[str]] | None = None,
) -> list[str]:
    """A stage's splits for this run (its own, else its primary input's output parts), checked
    for empty input. ``claim``: the range an incremental source's run reads (recorded once).
    """
    if getattr(stage.splits, "is_incremental_source", False):
        if claim is None:
            raise StageDefinitionError(f"stage {stage.stage_id!r}: no store to claim its range")
        splits = claim(stage.splits)
    elif stage.splits is not None:
        splits = call_splits(stage.stage_id, stage.splits, run_context_of(context))
    else:
        splits = primary_splits(stage.stage_id, stage.primary_input, manifests)
    check_empty(stage.stage_id, splits, stage.allow_empty, stage.log)
    return splits


def check_empty(stage_id: str, splits: Sequence[str], allow_empty: bool, log: Any) -> None:
    """Empty input is worth a warning (a missing day's files?); ``allow_empty=False`` makes
    it an error, before anything is recorded.
    """
    if splits:
        return
    if not allow_empty:
        raise StageDefinitionError(
            f"stage {stage_id!r} has no input (0 splits) and allow_empty=False "
            "(rule empty-input): check the input for this run, or pass allow_empty=True"
        )
    warn = getattr(log, "warning", logging.getLogger(__name__).warning)
    warn(
        "stage %s has no input: 0 splits for this run (it finishes with empty output; pass "
        "allow_empty=False to make this an error)",
        stage_id,
    )


def check_slices(stage_id: str, sinks: Sequence[Any], commit_mode: str) -> None:
    """A sink replaces the slice a run owns only at the final checkpoint: with progressive
    commits each checkpoint would replace the previous one's rows. Checked at parse time.
    """
    slicing = [s.sink_id for s in sinks if getattr(s, "replace_slice", None)]
    if slicing and str(commit_mode) != "final":
        raise ValueError(
            f"stage {stage_id!r}: sinks {slicing} declare replace_slice, which needs "
            f"commit_mode='final' (not {str(commit_mode)!r}): the slice is replaced once, at "
            "the stage's final checkpoint"
        )


class RendersSinksOnCopies:
    """Mixin of the stage operator: Airflow renders the sinks' ``template_fields`` (nested
    templated objects) on copies, so the DAG's own sink objects keep their templates.
    """

    sinks: list[Any]

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Copy the sinks, then let Airflow render (the operator's fields and the sinks')."""
        self.sinks = own_copies(self.sinks)
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]


def own_copies(sinks: Sequence[Any]) -> list[Any]:
    """Copies of the sinks for one task run: Airflow renders nested ``template_fields`` in
    place, which must not change the DAG's own sink objects (the next run renders them again).
    """
    return [copy.copy(s) for s in sinks]


def warn_repeated_dates(
    coordinator: Any, stage: Any, context: Mapping[str, Any], *, republish: bool
) -> dict[str, list[str]]:
    """After a stage's new commit (not a re-publication): record (sink, logical date,
    pipeline) for its sinks without a slice and warn when another pipeline committed the same
    logical date into one (it now holds that date twice). Never fails the task.
    """
    engine = getattr(coordinator, "engine", None)
    appending = [s for s in stage.sinks if not getattr(s, "replace_slice", None)]
    run = run_context_of(context)
    if republish or engine is None or run.logical_date_iso is None or not appending:
        return {}
    from airflow_finalckpt.store.sink_dates import record_sink_dates

    warn = getattr(stage.log, "warning", stage.log.info)
    names = {str(getattr(s, "asset_uri", None) or s.sink_id): s.sink_id for s in appending}
    try:
        others = record_sink_dates(
            engine,
            coordinator.pipeline_key,
            stage.stage_id,
            run.logical_date_iso,
            list(names),
            time(),
        )
    except Exception as exc:  # the record is advisory: the commit is done
        warn("could not record the sink commit dates: %s", exc)
        return {}
    for sink, pipelines in others.items():
        warn(
            "sink %s: pipelines %s already committed logical date %s into it; this commit of "
            "pipeline %s appended, so the date is there more than once. Declare replace_slice "
            "on the sink to replace the date instead (docs/scheduling.md)",
            names[sink],
            pipelines,
            run.logical_date_iso,
            coordinator.pipeline_key,
        )
    return others
