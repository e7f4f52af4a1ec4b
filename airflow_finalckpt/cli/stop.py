"""``finalckpt stop | resume | reset | status | restore``: the operator's controls from a
terminal.

``stop``, ``resume``, ``reset`` and ``status`` go through Airflow's api-server by default (the
plugin's REST routes: Airflow's roles decide, changes land in Airflow's audit log); the admin
flag ``--direct-store`` acts on the coordination store itself instead (``cli/actions.py``).
``restore`` checks the savepoint against the store and storage here and asks Airflow's REST API
for the DAG's graph and the new DAG run (``cli/airflow_api.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from airflow_finalckpt.cli.airflow_api import AirflowApi

from airflow_finalckpt.cli._shared import EXIT_ERROR, _fail, json_option, store_url_option
from airflow_finalckpt.cli.actions import (
    cli_user,
    control_of,
    direct_store_option,
    run_actions,
)
from airflow_finalckpt.control import StopSummary
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StopMode, StopState
from airflow_finalckpt.core.run_conf import ALLOW_DROP_STAGES_KEY


def _echo_json(doc: object) -> None:
    click.echo(json.dumps(doc, indent=2))


def _describe_stop(stop: StopSummary) -> str:
    what = "stop with drain" if stop.mode is StopMode.DRAIN else "stop with savepoint"
    text = f"{what} #{stop.request_id}: {stop.state.value}"
    if stop.savepoint_id is not None:
        text += f", savepoint {stop.savepoint_id}"
    if stop.savepoint_path:
        text += f" at {stop.savepoint_path}"
    if stop.failure_reason:
        text += f" ({stop.failure_reason})"
    return text


@click.command("stop")
@click.argument("dag_id")
@click.argument("run_id")
@click.option("--drain", "mode", flag_value=StopMode.DRAIN.value, help="Finish and publish now.")
@click.option(
    "--savepoint",
    "mode",
    flag_value=StopMode.SAVEPOINT.value,
    help="Suspend at a savepoint; resume later with nothing lost.",
)
@click.option("--wait/--no-wait", default=False, help="Wait until the savepoint completed.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@json_option
@direct_store_option
@store_url_option
def stop(
    dag_id: str,
    run_id: str,
    mode: str | None,
    wait: bool,
    timeout_s: float,
    as_json: bool,
    direct_store: bool,
    store_url: str | None,
) -> None:
    """Stop a running pipeline DAG run with drain or with a savepoint.

    Goes through Airflow's api-server ([finalckpt] api_url, else [api] base_url; credentials
    [finalckpt] api_token, or api_username and api_password): the user needs permission to
    edit the DAG's runs, and the stop is in Airflow's audit log. --direct-store (admin) writes
    the coordination store instead.

    Exit 2 with a one-line reason for an unknown run, a finished run, a run already stopping,
    suspended or drained, a refusal by Airflow, or (with --wait) a savepoint that failed or did
    not complete in time.
    """
    if mode is None:
        _fail("choose how to stop: --drain or --savepoint", EXIT_ERROR)
    with run_actions(direct_store, store_url) as act:
        summary = act.stop(dag_id, run_id, StopMode(mode))
        if not as_json:
            click.echo(f"{dag_id} {run_id}: {_describe_stop(summary)}")
        if wait and summary.state is StopState.REQUESTED:
            summary = act.wait_for_stop(dag_id, run_id, timeout_s)
            if not as_json:
                click.echo(f"{dag_id} {run_id}: {_describe_stop(summary)}")
        if as_json:
            _echo_json(summary.model_dump(mode="json"))
        if summary.state is StopState.FAILED:
            _fail(f"the stop failed, the run keeps running: {summary.failure_reason}", EXIT_ERROR)


@click.command("resume")
@click.argument("dag_id")
@click.argument("run_id")
@json_option
@direct_store_option
@store_url_option
def resume(
    dag_id: str, run_id: str, as_json: bool, direct_store: bool, store_url: str | None
) -> None:
    """Resume a DAG run suspended by a stop with savepoint (it continues in the same DAG run).

    A drained run cannot be resumed (its event-time windows already fired). Through Airflow's
    api-server like stop (--direct-store: on the coordination store, admin only).
    """
    with run_actions(direct_store, store_url) as act:
        summary = act.resume(dag_id, run_id)
    if as_json:
        _echo_json(summary.model_dump(mode="json"))
    else:
        click.echo(f"{dag_id} {run_id}: resumed ({_describe_stop(summary)})")


@click.command("restore")
@click.argument("dag_id")
@click.option(
    "--from",
    "savepoint_path",
    required=True,
    metavar="SAVEPOINT_PATH",
    help="The savepoint's directory or _metadata file (local path or fsspec URL).",
)
@click.option("--run-id", default=None, help="Run id of the new DAG run (default: Airflow's).")
@click.option(
    "--allow-drop-stage",
    "allow_drop_stages",
    multiple=True,
    metavar="STAGE_ID",
    help="Drop this removed or renamed stage's progress on purpose (repeatable); without it "
    "such a graph change is refused.",
)
@click.option("--dry-run", is_flag=True, help="Only check, and print what the restore will do.")
@click.option(
    "--no-graph-check",
    is_flag=True,
    help="Do not ask the Airflow API for the DAG's graph (e.g. a dry run while it is "
    "unreachable): only the savepoint is checked here; the stage tasks still check the graph "
    "before they write anything.",
)
@json_option
@store_url_option
def restore(
    dag_id: str,
    savepoint_path: str,
    run_id: str | None,
    allow_drop_stages: tuple[str, ...],
    dry_run: bool,
    no_graph_check: bool,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Start a new DAG run of DAG_ID that continues from a savepoint (conf ``restore_from``).

    Works on another cluster with an empty coordination database. The savepoint and the DAG's
    graph change are checked first, by the same rules the stage tasks apply before they write
    anything; the dry run prints what the restore will do per stage. Refused: a drained
    savepoint, an unreadable or corrupt one, a savepoint of another pipeline, a graph change
    that would lose progress (unless --allow-drop-stage names the stage).

    The DAG's graph and the new DAG run come from Airflow's api-server ([finalckpt] api_url,
    else [api] base_url; credentials [finalckpt] api_token, or api_username and api_password).
    An unreachable api-server, 401, 403 or an unknown DAG end in one line and exit 2.
    """
    from airflow_finalckpt.cli.airflow_api import AirflowApi, api_settings

    with AirflowApi(api_settings()) as api, control_of(store_url) as control:
        load_graph = _no_graph if no_graph_check else _graph_from(api)
        check = control.plan_restore(
            dag_id,
            savepoint_path,
            load_graph,
            allow_drop_stages=allow_drop_stages,
            load_splits=None if no_graph_check else api.declared_splits,
        )
        if not as_json:  # the plan first: shown even if Airflow then refuses the run
            for line in check.lines():
                click.echo(line)
            click.echo(f"can be restored into {dag_id}")
        conf: dict[str, object] = {"restore_from": savepoint_path}
        if allow_drop_stages:
            conf[ALLOW_DROP_STAGES_KEY] = list(allow_drop_stages)
        note = f"airflow-finalckpt: restore from {savepoint_path} (by {cli_user()})"
        new_run_id = None if dry_run else api.trigger_run(dag_id, conf, run_id=run_id, note=note)
    if as_json:  # one document: the check and the new run (null for a dry run), as over REST
        _echo_json({**check.model_dump(mode="json"), "run_id": new_run_id})
    elif new_run_id is not None:
        click.echo(f"created DAG run {new_run_id} of {dag_id} with conf {json.dumps(conf)}")


def _no_graph(dag_id: str) -> StageGraph | None:
    """``--no-graph-check``: the graph is not asked for (the stage tasks check it)."""
    return None


def _graph_from(api: AirflowApi) -> Callable[[str], StageGraph]:
    """The DAG's graph from the api-server; unreachable: refused, naming --no-graph-check (a
    restore is never planned against a graph nobody checked unless the user says so).
    """
    from airflow_finalckpt.cli.airflow_api import AirflowApiUnreachableError

    def load(dag_id: str) -> StageGraph:
        try:
            return api.stage_graph(dag_id)
        except AirflowApiUnreachableError as exc:
            raise AirflowApiUnreachableError(
                f"{exc}. The DAG's graph change cannot be checked without it: start or point to "
                "the api-server, or pass --no-graph-check to check the savepoint only (the stage "
                "tasks check the graph before they write anything)"
            ) from exc

    return load


@click.command("status")
@click.argument("dag_id")
@click.argument("run_id")
@json_option
@direct_store_option
@store_url_option
def status(
    dag_id: str, run_id: str, as_json: bool, direct_store: bool, store_url: str | None
) -> None:
    """Show a pipeline DAG run: its state, stop request and stages (through Airflow's
    api-server: needs permission to read the DAG's runs; --direct-store: from the store).
    """
    with run_actions(direct_store, store_url) as act:
        detail = act.describe(dag_id, run_id)
    if as_json:
        _echo_json(detail.model_dump(mode="json"))
        return
    summary = detail.summary
    click.echo(f"pipeline {summary.pipeline_key}: {summary.state.value}")
    if summary.stop is not None:
        click.echo(f"  {_describe_stop(summary.stop)}")
    if summary.unread_splits:
        click.echo(f"  drained with {summary.unread_splits} input splits left unread")
    for stage in detail.stages:
        total = "?" if stage.total_splits is None else stage.total_splits
        click.echo(
            f"  {stage.stage_id}: {stage.lifecycle.value} ({stage.status.value}) "
            f"{stage.done_splits}/{total} splits"
        )


@click.command("reset")
@click.argument("dag_id")
@click.argument("run_id")
@click.option("--stage", "stage_id", required=True, help="The stage to recompute.")
@json_option
@direct_store_option
@store_url_option
def reset(
    dag_id: str,
    run_id: str,
    stage_id: str,
    as_json: bool,
    direct_store: bool,
    store_url: str | None,
) -> None:
    """Reset a stage and the stages downstream of it, so that they recompute.

    Their progress is forgotten (committed output stays); clear their tasks in Airflow next:
    they run from scratch, sinks with a declared slice replace it, the others append. Through
    Airflow's api-server like stop (--direct-store: on the coordination store, admin only).
    Exit 2 for an unknown run or stage, or while a stop with savepoint is in progress.
    """
    with run_actions(direct_store, store_url) as act:
        summary = act.reset(dag_id, run_id, stage_id)
    if as_json:
        _echo_json(summary.model_dump(mode="json"))
        return
    click.echo(
        f"{dag_id} {run_id}: reset stages {', '.join(summary.reset_stages)} of pipeline "
        f"{summary.pipeline_key}"
    )
    click.echo(f"next: {summary.next_step}")
