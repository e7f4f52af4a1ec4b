"""The Pipelines list's rules (control/listing.py): search words, state filter with counts,
sort orders, paging windows and the readable-DAG filter, over plain index rows."""

from __future__ import annotations

import pytest

from airflow_finalckpt.control.listing import ListQuery, SortKey, select_page
from airflow_finalckpt.control.states import PipelineRunState, duration, ended_at
from airflow_finalckpt.core.model import StageLifecycle, StopMode, StopState
from airflow_finalckpt.core.views import StopRequest
from airflow_finalckpt.store.listing import PipelineIndexRow

L = StageLifecycle
NOW = 10_000.0


def row(
    key: str, dag: str, *lifecycles: StageLifecycle, started: float = 0.0, **kw: object
) -> PipelineIndexRow:
    return PipelineIndexRow(
        pipeline_key=key,
        dag_runs=[(dag, f"run_{key}")],
        linked_at=started,
        started_at=started,
        last_stage_change=kw.get("changed", started + 10.0),  # type: ignore[arg-type]
        lifecycles=list(lifecycles),
        stop=kw.get("stop"),  # type: ignore[arg-type]
    )


def stop(mode: StopMode, state: StopState, finished_at: float | None = None) -> StopRequest:
    return StopRequest(1, mode, state, 3, "u", 50.0, finished_at, None)


ROWS = [
    row("flights.a", "flights", L.RUNNING, started=100.0),
    row("flights.b", "flights", L.CLOSED, started=200.0, changed=900.0),
    row("hotels.c", "hotels", L.NOT_STARTED, started=300.0),
    row("hotels.d", "hotels", L.CLOSED, started=400.0, changed=450.0),
    row("secret.e", "secret", L.RUNNING, started=500.0),
    PipelineIndexRow("orphan.f", dag_runs=[], lifecycles=[L.RUNNING]),
]


def keys(query: ListQuery, may_read: object = None) -> list[str]:
    allowed = may_read or (lambda dag: dag != "secret")
    return select_page(ROWS, query, allowed, NOW).keys  # type: ignore[arg-type]


def test_default_is_newest_first_without_unreadable_or_orphan_runs() -> None:
    page = select_page(ROWS, ListQuery(), lambda dag: dag != "secret", NOW)
    assert page.keys == ["hotels.d", "hotels.c", "flights.b", "flights.a"]
    assert page.total == 4
    assert page.counts["running"] == 1 and page.counts["finished"] == 2
    assert page.counts["not_started"] == 1 and sum(page.counts.values()) == 4


def test_search_words_each_match_key_dag_or_run() -> None:
    assert keys(ListQuery(search="hotels")) == ["hotels.d", "hotels.c"]
    assert keys(ListQuery(search="HOTELS run_hotels.c")) == ["hotels.c"]
    assert keys(ListQuery(search="flights nothing")) == []
    assert keys(ListQuery(search="secret")) == []  # unreadable stays hidden when searched


def test_state_filter_and_counts_before_it() -> None:
    query = ListQuery(states=frozenset({PipelineRunState.FINISHED}))
    page = select_page(ROWS, query, lambda dag: dag != "secret", NOW)
    assert page.keys == ["hotels.d", "flights.b"] and page.total == 2
    assert page.counts["running"] == 1  # the counts are of the search, not of the filter


@pytest.mark.parametrize(
    ("sort", "descending", "expected"),
    [
        (SortKey.STARTED, False, ["flights.a", "flights.b", "hotels.c", "hotels.d"]),
        (SortKey.KEY, False, ["flights.a", "flights.b", "hotels.c", "hotels.d"]),
        # running ones count to now: a 9900 s, c has not started work but was registered: 9700
        (SortKey.DURATION, True, ["flights.a", "hotels.c", "flights.b", "hotels.d"]),
        (SortKey.STATE, False, ["flights.b", "hotels.d", "hotels.c", "flights.a"]),
    ],
)
def test_sort_orders(sort: SortKey, descending: bool, expected: list[str]) -> None:
    assert keys(ListQuery(sort=sort, descending=descending)) == expected


def test_pages_are_windows_of_one_order() -> None:
    many = [row(f"k{i:03d}", "d", L.RUNNING, started=float(i % 7)) for i in range(250)]
    seen: list[str] = []
    for offset in range(0, 250, 50):
        page = select_page(many, ListQuery(limit=50, offset=offset), lambda _: True, NOW)
        assert page.total == 250 and len(page.keys) == 50
        seen += page.keys
    assert sorted(seen) == sorted(r.pipeline_key for r in many)  # no run twice, none lost
    last = select_page(many, ListQuery(limit=50, offset=240), lambda _: True, NOW)
    assert len(last.keys) == 10


def test_end_and_duration_of_a_run() -> None:
    assert ended_at(PipelineRunState.FINISHED, 900.0, None) == 900.0
    assert ended_at(PipelineRunState.DRAINED, 900.0, None) == 900.0
    assert ended_at(PipelineRunState.RUNNING, 900.0, None) is None
    savepoint = stop(StopMode.SAVEPOINT, StopState.COMPLETED, finished_at=77.0)
    assert ended_at(PipelineRunState.SUSPENDED, 900.0, savepoint) == 77.0
    assert duration(100.0, None, NOW) == NOW - 100.0
    assert duration(100.0, 160.0, NOW) == 60.0
    assert duration(None, 160.0, NOW) is None
