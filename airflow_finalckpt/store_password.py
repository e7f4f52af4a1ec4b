"""``[finalckpt] store_password``: the coordination store's password, kept apart from its URL.

The Helm chart renders the store URL from values (host, port, database, user, ``sslmode``) in a
ConfigMap, which holds no credential, and hands the password to every pod from an existing
Kubernetes Secret as ``AIRFLOW__FINALCKPT__STORE_PASSWORD`` (a Spark driver on Kubernetes gets
it through ``spark.kubernetes.driver.secretKeyRef``). Outside Kubernetes it may come from
Airflow's config as any sensitive option (``store_password_secret`` / ``_cmd``, a secrets
backend). Wherever the store URL is resolved, a PostgreSQL URL without a password gets this one,
so the rest of the package (connecting, masking, the code key) sees one URL as before.

No import of ``config`` (which calls this, handing over its reader of Airflow's config); the
Spark driver reads the env only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: Reads ``[finalckpt] <name>`` from Airflow's config (``config._read_airflow_cfg``).
CfgReader = Callable[[str], str | None]

STORE_PASSWORD_OPTION = "store_password"
STORE_PASSWORD_ENV = "AIRFLOW__FINALCKPT__STORE_PASSWORD"


def configured_store_password(read_cfg: CfgReader | None = None) -> str | None:
    """The configured password (kept as it is: a Secret's bytes), None when unset: env first,
    then ``read_cfg`` (config's reader of Airflow's ``[finalckpt]`` options) if given.
    """
    value = os.environ.get(STORE_PASSWORD_ENV)
    if value:
        return value
    found = read_cfg(STORE_PASSWORD_OPTION) if read_cfg is not None else None
    return found or None


def with_store_password(url: str, read_cfg: CfgReader | None = None) -> str:
    """``url`` with the configured password when it is a PostgreSQL URL that has none."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("postgres") or parsed.password is not None:
        return url
    password = configured_store_password(read_cfg)
    if password is None:
        return url
    return parsed.set(password=password).render_as_string(hide_password=False)
