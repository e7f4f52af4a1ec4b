"""Helpers shared by the ``finalckpt`` command groups: options and one-line user errors."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click
from rich.console import Console
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, NoSuchModuleError, OperationalError

from airflow_finalckpt.config import mask_url, resolve_setting
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.store.engine import first_line

EXIT_FAILURE = 1
EXIT_BEHIND = 1
EXIT_ERROR = 2

store_url_option = click.option(
    "--store-url",
    metavar="URL",
    default=None,
    help="Coordination database URL (default: resolved from AIRFLOW__FINALCKPT__STORE_URL, "
    "the finalckpt_default connection, airflow.cfg [finalckpt], then AIRFLOW_HOME).",
)


#: ``--json``: one JSON document on stdout, every log line on stderr.
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (logs: stderr)."
)


def _console() -> Console:
    """Wide when piped: rich would otherwise cut columns to 80 characters."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _fail(message: str, exit_code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(exit_code)


@contextmanager
def _user_errors(url: str | None, exit_code: int) -> Iterator[None]:
    """Turn the errors a user can cause into one line on stderr and ``exit_code``."""
    try:
        yield
    except ConfigurationError as exc:
        _fail(str(exc), exit_code)
    except DBAPIError as exc:
        where = f"coordination database {mask_url(url)}" if url else "coordination database"
        problem = "cannot reach" if isinstance(exc, OperationalError) else "error in"
        _fail(f"{problem} {where}: {first_line(exc)}", exit_code)
    except (ModuleNotFoundError, NoSuchModuleError) as exc:
        _fail(
            f"database driver missing ({first_line(exc)}); for PostgreSQL install "
            "'airflow-finalckpt[postgres]'",
            exit_code,
        )


def logs_to_stderr() -> None:
    """Send every log line to stderr: stdout is the commands' output (``--json`` must parse).

    Importing Airflow configures logging with a console handler on stdout and may already log
    while it loads its config (the secrets masker's "Skipping masking for a secret as it's too
    short" for a short sensitive option such as ``[finalckpt] api_password``), so Airflow is
    imported first with stdout pointed at stderr (if installed; every command reads its
    configuration anyway), then each stdout handler of the root logger and Airflow's structlog
    logger factory are pointed at stderr.
    """
    # the process's own stderr: a test runner's temporary sys.stderr would be gone afterwards
    stderr = sys.__stderr__ or sys.stderr
    # no Airflow here, or a broken airflow.cfg: the command itself reports that
    with contextlib.suppress(Exception), contextlib.redirect_stdout(stderr):
        import airflow.configuration  # noqa: F401  (configures Airflow's logging)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stdout,
            sys.__stdout__,
        ):
            handler.setStream(stderr)
    with contextlib.suppress(Exception):
        import structlog

        factory = structlog.get_config().get("logger_factory")
        if factory is not None and getattr(factory, "io", stderr) in (
            None,
            sys.stdout,
            sys.__stdout__,
        ):
            factory.io = stderr


def _resolve_store_url(store_url: str | None) -> tuple[str, str]:
    url, source = resolve_setting("store_url", {"store_url": store_url})
    return str(url), source


def _engine(url: str) -> Engine:
    """An engine that gives up on an unreachable PostgreSQL instead of hanging."""
    from airflow_finalckpt.store.engine import make_engine

    return make_engine(url)
