"""Clear or retry, as a stage task applies it: which try this is (Task SDK ``ti``), what the
rule of ``core.rerun`` makes of it, the reset of a recompute and the record of a publication.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow_finalckpt.core.errors import RecomputeRefusedError
from airflow_finalckpt.core.rerun import (
    AttemptKind,
    Publication,
    TaskTry,
    attempt_kind,
    recompute_refusal,
)


def this_try(context: Any) -> TaskTry | None:
    """The running try from the task context (None where the context has no task instance
    with a try number, e.g. a hand-built context in a test).
    """
    ti = context.get("ti") if hasattr(context, "get") else None
    number = getattr(ti, "try_number", None)
    run_id = context.get("run_id") if hasattr(context, "get") else None
    if ti is None or not isinstance(number, int) or run_id is None:
        return None
    return TaskTry(
        dag_id=str(ti.dag_id), run_id=str(run_id), task_id=str(ti.task_id), try_number=number
    )


def declares_slice(sink: Any) -> bool:
    """Whether a sink declares the slice of its table a pipeline run owns (``replace_slice``),
    so a recomputed commit replaces that slice instead of appending.
    """
    return getattr(sink, "replace_slice", None) is not None


def prepare_attempt(
    coordinator: Any,
    stage_id: str,
    sinks: Sequence[Any],
    context: Any,
    log: logging.Logger | Any,
) -> AttemptKind:
    """Apply the clear-or-retry rule before the stage runs: a stage cleared after it succeeded
    is reset (it recomputes; its sinks replace their slice), or refused with a permanent error
    when a sink declares no slice. Returns what this try does.
    """
    current = this_try(context)
    if current is None:
        return AttemptKind.RUN
    view = coordinator.stage(stage_id)
    published = coordinator.published_by(stage_id)
    kind = attempt_kind(view.lifecycle, published, current)
    if kind is not AttemptKind.RECOMPUTE:
        return kind
    assert published is not None
    unsliced = [str(s.sink_id) for s in sinks if not declares_slice(s)]
    refusal = recompute_refusal(stage_id, published, unsliced, current.dag_id)
    if refusal is not None:
        raise RecomputeRefusedError(refusal)
    coordinator.reset_stages([stage_id])
    log.warning(
        "stage %s was cleared after it succeeded (%s published it, closed on checkpoint %s): "
        "recomputing it from scratch; its sinks replace their slice (rule clear-recomputes)",
        stage_id,
        published.describe(),
        view.closed_checkpoint_id,
    )
    return kind


def record_publication(coordinator: Any, stage_id: str, context: Any) -> Publication | None:
    """The try returns the CLOSED stage to Airflow: remember it (a later try of this task in
    this DAG run is then a clear of a succeeded task). FIRST: no other try returned this close
    before, so this success announces the commit (None: no try or coordinator to record with).
    """
    current = this_try(context)
    publish = getattr(coordinator, "publish", None)
    if current is None or not callable(publish):
        return None
    outcome = publish(stage_id, current)
    return outcome if isinstance(outcome, Publication) else None
