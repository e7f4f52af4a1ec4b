"""The stage operator's arguments, checked when the DAG file is parsed.

The rules are the pure checks of ``core.arguments``; this module adds the two that need the
package's own types (sinks, Spark execution modes), so a mistake shows as the DAG's import error
naming the stage, the argument and the allowed values, before any Spark work.
"""

from __future__ import annotations

from airflow_finalckpt.core.arguments import (
    argument_error,
    check_choice,
    check_instances,
    check_unique_sink_ids,
)
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.launch import ExecutionMode, parse_mode

#: ``spark_deploy_mode`` values (spark-submit's ``--deploy-mode``).
DEPLOY_MODES = ("client", "cluster")


def check_sinks(stage_id: str, sinks: object) -> list[TwoPhaseCommitSink]:
    """Two-phase-commit sinks with distinct ids (the runner keys a stage's sinks by id)."""
    items: list[TwoPhaseCommitSink] = check_instances(
        stage_id,
        "sinks",
        sinks,
        lambda s: isinstance(s, TwoPhaseCommitSink),
        "two-phase-commit sink (airflow_finalckpt.sinks)",
    )
    check_unique_sink_ids(stage_id, [s.sink_id for s in items])
    return items


def check_execution(stage_id: str, value: object) -> str | None:
    """None (from the connection or ``[finalckpt] spark_execution``) or an execution mode."""
    if value is None:
        return None
    try:
        return parse_mode(value, f"stage {stage_id!r}").value
    except ConfigurationError:
        choices = ", ".join(repr(m.value) for m in ExecutionMode)
        raise argument_error(
            stage_id,
            "spark_execution",
            value,
            f"allowed values are {choices} or None (from the spark_conn_id connection's "
            "'finalckpt-execution' extra or [finalckpt] spark_execution)",
        ) from None


def check_deploy_mode(stage_id: str, value: object) -> str | None:
    """None (from the connection, else client) or ``client`` / ``cluster``."""
    return (
        None if value is None else check_choice(stage_id, "spark_deploy_mode", value, DEPLOY_MODES)
    )
