"""Where a stage's Spark driver runs: chosen by connection and configuration, not by DAG code.

The Airflow side of ``spark`` (it runs in the Airflow task): this module resolves the target,
``submit`` runs a driver through ``spark-submit`` and ``resumable`` reattaches to one across
task tries. The driver itself (``spark.driver``) never imports this package.

Three execution modes (see docs/spark-cluster.md):

``in-process``
    The Airflow task is the Spark driver: a SparkSession on ``local[*]`` (the default) or, in
    client mode, on a cluster master (``spark://``, ``yarn``, ``k8s://``).
``submit``
    ``spark-submit`` through the Spark provider's ``SparkSubmitHook`` (standalone, YARN or
    Kubernetes; client or cluster deploy mode). The Spark *driver* runs the stage runtime
    (``airflow_finalckpt.spark.driver``) and talks to the coordination store and the checkpoint
    storage itself; the Airflow task reads the driver's result and then waits for the final
    checkpoint, commits and closes as in the other modes.
``connect``
    Spark Connect (``sc://host:port``): the stage runtime runs in the Airflow task with a remote
    Spark Connect session; the Spark work runs on the Connect server's cluster.

Resolution, first match wins:

- the master: the operator's ``spark_master`` (templated), else the ``spark_conn_id`` connection
  (parsed by the provider's ``SparkSubmitHook``; a ``spark_connect`` connection by its
  ``SparkConnectHook``), else ``local[*]``;
- the mode: the operator's ``spark_execution``, else the connection extra
  ``finalckpt-execution``, else ``[finalckpt] spark_execution`` /
  ``AIRFLOW__FINALCKPT__SPARK_EXECUTION``, else automatic: ``sc://`` -> connect, a connection
  with a ``deploy-mode`` extra -> submit, anything else -> in-process;
- the deploy mode (submit only): the operator's ``spark_deploy_mode``, else the connection extra
  ``deploy-mode``, else ``client``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_finalckpt import config
from airflow_finalckpt.config import env_var_name
from airflow_finalckpt.core.errors import ConfigurationError, StageDefinitionError

#: Connection extra naming the execution mode.
EXECUTION_EXTRA = "finalckpt-execution"
#: Env variable (``[finalckpt] spark_execution``) naming the default execution mode.
EXECUTION_ENV = env_var_name("spark_execution")
DEFAULT_MASTER = "local[*]"

STANDALONE_PYTHON_CLUSTER_MODE = (
    "Spark standalone does not support cluster deploy mode for Python applications "
    "(spark-submit refuses it: 'Cluster deploy mode is currently not supported for python "
    "applications on standalone clusters'); use deploy mode 'client' with a spark:// master "
    "(the driver runs beside the Airflow task), or YARN / Kubernetes for cluster mode"
)


class UnsupportedDeployModeError(ConfigurationError, StageDefinitionError):
    """A deploy mode the master cannot run (standalone cluster mode for Python): the same on
    every try, so the task fails at once, before anything is submitted (permanent error).
    """


class ExecutionMode(StrEnum):
    """Where a stage's Spark driver runs: in the task, by spark-submit, or on Spark Connect."""

    IN_PROCESS = "in-process"
    SUBMIT = "submit"
    CONNECT = "connect"


@dataclass(frozen=True)
class SparkTarget:
    """The resolved execution: mode, master URL, deploy mode and where each came from."""

    mode: ExecutionMode
    master: str
    deploy_mode: str | None = None
    conn_id: str | None = None
    source: str = "default"

    @property
    def is_cluster_deploy(self) -> bool:
        """Whether the driver runs on the cluster (its files travel by the checkpoint storage)."""
        return self.deploy_mode == "cluster"

    def describe(self) -> str:
        """The target in words for logs, with the master's credentials masked."""
        deploy = f", deploy mode {self.deploy_mode}" if self.deploy_mode else ""
        return f"{self.mode.value} on {mask_master(self.master)}{deploy} ({self.source})"


def mask_master(master: str) -> str:
    """A Spark Connect URL may carry a token parameter: never log it."""
    if master.startswith("sc://") and "token=" in master:
        head, _, params = master.partition(";")
        kept = [p for p in params.split(";") if p and not p.startswith("token=")]
        return ";".join([head, *kept, "token=***"])
    return master


def parse_mode(value: Any, where: str) -> ExecutionMode:
    """An execution mode from its name or alias; ``where`` says whose value it is."""
    text = str(value).strip().lower().replace("_", "-")
    aliases = {"inprocess": "in-process", "local": "in-process", "spark-submit": "submit"}
    text = aliases.get(text, text)
    try:
        return ExecutionMode(text)
    except ValueError:
        choices = ", ".join(m.value for m in ExecutionMode)
        raise ConfigurationError(
            f"{where}: execution mode {value!r} is not one of {choices}"
        ) from None


def _configured_mode() -> str | None:
    """``[finalckpt] spark_execution``: its env variable, else airflow.cfg."""
    value = os.environ.get(EXECUTION_ENV, "").strip()
    return value or (config._read_airflow_cfg("spark_execution") or "").strip() or None


@dataclass(frozen=True)
class ConnectionInfo:
    """What the ``spark_conn_id`` connection says (None fields: not set)."""

    master: str
    deploy_mode: str | None
    execution: str | None


def connection_info(conn_id: str) -> ConnectionInfo | None:
    """Parse the Spark connection as the Spark provider does; None when it does not exist."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    extra = conn.extra_dejson or {}
    execution = extra.get(EXECUTION_EXTRA)
    # The Spark provider's hooks load only when a connection is resolved, not at DAG parsing.
    if conn.conn_type in ("spark_connect", "sc"):
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return ConnectionInfo(SparkConnectHook(conn_id).get_connection_url(), None, execution)
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    parsed = SparkSubmitHook(conn_id=conn_id)._connection
    return ConnectionInfo(str(parsed["master"]), parsed.get("deploy_mode"), execution)


def resolve_target(
    *,
    spark_master: str | None,
    spark_conn_id: str | None,
    execution: str | ExecutionMode | None = None,
    deploy_mode: str | None = None,
    connection: ConnectionInfo | None = None,
    lookup: bool = True,
) -> SparkTarget:
    """Resolve mode, master and deploy mode (see the module docstring).

    ``connection`` may be passed pre-parsed (tests); with ``lookup`` the ``spark_conn_id``
    connection is looked up through the Task SDK when not given.
    """
    if connection is None and lookup and spark_conn_id:
        connection = connection_info(spark_conn_id)
    master, master_source = _resolve_master(spark_master, connection, spark_conn_id)
    conn_deploy = connection.deploy_mode if connection is not None else None
    mode, mode_source = _resolve_mode(
        execution, connection, spark_conn_id, master, deploy_mode or conn_deploy
    )
    source = f"{master_source}; {mode_source}"
    if mode is ExecutionMode.SUBMIT:
        resolved_deploy = _submit_deploy_mode(master, deploy_mode or conn_deploy, source)
        return SparkTarget(mode, master, resolved_deploy, spark_conn_id, source)
    _check_driver_in_task(mode, master, deploy_mode, source)
    return SparkTarget(mode, master, None, spark_conn_id, source)


def _resolve_master(
    spark_master: str | None, connection: ConnectionInfo | None, spark_conn_id: str | None
) -> tuple[str, str]:
    """The master and where it came from: the argument, else the connection, else the default."""
    if spark_master:
        return spark_master, "master from spark_master"
    if connection is not None:
        return connection.master, f"master from connection {spark_conn_id}"
    return DEFAULT_MASTER, "default master"


def _resolve_mode(
    execution: str | ExecutionMode | None,
    connection: ConnectionInfo | None,
    spark_conn_id: str | None,
    master: str,
    deploy_mode: str | None,
) -> tuple[ExecutionMode, str]:
    """The execution mode and where it came from: the argument, the connection's extra, the
    ``[finalckpt]`` setting, else what the master and deploy mode imply.
    """
    if execution:
        return (
            parse_mode(execution, "operator argument spark_execution"),
            "mode from spark_execution",
        )
    if connection is not None and connection.execution:
        where = f"connection {spark_conn_id} extra {EXECUTION_EXTRA}"
        return (
            parse_mode(connection.execution, where),
            f"mode from connection extra {EXECUTION_EXTRA}",
        )
    if (configured := _configured_mode()) is not None:
        return (
            parse_mode(configured, f"{EXECUTION_ENV} / [finalckpt] spark_execution"),
            "mode from [finalckpt] spark_execution",
        )
    if master.startswith("sc://"):
        return ExecutionMode.CONNECT, "mode from the sc:// master"
    if deploy_mode and not master.startswith("local"):
        return ExecutionMode.SUBMIT, "mode from the deploy mode"
    return ExecutionMode.IN_PROCESS, "default mode"


def _check_driver_in_task(
    mode: ExecutionMode, master: str, deploy_mode: str | None, source: str
) -> None:
    """Connect needs an sc:// master and only it takes one; in-process refuses cluster mode."""
    if mode is ExecutionMode.CONNECT:
        if not master.startswith("sc://"):
            raise ConfigurationError(
                f"execution mode connect needs a Spark Connect URL (sc://host:port), got master "
                f"{mask_master(master)!r} ({source})"
            )
        return
    if master.startswith("sc://"):
        raise ConfigurationError(
            f"master {mask_master(master)!r} is a Spark Connect URL but the execution mode is "
            f"{mode.value}; use execution mode connect (or leave it unset) ({source})"
        )
    if deploy_mode == "cluster":
        raise ConfigurationError(
            "deploy mode cluster needs execution mode submit: an in-process driver runs in "
            f"the Airflow task ({source})"
        )


def _submit_deploy_mode(master: str, deploy_mode: str | None, source: str) -> str:
    """The deploy mode of a spark-submit (client unless set), refused where it cannot run."""
    if master.startswith("sc://"):
        raise ConfigurationError(
            f"master {mask_master(master)!r} is a Spark Connect URL but the execution mode is "
            f"{ExecutionMode.SUBMIT.value}; use execution mode connect (or leave it unset) "
            f"({source})"
        )
    resolved_deploy = deploy_mode or "client"
    if resolved_deploy not in ("client", "cluster"):
        raise ConfigurationError(
            f"deploy mode {resolved_deploy!r} is not 'client' or 'cluster' ({source})"
        )
    if resolved_deploy == "cluster" and master.startswith("spark://"):
        raise UnsupportedDeployModeError(f"{STANDALONE_PYTHON_CLUSTER_MODE} ({source})")
    if resolved_deploy == "cluster" and master.startswith("local"):
        raise UnsupportedDeployModeError(
            f"deploy mode cluster needs a cluster master, not {master!r} ({source})"
        )
    return resolved_deploy
