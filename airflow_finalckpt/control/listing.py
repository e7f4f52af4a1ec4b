"""The Pipelines list: search, state filter, sort and paging over the store's pipeline index,
as pure rules over plain values (``select_page``), and ``list_runs`` which summarizes only the
page shown (a list of thousands of pipelines costs four statements plus one summary per row).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from airflow_finalckpt.control.service import PipelineControl, PipelineRunSummary
from airflow_finalckpt.control.states import PipelineRunState, duration, ended_at, run_state
from airflow_finalckpt.store.listing import PipelineIndexRow, pipeline_index


class SortKey(StrEnum):
    """What the list is ordered by."""

    STARTED = "started"  # when the pipeline run was registered (its first stage started)
    LINKED = "linked"  # its newest DAG run (the list's default: newest first)
    DURATION = "duration"
    STATE = "state"
    KEY = "key"


@dataclass(frozen=True)
class ListQuery:
    """One page of the list: a search text, states, an order and a window."""

    search: str = ""
    states: frozenset[PipelineRunState] = frozenset()
    sort: SortKey = SortKey.LINKED
    descending: bool = True
    limit: int = 50
    offset: int = 0


def index_state(row: PipelineIndexRow) -> PipelineRunState:
    """The run state of an index row: the same rule as the run's summary."""
    return run_state(row.lifecycles, row.stop)


def _matches(row: PipelineIndexRow, words: Sequence[str]) -> bool:
    """Every word occurs in the key, a DAG id or a run id (case-insensitive)."""
    texts = [row.pipeline_key.lower()] + [f"{d} {r}".lower() for d, r in row.dag_runs]
    return all(any(w in text for text in texts) for w in words)


@dataclass(frozen=True)
class Page:
    """The keys of one page, how many matched, and the matching runs per state."""

    keys: list[str]
    total: int
    counts: dict[str, int]


def select_page(
    rows: Iterable[PipelineIndexRow],
    query: ListQuery,
    may_read: Callable[[str], bool],
    now: float,
) -> Page:
    """Filter (readable DAGs, search words, states), count per state, sort, slice."""
    words = [w for w in query.search.lower().split() if w]
    visible = [
        r
        for r in rows
        if r.dag_runs and all(may_read(d) for d, _ in r.dag_runs) and _matches(r, words)
    ]
    states = {r.pipeline_key: index_state(r) for r in visible}
    counts: dict[str, int] = {s.value: 0 for s in PipelineRunState}
    for state in states.values():
        counts[state.value] += 1
    if query.states:
        visible = [r for r in visible if states[r.pipeline_key] in query.states]

    def sort_value(row: PipelineIndexRow) -> tuple[object, ...]:
        key = query.sort
        if key is SortKey.STARTED:
            return (row.started_at or 0.0,)
        if key is SortKey.DURATION:
            state = states[row.pipeline_key]
            ended = ended_at(state, row.last_stage_change, row.stop)
            return (duration(row.started_at, ended, now) or 0.0,)
        if key is SortKey.STATE:
            return (states[row.pipeline_key].value,)
        if key is SortKey.KEY:
            return (row.pipeline_key,)
        return (row.linked_at,)

    # the key breaks ties, always in the same direction, so a page never shuffles on refresh
    visible.sort(key=lambda r: r.pipeline_key)
    visible.sort(key=sort_value, reverse=query.descending)
    window = visible[query.offset : query.offset + query.limit]
    return Page(keys=[r.pipeline_key for r in window], total=len(visible), counts=counts)


class PipelineRunPage(BaseModel):
    """One page of the pipeline runs the user may read."""

    runs: list[PipelineRunSummary]
    #: runs matching the search and state filter (the page is a window of them)
    total_entries: int
    #: runs matching the search, per state (before the state filter): the filter's counts
    state_counts: dict[str, int]
    limit: int
    offset: int


def list_runs(
    control: PipelineControl,
    query: ListQuery,
    may_read: Callable[[str], bool],
    dag_id: str | None = None,
) -> PipelineRunPage:
    """The page of runs ``query`` asks for, each fully summarized."""
    page = select_page(pipeline_index(control.engine, dag_id), query, may_read, control.clock())
    return PipelineRunPage(
        runs=[control.summary(key) for key in page.keys],
        total_entries=page.total,
        state_counts=page.counts,
        limit=query.limit,
        offset=query.offset,
    )


__all__ = [
    "ListQuery",
    "Page",
    "PipelineRunPage",
    "SortKey",
    "list_runs",
    "select_page",
]
