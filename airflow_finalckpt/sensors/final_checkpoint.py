"""A sensor that gates any task on a stage's committed output."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import UnknownPipelineError, UnknownStageError
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.hooks.finalckpt import DEFAULT_CONN_ID, FinalCkptHook
from airflow_finalckpt.triggers.final_checkpoint import (
    STATUS_CLOSED,
    STATUS_TIMEOUT,
    StageClosedTrigger,
    stage_view,
)

if TYPE_CHECKING:
    from airflow.sdk import Context


class FinalCheckpointSensor(BaseSensorOperator):
    """Waits until a stage's final checkpoint committed its output (the stage is CLOSED).

    Succeeds with the id of the checkpoint the stage closed on (the task's XCom return value).
    By default it defers to the triggerer (no worker slot while waiting); ``deferrable=False``
    pokes in a worker (``mode="poke"`` or ``"reschedule"``). A pipeline or stage that is not
    registered yet is waited for, since the sensor may start before the pipeline's DAG run.

    :param pipeline_key: the pipeline's key in the coordination store (templated).
    :param stage_id: the stage to wait for (templated).
    :param finalckpt_conn_id: connection of the coordination store (see FinalCkptHook).
    :param deferrable: wait in the triggerer (default) instead of a worker.
    :param poke_interval: seconds (or a ``timedelta``) between checks.
    """

    template_fields: Sequence[str] = ("pipeline_key", "stage_id", "finalckpt_conn_id")
    ui_color = "#d7ecd9"

    def __init__(
        self,
        *,
        pipeline_key: str,
        stage_id: str,
        finalckpt_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = True,
        poke_interval: timedelta | float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id
        self.finalckpt_conn_id = finalckpt_conn_id
        self.deferrable = deferrable
        self._reported: str | None = None

    def _what(self) -> str:
        return f"stage {self.stage_id!r} of pipeline {self.pipeline_key!r}"

    def _hook(self) -> FinalCkptHook:
        return FinalCkptHook(finalckpt_conn_id=self.finalckpt_conn_id)

    def _closed_checkpoint(self, hook: FinalCkptHook) -> int | None:
        coordinator = Coordinator(hook.get_engine(), self.pipeline_key)
        try:
            view = stage_view(coordinator, self.stage_id)
        except (UnknownPipelineError, UnknownStageError) as exc:
            self._report(f"not registered yet ({exc})")
            return None
        if view.lifecycle is StageLifecycle.CLOSED:
            assert view.closed_checkpoint_id is not None
            return view.closed_checkpoint_id
        self._report(f"is {view.lifecycle.value}")
        return None

    def _report(self, state: str) -> None:
        if state != self._reported:
            self._reported = state
            self.log.info("waiting for %s to close: %s", self._what(), state)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """Done once the stage (or pipeline) closed; its XCom is the closing checkpoint id."""
        checkpoint_id = self._closed_checkpoint(self._hook())
        if checkpoint_id is None:
            return False
        self.log.info("%s closed on checkpoint %d", self._what(), checkpoint_id)
        return PokeReturnValue(is_done=True, xcom_value=checkpoint_id)

    def execute(self, context: Context) -> Any:
        """Poke, or defer to the trigger; a timeout names what it waited for and last saw."""
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout as exc:
                raise AirflowSensorTimeout(
                    f"FinalCheckpointSensor timed out after {self.timeout:g} s waiting for "
                    f"{self._what()} to close (its final checkpoint committed); last seen: "
                    f"{self._reported or 'nothing'}. {exc}"
                ) from exc
        hook = self._hook()
        checkpoint_id = self._closed_checkpoint(hook)
        if checkpoint_id is not None:
            self.log.info("%s closed on checkpoint %d", self._what(), checkpoint_id)
            return checkpoint_id
        self.defer(
            trigger=StageClosedTrigger(
                pipeline_key=self.pipeline_key,
                stage_id=self.stage_id,
                store_url=hook.get_settings().store_url,
                poll_interval=self.poke_interval,
                timeout=self.timeout,
                finalckpt_conn_id=self.finalckpt_conn_id,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> int:
        """Resume after the trigger fired: the checkpoint id, or a clear failure."""
        if not isinstance(event, dict):
            raise AirflowException(
                f"waiting for {self._what()} ended without an event from the triggerer "
                f"(got {event!r})"
            )
        status = event.get("status")
        if status == STATUS_CLOSED:
            checkpoint_id = int(event["checkpoint_id"])
            self.log.info("%s closed on checkpoint %d", self._what(), checkpoint_id)
            return checkpoint_id
        message = event.get("message") or f"unexpected event {event!r}"
        if status == STATUS_TIMEOUT:
            raise AirflowSensorTimeout(f"FinalCheckpointSensor {message}")
        raise AirflowException(
            f"FinalCheckpointSensor: waiting for {self._what()} failed: {message}"
        )
