"""``[finalckpt] store_password``: the coordination store's password, kept apart from its URL.

The Helm chart renders the store URL from values (host, port, database, user, ``sslmode``) in a
ConfigMap, which holds no credential, and hands the password to every pod from an existing
Kubernetes Secret as ``AIRFLOW__FINALCKPT__STORE_PASSWORD`` (a Spark driver on Kubernetes gets
it through ``spark.kubernetes.driver.secretKeyRef``). Outside Kubernetes it may come from
Airflow's config as any sensitive option (``store_password_secret`` / ``_cmd``, a secrets
backend). Wherever the store URL is resolved, a PostgreSQL URL without a password gets this one,
so the rest of the package (connecting, masking, the code key) sees one URL as before.

No import of ``config`` (which calls this): env first, then Airflow's config when importable.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

STORE_PASSWORD_OPTION = "store_password"
STORE_PASSWORD_ENV = "AIRFLOW__FINALCKPT__STORE_PASSWORD"


def configured_store_password(*, airflow_config: bool = True) -> str | None:
    """The configured password (kept as it is: a Secret's bytes), None when unset."""
    value = os.environ.get(STORE_PASSWORD_ENV)
    if value:
        return value
    if not airflow_config:
        return None
    try:
        from airflow.configuration import conf

        found = conf.get("finalckpt", STORE_PASSWORD_OPTION, fallback=None)
    except Exception as exc:  # not installed, or a broken config: the option is unset here
        log.debug("Airflow's config [finalckpt] %s not read: %s", STORE_PASSWORD_OPTION, exc)
        return None
    return str(found) if found else None


def with_store_password(url: str, *, airflow_config: bool = True) -> str:
    """``url`` with the configured password when it is a PostgreSQL URL that has none."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("postgres") or parsed.password is not None:
        return url
    password = configured_store_password(airflow_config=airflow_config)
    if password is None:
        return url
    return parsed.set(password=password).render_as_string(hide_password=False)
