"""``finalckpt`` command line: the top-level group and the ``db`` commands.

Other command groups live in their own modules and are registered with ``main.add_command``.
Errors a user can cause (bad configuration, unreachable database, schema written by a newer
package) end in one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import json
import os

import click

from airflow_finalckpt.cli._shared import (
    EXIT_BEHIND,
    EXIT_ERROR,
    EXIT_FAILURE,
    _engine,
    _fail,
    _resolve_store_url,
    _user_errors,
    json_option,
    logs_to_stderr,
    store_url_option,
)
from airflow_finalckpt.cli.checkpoints import checkpoints
from airflow_finalckpt.cli.progress import progress
from airflow_finalckpt.cli.retention import gc, pipelines
from airflow_finalckpt.cli.sources import sources
from airflow_finalckpt.cli.stop import reset, restore, resume, status, stop
from airflow_finalckpt.config import mask_url


@click.group()
@click.version_option(package_name="airflow-finalckpt")
def main() -> None:
    """airflow-finalckpt: FLIP-147 final checkpoints for PySpark pipelines on Airflow."""
    logs_to_stderr()


@main.group()
def db() -> None:
    """Manage the schema of the coordination database."""


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
@json_option
def db_upgrade(store_url: str | None, as_json: bool) -> None:
    """Create or upgrade the schema to this package's head revision (safe to run concurrently).

    The one way a PostgreSQL store is migrated (the Helm chart's pre-install/pre-upgrade Job
    runs it): Airflow components and Spark drivers only check the revision. Exit 0 when the
    schema is at head afterwards, 1 on any error (unreachable, newer schema, bad URL).
    """
    from airflow_finalckpt.store.migrate import head_revision, upgrade_to_head

    with _user_errors(None, EXIT_FAILURE):
        url, source = _resolve_store_url(store_url)
    with _user_errors(url, EXIT_FAILURE):
        engine = _engine(url)
        try:
            before, upgraded = upgrade_to_head(engine)
        finally:
            engine.dispose()
    head = head_revision()
    if as_json:
        doc = {
            "store": mask_url(url),
            "source": source,
            "from_revision": before,
            "revision": head,
            "upgraded": upgraded,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    if upgraded:
        click.echo(f"{mask_url(url)}: schema upgraded to revision {head} (from {before or 'none'})")
    else:
        click.echo(f"{mask_url(url)}: schema already at revision {head}")


@db.command("check")
@store_url_option
@json_option
def db_check(store_url: str | None, as_json: bool) -> None:
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
    if not as_json:
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
    if as_json:
        doc = {
            "store": mask_url(url),
            "source": source,
            "current_revision": current,
            "head_revision": head,
            "up_to_date": current == head,
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"current revision: {current or 'none'}{note}")
        click.echo(f"head revision: {head}")
    if current != head:
        _fail("schema is behind this package; run `finalckpt db upgrade`", EXIT_BEHIND)
    if not as_json:
        click.echo("schema is up to date")


main.add_command(checkpoints)
main.add_command(progress)
main.add_command(gc)
main.add_command(pipelines)
main.add_command(stop)
main.add_command(resume)
main.add_command(restore)
main.add_command(status)
main.add_command(reset)
main.add_command(sources)
