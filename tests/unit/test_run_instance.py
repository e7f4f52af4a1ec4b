"""Same DAG run or re-created (issue 38): the rule of ``core.run_instance`` over plain values,
the re-created run's next key generation, the store's record of a run id (SQLite) and the
retention of the pipeline a re-created run superseded.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.pipeline_keys import default_pipeline_key
from airflow_finalckpt.core.retention import ExpiryReason, PipelineAge, expiry
from airflow_finalckpt.core.run_instance import (
    KeyChoice,
    RunInstance,
    RunLink,
    choose_default_key,
    is_recreated,
    moves_record_forward,
)
from airflow_finalckpt.storage import validate_pipeline_key
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from airflow_finalckpt.store.pipelines import pipeline_rows
from airflow_finalckpt.store.repository import dag_run_link

DAY_END = "2013-01-02T00:00:00+00:00"  # a backfill's run_after: the end of its interval
STARTED = "2026-11-28T10:00:00+00:00"
RESTARTED = "2026-11-28T11:00:00+00:00"
ORIGINAL = RunInstance(run_after=DAY_END, start_date=STARTED, clear_number=0)


@pytest.mark.parametrize(
    ("current", "recreated"),
    [
        (ORIGINAL, False),  # another task or a retry of the run: nothing differs
        # a clear while the run is still running: clear_number grows, start_date stays
        (RunInstance(DAY_END, STARTED, 1), False),
        # a clear of a finished run: Airflow starts it again (a new start_date)
        (RunInstance(DAY_END, RESTARTED, 1), False),
        # deleted and created again by a backfill: same run_after, started anew, never cleared
        (RunInstance(DAY_END, RESTARTED, 0), True),
        # a manual run created again: another run_after, even if it was cleared since
        (RunInstance("2026-11-28T10:59:00+00:00", RESTARTED, 3), True),
        (RunInstance(DAY_END, None, 0), False),  # no start date to compare: the same
    ],
)
def test_a_run_is_recreated_only_when_its_instance_cannot_be_the_recorded_one(
    current: RunInstance, recreated: bool
) -> None:
    assert is_recreated(ORIGINAL, current) is recreated


def test_a_new_run_starts_at_clear_number_zero_below_a_cleared_original() -> None:
    cleared_twice = RunInstance(DAY_END, RESTARTED, 2)
    assert is_recreated(cleared_twice, RunInstance(DAY_END, RESTARTED, 0)) is True
    assert is_recreated(cleared_twice, RunInstance(DAY_END, RESTARTED, 2)) is False


def test_nothing_recorded_or_no_dag_run_in_the_context_is_the_same_run() -> None:
    assert is_recreated(None, ORIGINAL) is False
    assert is_recreated(ORIGINAL, None) is False


def test_the_record_moves_forward_with_clears_never_back() -> None:
    cleared = RunInstance(DAY_END, RESTARTED, 1)
    assert moves_record_forward(None, ORIGINAL)
    assert moves_record_forward(ORIGINAL, cleared)
    assert not moves_record_forward(cleared, ORIGINAL)  # a try older than the clear
    assert not moves_record_forward(cleared, cleared)


def test_the_instance_is_read_from_datetimes_in_utc_and_malformed_records_are_none() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    got = RunInstance.of(
        run_after=dt.datetime(2013, 1, 2, 1, tzinfo=paris),
        start_date=dt.datetime(2026, 11, 28, 10, tzinfo=dt.UTC),
        clear_number=None,
    )
    assert got == RunInstance(DAY_END, STARTED, 0)
    assert RunInstance.from_dict(got.to_dict()) == got
    assert RunInstance.from_dict({"clear_number": "1"}) is None
    assert RunInstance.from_dict({"run_after": 5}) is None
    assert RunInstance.from_dict(None) is None


def _key_of(generation: int) -> str:
    return default_pipeline_key("daily", "backfill__" + DAY_END, generation)


def test_a_recreated_run_gets_the_next_generation_and_supersedes_the_old_pipeline() -> None:
    assert choose_default_key(None, ORIGINAL, _key_of) == KeyChoice(_key_of(1))
    linked = RunLink(_key_of(1), 1, ORIGINAL)
    assert choose_default_key(linked, RunInstance(DAY_END, RESTARTED, 1), _key_of) == KeyChoice(
        _key_of(1)
    )
    again = RunInstance(DAY_END, RESTARTED, 0)
    second = choose_default_key(linked, again, _key_of)
    assert second == KeyChoice(_key_of(2), 2, replaces=_key_of(1))
    third = choose_default_key(RunLink(_key_of(2), 2, again), ORIGINAL, _key_of)
    assert third == KeyChoice(_key_of(3), 3, replaces=_key_of(2))
    # a run linked before the keys changed keeps the key it is linked to
    legacy = RunLink("daily.legacy-key", 1, None)
    assert choose_default_key(legacy, again, _key_of) == KeyChoice("daily.legacy-key")


def test_key_generations_are_distinct_valid_keys_and_generation_one_is_unchanged() -> None:
    run_id = "backfill__" + DAY_END
    first = default_pipeline_key("daily", run_id)
    assert first == default_pipeline_key("daily", run_id, 1)
    assert first.startswith("daily.backfill__2013-01-02T00-00-00-00-00.")
    keys = {default_pipeline_key("daily", run_id, g) for g in (1, 2, 3)}
    assert len(keys) == 3
    assert "-g2." in default_pipeline_key("daily", run_id, 2)
    long = default_pipeline_key("d" * 250, "r" * 250, 12)
    assert len(long) <= 200 and long.split(".")[-2].endswith("-g12")
    for key in (*keys, long):
        assert validate_pipeline_key(key) == key
    with pytest.raises(ValueError, match="starts at 1"):
        default_pipeline_key("daily", run_id, 0)


def test_the_store_moves_a_recreated_runs_link_and_retention_removes_what_it_replaced(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    run_id = "backfill__" + DAY_END
    old, new = Coordinator(engine, _key_of(1)), Coordinator(engine, _key_of(2))
    for coord in (old, new):
        coord.register(StageGraph.from_edges(["read_day"], []))
    old.link_dag_run("daily", run_id, KeyChoice(_key_of(1)), instance=ORIGINAL)
    cleared = RunInstance(DAY_END, RESTARTED, 1)
    old.link_dag_run("daily", run_id, KeyChoice(_key_of(1)), instance=cleared)
    assert dag_run_link(engine, "daily", run_id) == RunLink(_key_of(1), 1, cleared)

    again = RunInstance(DAY_END, "2026-11-28T12:00:00+00:00", 0)
    choice = KeyChoice(_key_of(2), 2, replaces=_key_of(1))
    for _task in ("read_day", "by_group"):  # every task of the new run, idempotent
        new.link_dag_run("daily", run_id, choice, instance=again)
    assert dag_run_link(engine, "daily", run_id) == RunLink(_key_of(2), 2, again)
    rows = {row.pipeline_key: row for row in pipeline_rows(engine)}
    assert rows[_key_of(1)].superseded_by == _key_of(2)
    assert rows[_key_of(1)].dag_runs == ()
    assert rows[_key_of(2)].superseded_by is None
    assert rows[_key_of(2)].dag_runs == (("daily", run_id),)
    engine.dispose()


def test_retention_removes_a_superseded_pipeline_unless_another_run_may_continue_it() -> None:
    def age(exists: tuple[bool | None, ...], superseded: bool) -> PipelineAge:
        return PipelineAge(
            "k", closed=False, last_change=0.0, dag_runs_exist=exists, superseded=superseded
        )

    assert expiry(age((), True), now=1.0, retention_days=7) is ExpiryReason.DAG_RUN_DELETED
    assert expiry(age((False,), True), now=1.0, retention_days=7) is ExpiryReason.DAG_RUN_DELETED
    assert expiry(age((True,), True), now=1.0, retention_days=7) is None
    assert expiry(age((None,), True), now=1.0, retention_days=7) is None  # not asked
    assert expiry(age((), False), now=1.0, retention_days=7) is None  # an open pipeline


class _DagRun:
    """The Task SDK's DagRun fields the key resolution reads."""

    def __init__(self, start: str, clear_number: int = 0, conf: dict[str, str] | None = None):
        self.run_after = dt.datetime.fromisoformat(DAY_END)
        self.start_date = dt.datetime.fromisoformat(start)
        self.clear_number = clear_number
        self.conf = conf or {}


def test_the_operator_resolves_a_recreated_runs_key_and_keeps_a_conf_key_as_named(
    tmp_path: Path,
) -> None:
    from airflow_finalckpt.core.pipeline_keys import KeyOrigin
    from airflow_finalckpt.operators.run_keys import ResolvedKey, resolve_key

    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    run_id = "backfill__" + DAY_END
    Coordinator(engine, _key_of(1)).register(StageGraph.from_edges(["read_day"], []))
    Coordinator(engine, _key_of(1)).link_dag_run("daily", run_id, instance=ORIGINAL)

    def resolve(dag_run: _DagRun, operator_key: str | None = None) -> ResolvedKey:
        context = {"dag_run": dag_run, "run_id": run_id}
        return resolve_key(context, "daily", operator_key, None, lambda: engine)

    same = resolve(_DagRun(STARTED))
    assert (same.pipeline_key, same.origin) == (_key_of(1), KeyOrigin.DEFAULT)
    recreated = resolve(_DagRun(RESTARTED))
    assert recreated.choice == KeyChoice(_key_of(2), 2, replaces=_key_of(1))
    # a continuation on purpose: the conf's key as named, whatever the run's record says
    named = resolve(_DagRun(RESTARTED, conf={"pipeline_key": _key_of(1)}))
    assert (named.pipeline_key, named.origin, named.choice) == (
        _key_of(1),
        KeyOrigin.CONF,
        None,
    )
    # ... re-created with another conf than the deleted run's: its link moves to that key
    other = resolve(_DagRun(RESTARTED, conf={"pipeline_key": "other"}))
    assert other.choice == KeyChoice("other", 1, replaces=_key_of(1))
    assert resolve(_DagRun(STARTED, conf={"pipeline_key": "other"})).choice is None
    Coordinator(engine, "other").register(StageGraph.from_edges(["read_day"], []))
    again = RunInstance.of(run_after=DAY_END, start_date=RESTARTED, clear_number=0)
    Coordinator(engine, "other").link_dag_run("daily", run_id, other.choice, instance=again)
    assert dag_run_link(engine, "daily", run_id) == RunLink("other", 1, again)
    by_operator = resolve(_DagRun(RESTARTED), operator_key="fixed")
    assert (by_operator.pipeline_key, by_operator.origin) == ("fixed", KeyOrigin.OPERATOR)
    engine.dispose()
