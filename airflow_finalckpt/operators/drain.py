"""A stage task's drain behaviour from its DAG (``core.drain``): which stage tasks read a
source as their primary input, read from the operators' plain attributes.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.core.drain import default_on_drain


def _primary(task: Any, stages: dict[str, Any]) -> str | None:
    """The stage id whose output parts ``task``'s splits are (None: own splits or not one)."""
    if task.splits is not None:
        return None
    ups = [stages[u] for u in task.upstream_task_ids if u in stages]
    return task.primary_input or (ups[0].stage_id if len(ups) == 1 else None)


def drain_behaviour(task: Any, stage_type: type) -> str:
    """``task.on_drain``, or its default over the DAG's stage tasks (of ``stage_type``)."""
    if task.on_drain is not None:
        return str(task.on_drain)
    tasks: list[Any] = [t for t in task.dag.tasks if isinstance(t, stage_type)]
    stages = {t.task_id: t for t in tasks}
    is_source = not any(u in stages for u in task.upstream_task_ids)
    down = [stages[d] for d in task.downstream_task_ids if d in stages]
    return default_on_drain(task.stage_id, is_source, [_primary(d, stages) for d in down])
