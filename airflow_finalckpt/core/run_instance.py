"""Same DAG run or re-created: the rule, over plain values, that keeps a DAG run which was
deleted and created again (a backfill of a day whose run was deleted: Airflow gives it the same
run id) from continuing the deleted run's pipeline.

Task code may not read Airflow's metadata DB (Airflow 3), so a task tells its DAG run instance
from what the Task SDK gives it (``context["dag_run"]``): ``run_after`` (set when the run is
created, never changed), ``start_date`` (set when the run starts; a clear of a *finished* run
starts it again) and ``clear_number`` (0 for a new run, +1 at every clear). The plugin records
these when the run first works on its pipeline, and moves the record forward as the run is
cleared. A later task of a DAG run with the same ids is

- the **same run** when nothing differs, or when it was cleared since the record (its
  ``clear_number`` grew: a clear of a finished run gave it a new ``start_date``), as long as its
  ``run_after`` did not change;
- a **re-created run** when its ``run_after`` differs (a manual run created again), its
  ``clear_number`` went back (a new run starts at 0), or its ``start_date`` differs with no
  clear since the record (a new run of a deterministic ``run_after``: backfills, schedules).

Nothing recorded (a run linked before this rule, or a context without a DAG run): same run, as
before. A run created again *and* cleared before any of its stage tasks ran cannot be told
from a clear of the original (docs/scheduling.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def _iso(value: Any) -> str | None:
    """A datetime as an ISO string in UTC (None stays None; a string is kept as given)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return str(value.isoformat())
    return str(value)


@dataclass(frozen=True)
class RunInstance:
    """What the Task SDK tells a task about its DAG run instance (ISO strings in UTC)."""

    run_after: str | None
    start_date: str | None
    clear_number: int = 0

    @classmethod
    def of(cls, *, run_after: Any, start_date: Any, clear_number: Any) -> RunInstance:
        """From the Task SDK's DagRun fields (datetimes, the clear count or None)."""
        number = clear_number if isinstance(clear_number, int) else 0
        return cls(run_after=_iso(run_after), start_date=_iso(start_date), clear_number=number)

    def to_dict(self) -> dict[str, Any]:
        """As stored in ``finalckpt_dag_runs.run_instance``."""
        return {
            "run_after": self.run_after,
            "start_date": self.start_date,
            "clear_number": self.clear_number,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunInstance | None:
        """The stored record, None if there is none or it is malformed (treated as none)."""
        if not isinstance(data, Mapping):
            return None
        number = data.get("clear_number", 0)
        if not isinstance(number, int) or isinstance(number, bool):
            return None
        run_after, start = data.get("run_after"), data.get("start_date")
        if not all(v is None or isinstance(v, str) for v in (run_after, start)):
            return None
        return cls(run_after=run_after, start_date=start, clear_number=number)


def is_recreated(recorded: RunInstance | None, current: RunInstance | None) -> bool:
    """Whether ``current`` is another DAG run instance than the one ``recorded`` was taken
    from (the module docstring's rule).
    """
    if recorded is None or current is None:
        return False
    if None not in (recorded.run_after, current.run_after) and (
        recorded.run_after != current.run_after
    ):
        return True
    if current.clear_number < recorded.clear_number:
        return True
    if current.clear_number > recorded.clear_number:
        return False  # cleared since: a clear of a finished run restarts it (new start_date)
    if None in (recorded.start_date, current.start_date):
        return False
    return recorded.start_date != current.start_date


def moves_record_forward(recorded: RunInstance | None, current: RunInstance) -> bool:
    """Whether the record of a run (found the same run) is replaced by ``current``: when it
    changed and is not older (a try that started before a clear never moves it back).
    """
    if recorded is None:
        return True
    return current != recorded and current.clear_number >= recorded.clear_number


@dataclass(frozen=True)
class RunLink:
    """What the store recorded of a DAG run id: its pipeline, the default key's generation
    and the run instance that worked on it (None: not recorded).
    """

    pipeline_key: str
    generation: int = 1
    instance: RunInstance | None = None


@dataclass(frozen=True)
class KeyChoice:
    """The pipeline a DAG run without an explicit key works on; ``replaces``: the pipeline
    of the deleted run it was re-created from (superseded), None if it is no re-created run.
    """

    pipeline_key: str
    generation: int = 1
    replaces: str | None = None


def choose_default_key(
    link: RunLink | None, current: RunInstance | None, key_of: Callable[[int], str]
) -> KeyChoice:
    """The pipeline of a DAG run that names no key: the one it is linked to, unless it is a
    re-created run (``is_recreated``): then the next generation of its default key
    (``key_of(generation)``), a new pipeline replacing the deleted run's.
    """
    if link is None:
        return KeyChoice(key_of(1))
    if not is_recreated(link.instance, current):
        return KeyChoice(link.pipeline_key, link.generation)
    generation = link.generation + 1
    return KeyChoice(key_of(generation), generation, replaces=link.pipeline_key)
