"""Opening the coordination store at start: bounded retries with exponential back-off.

A task (or the triggerer) that starts while the coordination database is down, restarting or
not reachable yet (a pod that starts before its database, a fail-over) should neither hang nor
fail at once: ``open_store`` connects and checks that the schema is at head (a SQLite store
brings itself there; a PostgreSQL one must have been upgraded by ``finalckpt db upgrade``, see
``migrate.require_schema``), retrying connection failures with exponential back-off, and after
the last attempt raises ``StoreUnreachableError`` naming the store (password masked), the number
of attempts and the last error.

Only connection-level failures are retried (``OperationalError``, ``InterfaceError``, a connection
invalidated under us). A schema written by a newer package, one this process may not upgrade
(``SchemaBehindError``), a wrong driver or a malformed URL fail at once. Nothing is created
before the database answers: the schema upgrade is one transaction (see ``migrate``), so an
attempt that fails half-way leaves no partial schema.

The retry loop is tenacity's (a dependency of this package, and of Airflow): exponential waits
(``wait_exponential``), a bounded number of attempts (``stop_after_attempt``), only connection
errors retried (``retry_if_exception``), a warning before each wait. No Airflow: the Spark driver
and the CLI open the store without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.store.engine import first_line, make_engine
from airflow_finalckpt.store.migrate import require_schema

log = logging.getLogger(__name__)

#: Defaults of ``[finalckpt] store_connect_retries`` / ``store_connect_backoff_s``: 6 attempts,
#: waiting 1, 2, 4, 8, 16 s in between (31 s in all).
DEFAULT_CONNECT_RETRIES = 5
DEFAULT_CONNECT_BACKOFF_S = 1.0
#: No single wait is longer than this.
MAX_BACKOFF_S = 30.0

#: ``on_retry(attempt, error, delay_s)``: called after failed attempt ``attempt`` (1-based),
#: before waiting ``delay_s`` for the next one.
RetryCallback = Callable[[int, BaseException, float], None]


class StoreUnreachableError(ConfigurationError):
    """The coordination database did not answer within the configured attempts."""

    def __init__(self, message: str, *, url: str, attempts: int) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the database could not be reached (worth retrying)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def backoff_delays(
    retries: int, backoff_s: float, max_backoff_s: float = MAX_BACKOFF_S
) -> list[float]:
    """The waits between attempts: ``backoff_s`` doubling, each at most ``max_backoff_s``
    (what ``_wait`` answers after each failed attempt; for docs and tests).
    """
    return [min(backoff_s * 2**n, max_backoff_s) for n in range(retries)]


def _wait(backoff_s: float, max_backoff_s: float) -> wait_exponential:
    """Tenacity's wait after failed attempt n: ``backoff_s * 2**(n-1)``, at most the cap."""
    return wait_exponential(multiplier=backoff_s, exp_base=2, min=0, max=max_backoff_s)


def _connect_once(url: str) -> Engine:
    """One attempt: an engine with the schema at head; disposed of if the attempt fails."""
    engine = make_engine(url)
    try:
        require_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def open_store(
    url: str,
    *,
    retries: int = DEFAULT_CONNECT_RETRIES,
    backoff_s: float = DEFAULT_CONNECT_BACKOFF_S,
    max_backoff_s: float = MAX_BACKOFF_S,
    on_retry: RetryCallback | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Engine:
    """An engine of the coordination store with its schema at head, once the database answers.

    The schema is upgraded here only where ``migrate.require_schema`` allows it (SQLite unless
    ``[finalckpt] auto_migrate`` says otherwise); a PostgreSQL store at an older revision raises
    SchemaBehindError, naming ``finalckpt db upgrade``, at the first attempt.

    Tries ``retries + 1`` times, waiting ``backoff_s`` seconds after the first failure and twice
    as long after each next one (at most ``max_backoff_s``). Raises StoreUnreachableError after
    the last failed attempt; any other error (ConfigurationError for a newer schema, a missing
    driver) at once. The engine of a failed attempt is disposed of: nothing is left open.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if backoff_s < 0:
        raise ValueError(f"backoff_s must be >= 0, got {backoff_s}")
    masked = mask_url(url)
    attempts = retries + 1

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        assert error is not None  # only failed attempts are retried
        delay = state.upcoming_sleep
        log.warning(
            "coordination store %s is unreachable (attempt %d of %d): %s; retrying in %.1f s",
            masked,
            state.attempt_number,
            attempts,
            first_line(error),
            delay,
        )
        if on_retry is not None:
            on_retry(state.attempt_number, error, delay)

    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=_wait(backoff_s, max_backoff_s),
        retry=retry_if_exception(is_connection_error),
        before_sleep=before_sleep,
        sleep=sleep,
    )
    start = time.monotonic()
    try:
        engine = retrying(_connect_once, url)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        assert last is not None
        elapsed = time.monotonic() - start
        raise _unreachable(masked, attempts, retries, backoff_s, elapsed, last) from last
    attempt = int(retrying.statistics.get("attempt_number", 1))
    if attempt > 1:
        log.info("coordination store %s answered at attempt %d", masked, attempt)
    return engine


def _unreachable(
    masked: str,
    attempts: int,
    retries: int,
    backoff_s: float,
    elapsed: float,
    last: BaseException,
) -> StoreUnreachableError:
    """The one-line error after the last failed attempt (raised from the last error)."""
    return StoreUnreachableError(
        f"cannot reach the coordination store {masked}: {attempts} "
        f"attempt{'s' if attempts != 1 else ''} failed in {elapsed:.1f} s "
        f"(store_connect_retries={retries}, store_connect_backoff_s={backoff_s:g}); last "
        f"error: {first_line(last)}. Nothing was created; check that the database runs and "
        "that the finalckpt store_url (or the finalckpt_default connection) points to it",
        url=masked,
        attempts=attempts,
    )
