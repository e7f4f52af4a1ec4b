"""``finalckpt`` command line: the top-level group and the ``db`` commands.

Other command groups live in their own modules and are registered with ``main.add_command``.
Errors a user can cause (bad configuration, unreachable database, schema written by a newer
package) end in one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, NoSuchModuleError, OperationalError

from airflow_finalckpt.config import mask_url, resolve_setting
from airflow_finalckpt.core.errors import ConfigurationError

EXIT_FAILURE = 1
EXIT_BEHIND = 1
EXIT_ERROR = 2
PG_CONNECT_TIMEOUT_S = 10

store_url_option = click.option(
    "--store-url",
    metavar="URL",
    default=None,
    help="Coordination database URL (default: resolved from AIRFLOW__FINALCKPT__STORE_URL, "
    "the finalckpt_default connection, airflow.cfg [finalckpt], then AIRFLOW_HOME).",
)


@click.group()
@click.version_option(package_name="airflow-finalckpt")
def main() -> None:
    """airflow-finalckpt: FLIP-147 final checkpoints for PySpark pipelines on Airflow."""


@main.group()
def db() -> None:
    """Manage the schema of the coordination database."""


def _fail(message: str, exit_code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(exit_code)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__


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
        _fail(f"{problem} {where}: {_first_line(exc.orig or exc)}", exit_code)
    except (ModuleNotFoundError, NoSuchModuleError) as exc:
        _fail(
            f"database driver missing ({_first_line(exc)}); for PostgreSQL install "
            "'airflow-finalckpt[postgres]'",
            exit_code,
        )


def _resolve_store_url(store_url: str | None) -> tuple[str, str]:
    url, source = resolve_setting("store_url", {"store_url": store_url})
    return str(url), source


def _engine(url: str) -> Engine:
    """An engine that gives up on an unreachable PostgreSQL instead of hanging."""
    from airflow_finalckpt.store.engine import make_engine

    if url.startswith("postgresql") and "connect_timeout" not in url:
        return make_engine(url, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
    return make_engine(url)


@db.command("url")
@store_url_option
def db_url(store_url: str | None) -> None:
    """Print the resolved store URL (password masked) and where it came from."""
    with _user_errors(None, EXIT_FAILURE):
        url, source = _resolve_store_url(store_url)
    click.echo(mask_url(url))
    click.echo(f"source: {source}")


@db.command("upgrade")
@store_url_option
def db_upgrade(store_url: str | None) -> None:
    """Create or upgrade the schema to this package's head revision (safe to run concurrently)."""
    from airflow_finalckpt.store.migrate import ensure_schema, head_revision

    with _user_errors(None, EXIT_FAILURE):
        url, _source = _resolve_store_url(store_url)
    with _user_errors(url, EXIT_FAILURE):
        engine = _engine(url)
        try:
            upgraded = ensure_schema(engine)
        finally:
            engine.dispose()
    verb = "upgraded to" if upgraded else "already at"
    click.echo(f"{mask_url(url)}: schema {verb} revision {head_revision()}")


@db.command("check")
@store_url_option
def db_check(store_url: str | None) -> None:
    """Compare the schema revision with this package's head.

    Exit 0 when up to date, 1 when behind (run `finalckpt db upgrade`), 2 when the database is
    unreachable or at a revision this package does not know.
    """
    from airflow_finalckpt.store.migrate import (
        current_revision,
        head_revision,
        sqlite_database_path,
    )

    with _user_errors(None, EXIT_ERROR):
        url, source = _resolve_store_url(store_url)
    click.echo(f"store: {mask_url(url)} (from {source})")
    with _user_errors(url, EXIT_ERROR):
        sqlite_path = sqlite_database_path(url)
        if sqlite_path and not os.path.exists(sqlite_path):
            current, note = None, f" (database file {sqlite_path} does not exist)"
        else:
            engine = _engine(url)
            try:
                current, note = current_revision(engine), ""
            finally:
                engine.dispose()
    head = head_revision()
    click.echo(f"current revision: {current or 'none'}{note}")
    click.echo(f"head revision: {head}")
    if current != head:
        _fail("schema is behind this package; run `finalckpt db upgrade`", EXIT_BEHIND)
    click.echo("schema is up to date")


def _register_command_groups() -> None:
    # Imported here: the groups import helpers from this module.
    from airflow_finalckpt.cli.checkpoints import checkpoints

    main.add_command(checkpoints)


_register_command_groups()
