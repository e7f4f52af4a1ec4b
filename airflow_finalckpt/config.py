"""Settings of airflow-finalckpt and where each one comes from.

Every setting is resolved on its own, first source wins:

1. an explicit override (``load_settings(overrides)``, CLI options);
2. env ``AIRFLOW__FINALCKPT__<NAME>`` (Airflow's convention for section ``[finalckpt]``);
3. for ``store_url`` only: the Airflow connection ``finalckpt_default``, read from env
   ``AIRFLOW_CONN_FINALCKPT_DEFAULT`` (URI or JSON form, parsed by Airflow's ``Connection``
   API where Airflow is installed: ``connections/``);
4. the ``[finalckpt]`` section through Airflow's config API (``conf.get``: airflow.cfg, and
   ``_cmd`` / ``_secret`` variants where Airflow allows them), when Airflow is importable;
5. the default of the option in ``provider_info.CONFIG_OPTIONS`` (the provider's ``config``
   section, so ``airflow config list --section finalckpt`` shows the same defaults), expanded
   under ``AIRFLOW_HOME`` (SQLite store, local checkpoint directory).

Two paths, kept apart: inside Airflow (tasks, triggerer, api-server, CLI next to Airflow) step 4
asks Airflow's ``conf``; where Airflow is not installed (the Spark driver of a submitted stage, the
CLI on a bare machine) only steps 1-3 and 5 answer. The Spark driver never resolves the store or
the storage here: the Airflow task resolves them and passes the values in the driver job's
environment (``spark/launch/submit.py``), which the driver reads as they are (``spark/driver.py``).
Airflow is imported lazily, only when a setting is still unresolved after steps 1-3, and any
failure to import it is ignored.

``storage_conn_id`` names an Airflow connection whose object-store credentials go under
``storage_options`` (``connections/storage.py``: the provider's hook where it is installed);
it is resolved by ``load_settings`` where settings are used (tasks, triggerer, CLI), never in a
Spark driver, which receives the resolved options through its secrets file.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from airflow_finalckpt.connections.database import store_url_from_connection
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.provider_info import SECTION, SETTING_DEFAULTS, expand_default
from airflow_finalckpt.store_password import with_store_password

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

log = logging.getLogger(__name__)

CONNECTION_ID = "finalckpt_default"
CONNECTION_ENV = "AIRFLOW_CONN_FINALCKPT_DEFAULT"
MASK = "***"

SOURCE_OVERRIDE = "override"
SOURCE_CONNECTION = f"connection {CONNECTION_ID} (env {CONNECTION_ENV})"
SOURCE_DEFAULT = "default"

_SECRET_OPTION_MARKERS = (
    "secret",
    "password",
    "passwd",
    "token",
    "key",
    "credential",
    "connection_string",
    "sas",
    "sig",
)
#: URL query parameters that carry a credential: libpq's ``password``, Azure's SAS ``sig``...
_SECRET_QUERY_MARKERS = (*_SECRET_OPTION_MARKERS, "pwd")


def is_secret_name(name: str) -> bool:
    """Whether an option or query parameter of that name holds a credential."""
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_QUERY_MARKERS)


def env_var_name(name: str) -> str:
    """The env variable Airflow would map to ``[finalckpt] <name>``."""
    return f"AIRFLOW__{SECTION.upper()}__{name.upper()}"


def airflow_home() -> str:
    """``AIRFLOW_HOME`` as Airflow resolves it (default ``~/airflow``)."""
    return os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow")


@dataclass(frozen=True, repr=False)
class FinalCkptSettings:
    """Resolved settings. ``sources`` tells, per setting, where its value came from."""

    store_url: str
    storage_uri: str
    storage_options: dict[str, Any]
    checkpoint_interval_s: float = 60
    checkpoint_timeout_s: float = 600
    retain_checkpoints: int = 3
    store_connect_retries: int = 5
    store_connect_backoff_s: float = 1.0
    target_batch_s: float = DEFAULT_TARGET_BATCH_S
    retention_days: float = 7.0
    attempt_lease_s: float = 60
    storage_conn_id: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def masked_store_url(self) -> str:
        """The store URL with its password masked: safe for logs and messages."""
        return mask_url(self.store_url)

    def describe(self) -> str:
        """One line per setting, passwords and secret storage options masked: safe for logs."""
        values = {
            "store_url": self.masked_store_url(),
            "storage_uri": mask_url(self.storage_uri),
            "storage_options": json.dumps(mask_storage_options(self.storage_options), default=repr),
            "checkpoint_interval_s": repr(self.checkpoint_interval_s),
            "checkpoint_timeout_s": repr(self.checkpoint_timeout_s),
            "retain_checkpoints": repr(self.retain_checkpoints),
            "store_connect_retries": repr(self.store_connect_retries),
            "store_connect_backoff_s": repr(self.store_connect_backoff_s),
            "target_batch_s": repr(self.target_batch_s),
            "retention_days": repr(self.retention_days),
            "attempt_lease_s": repr(self.attempt_lease_s),
            "storage_conn_id": self.storage_conn_id or "(none)",
        }
        return "\n".join(
            f"{name} = {value} ({self.sources.get(name, 'unknown source')})"
            for name, value in values.items()
        )

    def __repr__(self) -> str:
        # The generated repr would print the store password into every log line that shows us.
        return f"FinalCkptSettings({self.describe().replace(chr(10), '; ')})"


# --------------------------------------------------------------------------- masking


def mask_url(url: str) -> str:
    """``url`` with its password and its credential query parameters (``?password=``, an
    Azure SAS ``sig=``...) replaced by ``***``; works for SQLAlchemy and fsspec URLs.
    """
    if "://" not in url:
        return _mask_connection_string(url)
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return _mask_query(_mask_generic_url(url))
    if parsed.password is not None:
        url = parsed.render_as_string(hide_password=True)
    return _mask_query(url)


def _mask_query(url: str) -> str:
    """The URL with the values of credential query parameters masked."""
    head, sep, query = url.partition("?")
    if not sep:
        return url
    query, hash_sep, fragment = query.partition("#")
    pairs = []
    for pair in query.split("&"):
        name, eq, _value = pair.partition("=")
        pairs.append(f"{name}={MASK}" if eq and is_secret_name(name) else pair)
    return f"{head}?{'&'.join(pairs)}{hash_sep}{fragment}"


def _mask_connection_string(text: str) -> str:
    """An Azure-style ``Name=value;Name=value`` connection string with its keys masked."""
    if ";" not in text or "=" not in text:
        return text
    parts = []
    for part in text.split(";"):
        name, eq, _value = part.partition("=")
        parts.append(f"{name}={MASK}" if eq and is_secret_name(name) else part)
    return ";".join(parts)


def _mask_generic_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostinfo}"))


def mask_storage_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of fsspec storage options with credential-looking values masked (recursively)."""
    masked: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            masked[key] = mask_storage_options(value)
        elif any(marker in str(key).lower() for marker in _SECRET_OPTION_MARKERS):
            masked[key] = MASK
        elif isinstance(value, str):
            masked[key] = mask_url(value)  # an endpoint URL with a SAS token, a password...
        else:
            masked[key] = value
    return masked


# --------------------------------------------------------------------------- parsers
# Each parser takes a raw value (string from env/cfg, or a typed override) and returns the typed
# value or raises ValueError with a message that does not repeat secrets.


def parse_store_url(raw: Any) -> str:
    """Validate a SQLAlchemy URL for the coordination store and pin the psycopg 3 driver."""
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    if isinstance(raw, URL):
        raw = raw.render_as_string(hide_password=False)
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("must be a non-empty SQLAlchemy URL")
    try:
        url = make_url(raw.strip())
    except (ArgumentError, ValueError) as exc:
        raise ValueError(f"not a SQLAlchemy URL ({mask_url(raw)!r})") from exc
    # Split by hand: URL.get_backend_name() would try to load an unknown dialect and fail.
    backend, _, driver = url.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        url = _postgres_store_url(url)
    elif backend == "sqlite":
        url = _sqlite_store_url(url, driver)
    else:
        raise ValueError(
            f"unsupported database {url.drivername!r}; use postgresql+psycopg:// or sqlite:///"
        )
    return url.render_as_string(hide_password=False)


def _postgres_store_url(url: URL) -> URL:
    """A PostgreSQL store URL pinned to psycopg 3; it must name a database."""
    if url.drivername not in ("postgresql", "postgres", "postgresql+psycopg"):
        raise ValueError(
            f"unsupported driver {url.drivername!r}; use postgresql+psycopg:// (psycopg 3)"
        )
    url = url.set(drivername="postgresql+psycopg")
    if not url.database:
        raise ValueError("PostgreSQL URL names no database")
    return url


def _sqlite_store_url(url: URL, driver: str) -> URL:
    """A SQLite store URL: a file every process opens by the same absolute path."""
    if driver not in ("", "pysqlite"):
        raise ValueError(f"unsupported driver {url.drivername!r}; use sqlite:///")
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        raise ValueError(
            "an in-memory SQLite database cannot coordinate several processes; "
            "use a file: sqlite:////absolute/path.db"
        )
    if not os.path.isabs(os.path.expanduser(database)):
        raise ValueError(
            f"SQLite path {database!r} is relative: every worker must open the same file, "
            "use sqlite:////absolute/path.db"
        )
    return url.set(database=os.path.expanduser(database))


def parse_storage_uri(raw: Any) -> str:
    """Validate checkpoint storage: an fsspec URI or an absolute local path."""
    import fsspec
    from fsspec.core import split_protocol

    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("must be a non-empty fsspec URI or absolute path")
    uri = raw.strip()
    protocol, path = split_protocol(uri)
    if protocol is None:
        path = os.path.expanduser(uri)
        if not os.path.isabs(path):
            raise ValueError(
                f"local path {uri!r} is relative: every worker must see the same directory, "
                "use an absolute path or a URI such as s3a://bucket/prefix"
            )
        return path
    if protocol not in fsspec.available_protocols():
        raise ValueError(f"unknown storage protocol {protocol!r} in {mask_url(uri)!r}")
    if protocol in ("file", "local") and not os.path.isabs(path):
        raise ValueError(f"local path {path!r} is relative; use an absolute path")
    return uri


def parse_storage_options(raw: Any) -> dict[str, Any]:
    """Fsspec storage options: a mapping, or a JSON object when given as text."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise ValueError("must be a JSON object")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}")
    return value


def parse_conn_id(raw: Any) -> str:
    """An Airflow connection id, or "" for none."""
    if not isinstance(raw, str):
        raise ValueError("must be an Airflow connection id")
    value = raw.strip()
    if value and not all(c.isalnum() or c in "_-." for c in value):
        raise ValueError(f"{value!r} is not an Airflow connection id")
    return value


def parse_positive_seconds(raw: Any) -> float:
    """A finite duration in seconds, > 0."""
    if isinstance(raw, bool):
        raise ValueError("must be a number of seconds, not a boolean")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be a number of seconds, got {raw!r}") from exc
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive, finite number of seconds, got {raw!r}")
    return value


def parse_retention_days(raw: Any) -> float:
    """How many days a closed pipeline is kept: a finite number >= 0 (0: the next gc)."""
    if isinstance(raw, bool):
        raise ValueError("must be a number of days, not a boolean")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be a number of days, got {raw!r}") from exc
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a finite number of days >= 0, got {raw!r}")
    return value


def _parse_whole_number(raw: Any, minimum: int) -> int:
    """An int from an int or a numeric string; booleans and other types are refused."""
    expected = f"an integer >= {minimum}"
    if isinstance(raw, bool):
        raise ValueError(f"must be {expected}, not a boolean")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError as exc:
            raise ValueError(f"must be {expected}, got {raw!r}") from exc
    raise ValueError(f"must be {expected}, got {raw!r}")


def parse_retain_count(raw: Any) -> int:
    """How many complete checkpoints to keep: a whole number >= 1 (restore needs one)."""
    value = _parse_whole_number(raw, 1)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {raw!r}")
    return value


def parse_retry_count(raw: Any) -> int:
    """How many times to retry: a whole number >= 0 (0: one attempt, no retry)."""
    value = _parse_whole_number(raw, 0)
    if not 0 <= value <= 100:
        raise ValueError(f"must be an integer from 0 to 100, got {raw!r}")
    return value


# --------------------------------------------------------------------------- Airflow's config


def _read_airflow_cfg(name: str) -> str | None:
    """``[finalckpt] <name>`` as Airflow's config API answers it, unless it is only the default.

    None when the option is unset (Airflow then answers the provider default, which step 5
    resolves itself, labelled "default") or when Airflow is not importable.
    """
    try:
        from airflow.configuration import conf
    except Exception as exc:  # Not installed, or a broken install/config: not our business.
        log.debug("Airflow's config not consulted for finalckpt settings: %s", exc)
        return None
    try:
        value = conf.get(SECTION, name, fallback=None)
        default = conf.get_default_value(SECTION, name, fallback=None)
    except Exception as exc:
        log.debug("Airflow's config [%s] %s could not be read: %s", SECTION, name, exc)
        return None
    if value is None or (default is not None and str(value) == str(default)):
        return None
    return str(value)


def airflow_option(section: str, name: str) -> tuple[str | None, str]:
    """``[section] name`` for options outside the settings below (the CLI's API client, Airflow's
    ``[api] base_url``): env ``AIRFLOW__<SECTION>__<NAME>`` first (read without Airflow too),
    then Airflow's config API (airflow.cfg, and ``_cmd`` / ``_secret`` for sensitive options).
    Returns (value, where it came from), or (None, "unset").
    """
    env_name = f"AIRFLOW__{section.upper()}__{name.upper()}"
    if os.environ.get(env_name, "").strip():
        return os.environ[env_name].strip(), f"env {env_name}"
    try:
        from airflow.configuration import conf

        value = conf.get(section, name, fallback=None)
    except Exception as exc:  # Not installed, or a broken config: the option is unset here.
        log.debug("Airflow's config [%s] %s could not be read: %s", section, name, exc)
        return None, "unset"
    if value is None or not str(value).strip():
        return None, "unset"
    return str(value).strip(), f"Airflow's config [{section}] {name}"


# --------------------------------------------------------------------------- resolution

Parser = Callable[[Any], Any]

PARSERS: dict[str, Parser] = {
    "store_url": parse_store_url,
    "storage_uri": parse_storage_uri,
    "storage_options": parse_storage_options,
    "checkpoint_interval_s": parse_positive_seconds,
    "checkpoint_timeout_s": parse_positive_seconds,
    "retain_checkpoints": parse_retain_count,
    "store_connect_retries": parse_retry_count,
    "store_connect_backoff_s": parse_positive_seconds,
    "target_batch_s": parse_positive_seconds,
    "retention_days": parse_retention_days,
    "attempt_lease_s": parse_positive_seconds,
    "storage_conn_id": parse_conn_id,
}


def _default(name: str) -> str:
    """The provider's default of ``name`` (``provider_info.CONFIG_OPTIONS``), expanded as
    Airflow expands it; parsed like any other source.
    """
    return expand_default(SETTING_DEFAULTS[name], airflow_home().rstrip("/") or "/")


def _candidates(name: str, overrides: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield (source, raw value) pairs for one setting, highest priority first, lazily."""
    if overrides.get(name) is not None:
        yield SOURCE_OVERRIDE, overrides[name]
    env_name = env_var_name(name)
    if os.environ.get(env_name, "").strip():
        yield f"env {env_name}", os.environ[env_name]
    if name == "store_url" and os.environ.get(CONNECTION_ENV, "").strip():
        yield SOURCE_CONNECTION, os.environ[CONNECTION_ENV]
    cfg_value = _read_airflow_cfg(name)
    if cfg_value is not None and cfg_value.strip():
        yield f"airflow.cfg [{SECTION}] {name}", cfg_value
    yield SOURCE_DEFAULT, _default(name)


def resolve_setting(name: str, overrides: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """Resolve one setting: returns (value, source). Raises ConfigurationError on a bad value.

    Only the first source that has a value is parsed: a bad value in a lower-priority source
    that is shadowed does not matter, and Airflow is not imported if an earlier source answers.
    """
    if name not in PARSERS:
        raise ConfigurationError(f"unknown finalckpt setting {name!r}; known: {sorted(PARSERS)}")
    for source, raw in _candidates(name, overrides or {}):
        try:
            if source == SOURCE_CONNECTION:
                raw = store_url_from_connection(raw)
            value = PARSERS[name](raw)
            if name == "store_url":  # a password kept apart (the Helm chart's Secret)
                value = with_store_password(value, _read_airflow_cfg)
            return value, source
        except ValueError as exc:
            raise ConfigurationError(
                f"invalid finalckpt setting {name} from {source}: {exc}"
            ) from exc
    raise AssertionError("unreachable: the default source always answers")


def load_settings(overrides: Mapping[str, Any] | None = None) -> FinalCkptSettings:
    """Resolve every setting (see the module docstring for the order)."""
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(PARSERS))
    if unknown:
        raise ConfigurationError(
            f"unknown finalckpt setting(s) {unknown} in overrides; known: {sorted(PARSERS)}"
        )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in PARSERS:
        values[name], sources[name] = resolve_setting(name, overrides)
    if values["storage_conn_id"]:
        _add_connection_storage_options(values, sources)
    return FinalCkptSettings(**values, sources=sources)


def storage_options_with_connection() -> dict[str, Any]:
    """``storage_options`` with ``storage_conn_id``'s options under them, without resolving the
    other settings (a quick command's checkpoint storage).
    """
    values = {name: resolve_setting(name)[0] for name in ("storage_options", "storage_conn_id")}
    if values["storage_conn_id"]:
        _add_connection_storage_options(values, {"storage_options": ""})
    return dict(values["storage_options"])


def _add_connection_storage_options(values: dict[str, Any], sources: dict[str, str]) -> None:
    """The storage connection's options under the explicit ``storage_options`` (which win)."""
    from airflow_finalckpt.connections.resolve import resolve_storage_options

    conn_id = values["storage_conn_id"]
    from_connection = resolve_storage_options(conn_id, "checkpoint storage", "fsspec")
    values["storage_options"] = {**from_connection, **values["storage_options"]}
    sources["storage_options"] += f" + Airflow connection {conn_id}"
