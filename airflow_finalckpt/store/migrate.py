"""Schema migrations of the coordination store, driven programmatically through Alembic.

Alembic is configured in code (no alembic.ini) with ``script_location`` pointing at the package's
``migrations`` directory, so this works from an installed wheel. The version table is
``finalckpt_alembic_version``: the store can live in Airflow's own database without touching
Airflow's ``alembic_version``.

Concurrency: every migration runs inside one transaction that this module opens, and Alembic
runs inside it (it sees an external transaction and does not begin/commit on its own):

* SQLite: the engine from ``make_engine`` emits ``BEGIN IMMEDIATE`` when the transaction begins,
  so the first process takes the write lock, the others wait (busy timeout) and then find the
  schema at head. SQLite DDL is transactional, so a failed upgrade leaves nothing behind. For a
  plain SQLite engine (not from ``make_engine``) we issue ``BEGIN IMMEDIATE`` ourselves.
* PostgreSQL: ``pg_advisory_xact_lock`` at the start of the transaction serializes upgraders; it
  is released by the commit. PostgreSQL DDL is transactional too.

Logging: Alembic says "Context impl PostgresqlImpl" / "Will assume transactional DDL" at INFO on
every connection it inspects. Under Airflow (whose logging sends INFO to stdout) that chatter
ended up before the JSON of ``finalckpt ... --json``, and in every task log. While *our*
migrations run, Alembic records below WARNING are dropped (a context-local filter: Airflow's own
``airflow db migrate`` in the same process keeps its lines); this module logs one line per
upgrade instead.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, Table, text
from sqlalchemy.engine import URL, make_url

from airflow_finalckpt.core.errors import ConfigurationError

VERSION_TABLE = "finalckpt_alembic_version"
TABLE_PREFIX = "finalckpt_"
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
#: Key of the PostgreSQL advisory lock held while migrating ("finalckp" in ASCII, fits a bigint).
ADVISORY_LOCK_KEY = int.from_bytes(b"finalckp", "big")
DISTRIBUTION = "airflow-finalckpt"
#: Alembic loggers whose INFO lines are dropped while this module migrates or inspects.
ALEMBIC_LOGGERS = ("alembic.runtime.migration", "alembic.runtime.plugins")

log = logging.getLogger(__name__)
_QUIET = contextvars.ContextVar("finalckpt_quiet_alembic", default=False)


class _QuietAlembicFilter(logging.Filter):
    """Drops Alembic's INFO/DEBUG records, but only inside this module's own migrations."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _QUIET.get()


_FILTER = _QuietAlembicFilter()
for _name in ALEMBIC_LOGGERS:
    if _FILTER not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_FILTER)


@contextmanager
def quiet_alembic() -> Iterator[None]:
    """Silence Alembic's per-connection INFO chatter for the duration (this context only)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def package_version() -> str:
    """The installed distribution's version, for error messages."""
    try:
        return importlib_metadata.version(DISTRIBUTION)
    except importlib_metadata.PackageNotFoundError:
        return "(not installed)"


def include_store_object(name: str | None, type_: str, _parent_names: Any) -> bool:
    """Alembic ``include_name`` hook: only our tables, so autogenerate ignores foreign ones."""
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config built in code, bound to ``connection`` for env.py."""
    config = Config()
    # ConfigParser interpolates '%': escape it in case the install path contains one.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this package ships."""
    head = _script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships at least one revision
        raise ConfigurationError("airflow-finalckpt ships no schema migrations (broken install?)")
    return head


def known_revisions() -> frozenset[str]:
    """Every revision this package ships."""
    return frozenset(script.revision for script in _script_directory().walk_revisions())


def _current_heads(connection: Connection) -> tuple[str, ...]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return tuple(context.get_current_heads())


def _current_revision(connection: Connection) -> str | None:
    heads = _current_heads(connection)
    _require_known(heads)
    if len(heads) > 1:
        raise ConfigurationError(
            f"coordination database has several schema heads {sorted(heads)} in "
            f"{VERSION_TABLE}; it was migrated by something else than airflow-finalckpt"
        )
    return heads[0] if heads else None


def _require_known(heads: tuple[str, ...]) -> None:
    unknown = [head for head in heads if head not in known_revisions()]
    if unknown:
        raise ConfigurationError(
            f"coordination database is at schema revision {', '.join(unknown)}, unknown to "
            f"airflow-finalckpt {package_version()}; upgrade the package"
        )


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision, None if it has none (empty database).

    Raises ConfigurationError if the revision is unknown to this package.
    """
    with quiet_alembic(), engine.connect() as connection:
        return _current_revision(connection)


def sqlite_database_path(url: str | URL) -> str | None:
    """The file behind a SQLite URL, None for other databases and in-memory SQLite."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername.partition("+")[0] != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return database


def _create_sqlite_directory(engine: Engine) -> None:
    """SQLite creates the file but not its directory (the default lives in AIRFLOW_HOME)."""
    path = sqlite_database_path(engine.url)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


@contextmanager
def migration_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction that excludes every other migrating process until it ends."""
    with quiet_alembic(), engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY}
            )
        elif connection.dialect.name == "sqlite":
            _ensure_sqlite_write_lock(connection)
        yield connection


def _ensure_sqlite_write_lock(connection: Connection) -> None:
    # make_engine's "begin" hook already ran BEGIN IMMEDIATE; a plain engine has not begun yet
    # (pysqlite begins lazily, and never before DDL), so take the write lock explicitly.
    dbapi_connection: Any = connection.connection.dbapi_connection
    if not dbapi_connection.in_transaction:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``."""
    _create_sqlite_directory(engine)
    with migration_transaction(engine) as connection:
        before = _current_revision(connection)
        command.upgrade(alembic_config(connection), revision)
    log.info("coordination store schema upgraded from %s to %s", before or "empty", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision``.

    "base" drops every finalckpt_ table, the version table included (Alembic would keep it
    empty), so nothing of the store is left in a database shared with Airflow.
    """
    with migration_transaction(engine) as connection:
        _current_revision(connection)
        command.downgrade(alembic_config(connection), revision)
        if revision == "base":
            Table(VERSION_TABLE, MetaData()).drop(connection, checkfirst=True)


def ensure_schema(engine: Engine) -> bool:
    """Bring the schema to head if it is behind; True if this call upgraded it.

    Safe to call from many processes at once. Raises ConfigurationError if the database was
    migrated by a newer airflow-finalckpt. Only ``finalckpt db upgrade`` and stores that
    migrate themselves (``require_schema``: SQLite by default) call it.
    """
    return upgrade_to_head(engine)[1]


def upgrade_to_head(engine: Engine) -> tuple[str | None, bool]:
    """``ensure_schema`` that also says which revision the store was at before (None: empty)."""
    _create_sqlite_directory(engine)
    with migration_transaction(engine) as connection:
        before = _current_revision(connection)
        if before == head_revision():
            return before, False
        command.upgrade(alembic_config(connection), "head")
    log.info("coordination store schema upgraded from %s to %s", before or "empty", head_revision())
    return before, True


# --------------------------------------------------------------------------- who migrates
# A PostgreSQL store is shared by every Airflow component and Spark driver of a deployment: its
# schema is the platform's to change (`finalckpt db upgrade`, the Helm chart's pre-install /
# pre-upgrade Job), so that no process needs DDL rights and a rolling upgrade never migrates
# from whichever pod starts first. The embedded SQLite default belongs to one machine and still
# creates and upgrades itself, so `airflow standalone` + the README's command need nothing.

AUTO_MIGRATE_OPTION = "auto_migrate"
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class SchemaBehindError(ConfigurationError):
    """The store's schema is older than this package's and this process may not migrate it."""

    def __init__(self, message: str, *, current: str | None, required: str) -> None:
        super().__init__(message)
        self.current = current
        self.required = required


def auto_migrate_default(engine: Engine) -> bool:
    """Whether a store migrates itself when nothing is configured: SQLite yes, others no."""
    return engine.dialect.name == "sqlite"


def parse_auto_migrate(raw: str, where: str) -> bool:
    """``[finalckpt] auto_migrate`` as a boolean; a one-line error naming the option otherwise."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(
        f"invalid finalckpt setting {AUTO_MIGRATE_OPTION} from {where}: {raw!r} is not a "
        "boolean; use true or false (unset: true for SQLite stores, false for PostgreSQL)"
    )


def configured_auto_migrate() -> bool | None:
    """``[finalckpt] auto_migrate`` (env, then Airflow's config), None when unset."""
    from airflow_finalckpt import config

    env = config.env_var_name(AUTO_MIGRATE_OPTION)
    if os.environ.get(env, "").strip():
        return parse_auto_migrate(os.environ[env], f"env {env}")
    raw = config._read_airflow_cfg(AUTO_MIGRATE_OPTION)
    if raw is None or not raw.strip():
        return None
    return parse_auto_migrate(raw, f"airflow.cfg [finalckpt] {AUTO_MIGRATE_OPTION}")


def require_schema(engine: Engine, *, auto_migrate: bool | None = None) -> bool:
    """Make sure the store's schema is at head before this process uses it.

    ``auto_migrate`` (default: ``[finalckpt] auto_migrate``, else ``auto_migrate_default``)
    decides whether this process may bring it there itself (True if it did). Otherwise a
    store at an older revision, or empty, raises SchemaBehindError naming ``finalckpt db
    upgrade`` and both revisions, and nothing is written (no DDL, no version row).
    """
    if _may_read_first(engine) and current_revision(engine) == head_revision():
        return False  # the common case: no write lock, no setting to read
    if auto_migrate is None:
        auto_migrate = configured_auto_migrate()
    if auto_migrate is None:
        auto_migrate = auto_migrate_default(engine)
    if auto_migrate:
        return ensure_schema(engine)
    raise schema_behind(engine, current_revision(engine), head_revision())


def _may_read_first(engine: Engine) -> bool:
    """Whether the revision can be read before deciding: not for a SQLite file that does not
    exist yet (connecting would create it, or fail on its missing directory).
    """
    if engine.dialect.name != "sqlite":
        return True
    path = sqlite_database_path(engine.url)
    return path is not None and os.path.exists(path)


def schema_behind(engine: Engine, current: str | None, required: str) -> SchemaBehindError:
    """The one-line error of a store this process may not migrate."""
    from airflow_finalckpt.config import mask_url

    where = mask_url(engine.url.render_as_string(hide_password=False))
    state = f"at schema revision {current}" if current else "empty (no schema)"
    return SchemaBehindError(
        f"coordination store {where} is {state}, airflow-finalckpt {package_version()} "
        f"requires revision {required}: run `finalckpt db upgrade` (the Helm chart's migration "
        f"Job runs it on install and upgrade; automatic migration is off for this "
        f"{engine.dialect.name} store, [finalckpt] {AUTO_MIGRATE_OPTION})",
        current=current,
        required=required,
    )
