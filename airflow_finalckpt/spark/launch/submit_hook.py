"""The SparkSubmitHook a stage submits with: the Spark provider's, with a scoped environment.

The provider's hook starts spark-submit with the whole environment of the Airflow worker
(``os.environ`` plus ``env_vars``): a client-mode driver and its executors' Python workers
would inherit every ``AIRFLOW_CONN_*``, ``AIRFLOW_VAR_*`` and ``AIRFLOW__*`` (Airflow's
database URL, Fernet and JWT keys, secrets backends' settings). The driver needs none of them:
its credentials come in its secrets file (``spark.secrets``). Here spark-submit gets the
worker's environment without Airflow's namespaces (what Java, Spark, Hadoop, Python and the
storage's own client libraries read stays), plus the ``env_vars`` the launcher sets.
Airflow is imported here (the provider), never by the driver.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

#: Airflow's connections, variables and configuration (``_AIRFLOW_*``: the official image's
#: start-up settings, such as the admin user's password): never inherited by a driver.
AIRFLOW_NAMESPACES = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "AIRFLOW__", "_AIRFLOW_")


def driver_environment(environ: Mapping[str, str], env_vars: Mapping[str, str]) -> dict[str, str]:
    """The environment spark-submit runs with: ``environ`` without Airflow's namespaces, then
    ``env_vars`` (the launcher's own, such as the storage root).
    """
    kept = {k: v for k, v in environ.items() if not k.upper().startswith(AIRFLOW_NAMESPACES)}
    kept.update({k: str(v) for k, v in env_vars.items()})
    return kept


class ScopedEnvSubmitHook(SparkSubmitHook):
    """SparkSubmitHook whose spark-submit process gets ``driver_environment``."""

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command: list[str] = super()._build_spark_submit_command(application)
        # the provider would start spark-submit with os.environ + env_vars: submit() below
        # hands Popen the scoped environment instead
        self._env = None
        return command

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        """spark-submit ``application`` with the scoped environment."""
        kwargs["env"] = driver_environment(os.environ, self._env_vars or {})
        result: str | None = super().submit(application, **kwargs)
        return result


def master_submit_hook(master: str, **kwargs: Any) -> Any:
    """A SparkSubmitHook for an explicit master (``spark_master`` argument, no connection)."""

    class _Hook(ScopedEnvSubmitHook):
        def _resolve_connection(self) -> dict[str, Any]:
            conn: dict[str, Any] = {
                "master": master,
                "queue": None,
                "deploy_mode": self._deploy_mode,
                "spark_binary": self.spark_binary or "spark-submit",
                "namespace": None,
                "principal": self._principal,
                "keytab": self._keytab,
                "rest_scheme": "http",
                "rest_port": 6066,
                "rest_endpoint": None,
            }
            if "spark.kubernetes.namespace" in self._conf:
                conn["namespace"] = self._conf["spark.kubernetes.namespace"]
            return conn

    return _Hook(conn_id="__finalckpt_no_connection__", **kwargs)
