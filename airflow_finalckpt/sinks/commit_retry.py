"""Optimistic table commits (Iceberg catalogs, the Delta log) that lose a race retry, bounded.

Concurrent DAG runs (a backfill with ``max_active_runs=3``) commit their slices into one table
at the same time. The table formats accept one commit per table version: the loser gets the
library's commit-failed error (pyiceberg ``CommitFailedException``, deltalake
``CommitFailedError``). A sink's attempt turns that into ``CommitConflict``; ``commit_retrying``
then runs the attempt again after a jittered exponential wait, at most ``COMMIT_ATTEMPTS``
times. Each attempt reloads the table and looks for its transaction ids in the history first, so
a commit that did land (the race's winner was ourselves, a replay) is never made twice, and it
rebuilds the commit on the new version (a slice replace re-reads the slice's files), so the
replace stays atomic. After the last attempt the stage fails with a one-line ``SinkError``;
nothing was committed and Airflow's retry commits it.

The libraries' own retries are off (pyiceberg ``commit.retry.num-retries=0``, deltalake
``max_commit_retries=0``): they would re-apply the same files on top of the winner without
re-checking the history, and append a transaction the winner already committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from airflow_finalckpt.sinks.base import SinkError

log = logging.getLogger(__name__)

#: Attempts of one table commit lost to other writers (each other writer wins at most once per
#: slice commit, so a few concurrent runs need far fewer).
COMMIT_ATTEMPTS = 8
#: Waits between attempts: random, up to 0.05 s doubling per attempt, at most 2 s.
COMMIT_WAIT_MULTIPLIER_S = 0.05
COMMIT_WAIT_MAX_S = 2.0


class CommitConflict(Exception):
    """A table commit lost an optimistic-concurrency race: reload, re-check, retry."""


def commit_retrying(sink_id: str, txn_id: str, table: str, attempt: Callable[[], bool]) -> bool:
    """Run one commit ``attempt`` until it does not raise ``CommitConflict`` (bounded)."""

    def note(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "sink %r: commit of %r to %s lost to a concurrent writer (attempt %d of %d: %s); "
            "reloading the table and retrying",
            sink_id,
            txn_id,
            table,
            state.attempt_number,
            COMMIT_ATTEMPTS,
            error,
        )

    retrying = Retrying(
        retry=retry_if_exception_type(CommitConflict),
        stop=stop_after_attempt(COMMIT_ATTEMPTS),
        wait=wait_random_exponential(multiplier=COMMIT_WAIT_MULTIPLIER_S, max=COMMIT_WAIT_MAX_S),
        before_sleep=note,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except CommitConflict as exc:
        raise SinkError(
            f"sink {sink_id!r}: gave up committing {txn_id!r} to {table} after "
            f"{COMMIT_ATTEMPTS} conflicting concurrent commits; nothing was committed, retry"
        ) from exc
