"""Retention of pipelines as a rule over plain values: which pipelines ``finalckpt gc`` removes.

A pipeline is removed (checkpoints, intermediate outputs, state, staging leftovers, store rows;
savepoints only when asked) when

- it is **closed** (every stage CLOSED) and its last change is older than ``retention_days``
  (0: at the next gc): nothing will resume it, and a clear of one of its tasks within the
  retention period still finds its inputs; or
- **every DAG run it was linked to was deleted** from Airflow (asked over Airflow's REST API,
  never its database): nobody can clear, retry or resume it any more; or
- it was **superseded**: its DAG run was deleted and created again under the same run id (the
  new run works on a new pipeline, ``core.run_instance``), and no other DAG run linked to it
  is known to exist.

An open pipeline (running, failed, suspended at a savepoint) whose DAG run still exists is
never removed: a retry, a clear or a resume may continue it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

SECONDS_PER_DAY = 86_400.0


class ExpiryReason(StrEnum):
    """Why a pipeline is removed."""

    EXPIRED = "expired"
    DAG_RUN_DELETED = "dag_run_deleted"


@dataclass(frozen=True)
class PipelineAge:
    """What the rule needs to know of one pipeline."""

    pipeline_key: str
    closed: bool
    last_change: float
    #: per linked DAG run: True exists, False deleted, None not asked / unknown
    dag_runs_exist: Sequence[bool | None] = ()
    #: replaced by the pipeline of its re-created DAG run (whose link moved there)
    superseded: bool = False


def expires_at(age: PipelineAge, retention_days: float) -> float | None:
    """When a closed pipeline expires (epoch seconds); None for an open one."""
    if not age.closed:
        return None
    return age.last_change + retention_days * SECONDS_PER_DAY


def expiry(age: PipelineAge, now: float, retention_days: float) -> ExpiryReason | None:
    """Why the pipeline is removed now, None if it is kept (the module docstring's rule)."""
    if retention_days < 0:
        raise ValueError(f"retention_days must be >= 0, got {retention_days}")
    runs = list(age.dag_runs_exist)
    if runs and all(exists is False for exists in runs):
        return ExpiryReason.DAG_RUN_DELETED
    if age.superseded and all(exists is False for exists in runs):  # none left: its run is gone
        return ExpiryReason.DAG_RUN_DELETED
    deadline = expires_at(age, retention_days)
    if deadline is not None and now >= deadline:
        return ExpiryReason.EXPIRED
    return None
