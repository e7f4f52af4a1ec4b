"""Where ``finalckpt stop | resume | reset | status`` act: through Airflow's api-server (the
default: the plugin's REST routes, so Airflow's roles decide and every change is in Airflow's
audit log), or, with the admin flag ``--direct-store``, on the coordination store itself
(needs the store's credentials; no role is checked and Airflow's audit log records nothing).
Both answer the same models, so the commands print the same either way.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import click

from airflow_finalckpt.cli._shared import (
    EXIT_ERROR,
    _engine,
    _fail,
    _resolve_store_url,
    _user_errors,
)
from airflow_finalckpt.control import PipelineControl, PipelineDetail, ResetSummary, StopSummary
from airflow_finalckpt.core.errors import FinalCheckpointError, StopRequestError
from airflow_finalckpt.core.model import StopMode, StopState

if TYPE_CHECKING:
    from airflow_finalckpt.cli.airflow_api import AirflowApi

direct_store_option = click.option(
    "--direct-store",
    is_flag=True,
    help="Admin only: act on the coordination store directly, not through Airflow's "
    "api-server: Airflow's roles are not checked and its audit log records nothing. Needs the "
    "store's credentials (--store-url or the configured store).",
)
WAIT_POLL_S = 0.5


def cli_user() -> str:
    """Who a direct change is recorded as (the REST routes record the Airflow user)."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in some containers
        return "cli"


class RunActions(Protocol):
    """What the commands do to a DAG run's pipeline."""

    def stop(self, dag_id: str, run_id: str, mode: StopMode) -> StopSummary:
        """Request a stop with drain or savepoint."""

    def wait_for_stop(self, dag_id: str, run_id: str, timeout_s: float) -> StopSummary:
        """Wait until the stop request is no longer REQUESTED."""

    def resume(self, dag_id: str, run_id: str) -> StopSummary:
        """Resume a suspended run."""

    def reset(self, dag_id: str, run_id: str, stage_id: str) -> ResetSummary:
        """Reset a stage and its downstream."""

    def describe(self, dag_id: str, run_id: str) -> PipelineDetail:
        """The run's state, stop request, stages and latest checkpoints."""


class RestActions:
    """Through the plugin's REST routes on Airflow's api-server."""

    def __init__(self, api: AirflowApi) -> None:
        self.api = api

    def stop(self, dag_id: str, run_id: str, mode: StopMode) -> StopSummary:
        """``POST .../stop``."""
        doc = self.api.change_run(dag_id, run_id, "stop", {"mode": mode.value})
        return StopSummary.model_validate(doc)

    def wait_for_stop(self, dag_id: str, run_id: str, timeout_s: float) -> StopSummary:
        """Poll the run until its stop request is no longer REQUESTED."""
        deadline = time.monotonic() + timeout_s
        while True:
            stop = self.describe(dag_id, run_id).summary.stop
            if stop is None:
                raise StopRequestError(f"DAG run {run_id!r} of DAG {dag_id!r} has no stop request")
            if stop.state is not StopState.REQUESTED:
                return stop
            if time.monotonic() >= deadline:
                raise StopRequestError(
                    f"the {stop.mode} stop of DAG run {run_id!r} did not complete within "
                    f"{timeout_s:g} s (savepoint {stop.savepoint_id} still in progress; it "
                    "completes at the running stages' next split-batch boundary)"
                )
            time.sleep(WAIT_POLL_S)

    def resume(self, dag_id: str, run_id: str) -> StopSummary:
        """``POST .../resume``."""
        return StopSummary.model_validate(self.api.change_run(dag_id, run_id, "resume"))

    def reset(self, dag_id: str, run_id: str, stage_id: str) -> ResetSummary:
        """``POST .../reset``."""
        doc = self.api.change_run(dag_id, run_id, "reset", {"stage_id": stage_id})
        return ResetSummary.model_validate(doc)

    def describe(self, dag_id: str, run_id: str) -> PipelineDetail:
        """``GET .../runs/{run_id}``."""
        return PipelineDetail.model_validate(self.api.run_detail(dag_id, run_id))


class DirectActions:
    """On the coordination store (``--direct-store``)."""

    def __init__(self, control: PipelineControl) -> None:
        self.control = control

    def stop(self, dag_id: str, run_id: str, mode: StopMode) -> StopSummary:
        """A stop request in the store, by ``cli:<os user>``."""
        return self.control.stop(dag_id, run_id, mode, requested_by=cli_user())

    def wait_for_stop(self, dag_id: str, run_id: str, timeout_s: float) -> StopSummary:
        """Poll the store (expiring timed-out savepoints)."""
        return self.control.wait_for_stop(dag_id, run_id, timeout_s=timeout_s)

    def resume(self, dag_id: str, run_id: str) -> StopSummary:
        """Mark the stop RESUMED in the store."""
        return self.control.resume(dag_id, run_id, requested_by=cli_user())

    def reset(self, dag_id: str, run_id: str, stage_id: str) -> ResetSummary:
        """Reset in the store."""
        from airflow_finalckpt.control import reset_stage

        return reset_stage(self.control, dag_id, run_id, stage_id, requested_by=cli_user())

    def describe(self, dag_id: str, run_id: str) -> PipelineDetail:
        """Read from the store."""
        return self.control.describe(dag_id, run_id, checkpoints=10)


@contextmanager
def control_of(store_url: str | None) -> Iterator[PipelineControl]:
    """A PipelineControl on the resolved store; every user error ends in one line, exit 2."""
    from airflow_finalckpt.config import load_settings
    from airflow_finalckpt.storage import CheckpointStorage
    from airflow_finalckpt.store.migrate import require_schema

    with _user_errors(None, EXIT_ERROR):
        url, _ = _resolve_store_url(store_url)
    with _user_errors(url, EXIT_ERROR):
        settings = load_settings({"store_url": url})
        engine = _engine(url)
        try:
            require_schema(engine)
            control = PipelineControl(
                engine, CheckpointStorage(settings.storage_uri, settings.storage_options)
            )
            try:
                yield control
            except FinalCheckpointError as exc:
                _fail(str(exc), EXIT_ERROR)
        finally:
            engine.dispose()


@contextmanager
def rest_api() -> Iterator[AirflowApi]:
    """The api-server client from Airflow's config; every error ends in one line, exit 2."""
    from airflow_finalckpt.cli.airflow_api import AirflowApi, api_settings

    with _user_errors(None, EXIT_ERROR):
        settings = api_settings()
    with AirflowApi(settings) as api:
        try:
            yield api
        except FinalCheckpointError as exc:
            _fail(str(exc), EXIT_ERROR)


@contextmanager
def run_actions(direct_store: bool, store_url: str | None) -> Iterator[RunActions]:
    """The actions of a command: over REST, or on the store with ``--direct-store``."""
    if direct_store:
        with control_of(store_url) as control:
            yield DirectActions(control)
        return
    if store_url is not None:
        _fail(
            "--store-url acts on the coordination store directly: add --direct-store (admin "
            "only: no Airflow role is checked, nothing is in Airflow's audit log), or leave it "
            "out to go through Airflow's api-server",
            EXIT_ERROR,
        )
    with rest_api() as api:
        yield RestActions(api)
