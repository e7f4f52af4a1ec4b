"""Triggers that wait, in Airflow's triggerer, for a stage's final checkpoint or its resume.

A finished stage holds no worker slot while it waits for the checkpoint that lets it close
(waiting is the triggerer's job, not a worker's). Its task defers to ``FinalCheckpointTrigger``,
which polls the coordination store and resumes the task once the stage may close. A stage
suspended by a stop with savepoint defers to ``StageResumeTrigger`` until the run is resumed.
Any other task can wait for a stage's committed output with ``StageClosedTrigger`` (see
FinalCheckpointSensor).

All triggers run in the triggerer, which has no task context: they reach the store with
``make_engine(store_url)`` directly, never through Airflow's metadata database, and every
blocking database call runs in a worker thread (``asyncio.to_thread``), never on the event loop.
Waiters of one pipeline share one read of the store per poll interval (``triggers.snapshots``):
only a waiter that read gives something to do asks the coordinator, which decides again.
Their kwargs are plain JSON values, so they serialize into the trigger table (where Airflow
encrypts them) and are rebuilt from ``serialize()`` after a triggerer restart.

Events (a dict payload; every one carries ``pipeline_key`` and ``stage_id``):

- ``{"status": "closable", "checkpoint_id": N}``: the stage may close on checkpoint N;
- ``{"status": "resumed", "reason": ...}``: (StageResumeTrigger) the suspended run was resumed
  or its savepoint failed; the stage continues;
- ``{"status": "closed", "checkpoint_id": N}``: the stage is CLOSED, its output committed;
- ``{"status": "error", "message": ..., "error_type": ...}``: waiting makes no sense any more
  (unknown pipeline or stage, reset stage, stale attempt, unreachable or newer store...);
- ``{"status": "timeout", "message": ...}``: the trigger's own deadline passed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_fixed,
)

from airflow_finalckpt.config import CONNECTION_ID as DEFAULT_CONN_ID
from airflow_finalckpt.config import MASK, load_settings, mask_storage_options, mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import (
    ConfigurationError,
    UnknownPipelineError,
    UnknownStageError,
)
from airflow_finalckpt.core.model import StageLifecycle, StopMode, StopState
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.views import PipelineSnapshot, StageView, StopRequest
from airflow_finalckpt.hooks.finalckpt import FinalCkptHook, shared_engine
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.triggers.snapshots import shared_snapshot

STATUS_CLOSABLE = "closable"
STATUS_RESUMED = "resumed"
STATUS_CLOSED = "closed"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"

#: Consecutive transient store errors (lost connection, locked database) a trigger rides out
#: before it gives up with an error event.
TRANSIENT_ERROR_LIMIT = 10


class _Poll:
    """What one poll found: an event payload to fire, or nothing yet."""

    __slots__ = ("payload",)

    def __init__(self, payload: dict[str, Any] | None = None) -> None:
        self.payload = payload


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def stage_view(coordinator: CoordinatorPort, stage_id: str) -> StageView:
    """The stage's view; UnknownPipelineError (not UnknownStageError) if the whole pipeline is
    missing, so messages say what is really wrong.
    """
    try:
        return coordinator.stage(stage_id)
    except UnknownStageError:
        coordinator.graph()  # raises UnknownPipelineError if the pipeline is not registered
        raise


def _deadline(timeout: float | None, deadline: float | None) -> float | None:
    if deadline is not None:
        return float(deadline)
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return time.time() + float(timeout)


class _StagePollingTrigger(BaseTrigger):
    """Polls the coordination store off the event loop until ``_poll`` returns an event."""

    def __init__(
        self,
        pipeline_key: str,
        stage_id: str,
        store_url: str,
        poll_interval: float = 1.0,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        finalckpt_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's is unannotated
        self.finalckpt_conn_id = finalckpt_conn_id
        if not poll_interval or poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id
        self.store_url = store_url
        self.poll_interval = float(poll_interval)
        self.timeout = None if timeout is None else float(timeout)
        # An absolute deadline survives a triggerer restart (a relative timeout would restart).
        self.deadline = _deadline(self.timeout, deadline)
        self._reported: str | None = None
        # A shared snapshot read before this trigger existed may predate what it waits on.
        self._created = time.monotonic()

    # ------------------------------------------------------------------ serialization

    def _kwargs(self) -> dict[str, Any]:
        return {
            "pipeline_key": self.pipeline_key,
            "stage_id": self.stage_id,
            "store_url": self.store_url,
            "poll_interval": self.poll_interval,
            "timeout": self.timeout,
            "deadline": self.deadline,
            "finalckpt_conn_id": self.finalckpt_conn_id,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The kwargs without credentials (Airflow keeps them in its trigger table): the
        triggerer resolves the masked store URL from its own settings (``_resolve_secrets``).
        """
        return f"{type(self).__module__}.{type(self).__qualname__}", self._masked_kwargs()

    def _resolve_secrets(self) -> Any:
        """Put back what ``serialize`` masked, from the settings of ``finalckpt_conn_id`` in
        this process (the triggerer's); refused if they name another store.
        """
        if MASK not in self.store_url:
            return None
        settings = FinalCkptHook(finalckpt_conn_id=self.finalckpt_conn_id).get_settings()
        if mask_url(settings.store_url) != self.store_url:
            raise ConfigurationError(
                f"the trigger's coordination store {self.store_url} is not this process's "
                f"({mask_url(settings.store_url)}): give the triggerer the workers' "
                f"[finalckpt] store_url / connection {self.finalckpt_conn_id!r}"
            )
        self.store_url = settings.store_url
        return settings

    def _masked_kwargs(self) -> dict[str, Any]:
        kwargs = self._kwargs()
        kwargs["store_url"] = mask_url(self.store_url)
        return kwargs

    def __repr__(self) -> str:
        # BaseTrigger's repr prints every kwarg: the store password would end up in logs.
        classpath, _ = self.serialize()
        text: str = self.repr(classpath, self._masked_kwargs())
        return text

    # ------------------------------------------------------------------ polling

    def _event(self, status: str, **fields: Any) -> dict[str, Any]:
        return {
            "status": status,
            "pipeline_key": self.pipeline_key,
            "stage_id": self.stage_id,
            **fields,
        }

    def _poll(self) -> _Poll:
        """One blocking look at the store (runs in a worker thread): the snapshot shared by
        this process's waiters answers "nothing to do yet" cheaply; anything else (or no
        snapshot) goes to the coordinator, which decides again.
        """
        snapshot = self._shared_snapshot()
        if snapshot is not None and self._idle(snapshot):
            return _Poll()
        return self._poll_coordinator()

    def _idle(self, snapshot: PipelineSnapshot) -> bool:
        """True (after reporting what the wait is on) if the snapshot shows nothing to do."""
        raise NotImplementedError

    def _poll_coordinator(self) -> _Poll:
        """The authoritative look, through the coordinator."""
        raise NotImplementedError

    def _shared_snapshot(self) -> PipelineSnapshot | None:
        """The pipeline's snapshot shared with every waiter of this process (at most one read
        per poll interval); None if the pipeline is not registered.
        """
        return shared_snapshot(
            self.store_url,
            self.pipeline_key,
            max_age=self.poll_interval,
            not_before=self._created,
        )

    def _where(self) -> str:
        return f"stage {self.stage_id!r} of pipeline {self.pipeline_key!r}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            await asyncio.to_thread(self._resolve_secrets)
        except Exception as exc:
            yield TriggerEvent(self._error(exc))
            return
        while True:
            try:
                found = await self._poll_riding_out_store_errors()
            except Exception as exc:
                context = None
                if _is_transient(exc):
                    context = (
                        f"coordination store {mask_url(self.store_url)} failed "
                        f"{TRANSIENT_ERROR_LIMIT} times in a row"
                    )
                yield TriggerEvent(self._error(exc, context))
                return
            if found.payload is not None:
                self.log.info("%s: %s", self._where(), found.payload)
                yield TriggerEvent(found.payload)
                return
            delay = self.poll_interval
            if self.deadline is not None:
                remaining = self.deadline - time.time()
                if remaining <= 0:
                    yield TriggerEvent(self._timeout_event())
                    return
                delay = min(delay, remaining)
            await asyncio.sleep(delay)

    async def _poll_riding_out_store_errors(self) -> _Poll:
        """One poll; a transient store error (lost connection, locked database) is retried
        every poll interval, up to ``TRANSIENT_ERROR_LIMIT`` attempts in a row, with a warning
        each time. Any other error, or the last transient one, is raised.
        """

        def warn(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            self.log.warning(
                "waiting for %s: coordination store error %d/%d (will retry): %s",
                self._where(),
                state.attempt_number,
                TRANSIENT_ERROR_LIMIT,
                exc,
            )

        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(TRANSIENT_ERROR_LIMIT),
            wait=wait_fixed(self.poll_interval),
            before_sleep=warn,
            reraise=True,
        )
        return await retrying(asyncio.to_thread, self._poll)

    def _error(self, exc: BaseException, context: str | None = None) -> dict[str, Any]:
        message = f"{type(exc).__name__}: {exc}"
        if context:
            message = f"{context}: {message}"
        self.log.error("waiting for %s failed: %s", self._where(), message)
        return self._event(STATUS_ERROR, message=message, error_type=type(exc).__name__)

    def _timeout_event(self) -> dict[str, Any]:
        waited = "" if self.timeout is None else f" after {self.timeout:g} s"
        return self._event(STATUS_TIMEOUT, message=f"timed out{waited} waiting for {self._what()}")

    def _what(self) -> str:
        raise NotImplementedError

    def _report(self, state: str) -> None:
        """Log what the wait is on, once per change (a poll runs every fraction of a second)."""
        if state != self._reported:
            self._reported = state
            self.log.info("waiting for %s: %s", self._what(), state)

    def _stale(self, epoch: int, current_epoch: int) -> _Poll:
        """The error event of an attempt a newer one took over (its epoch is not current)."""
        return _Poll(
            self._event(
                STATUS_ERROR,
                message=(
                    f"{self._where()}: this attempt (epoch {epoch}) is stale, epoch "
                    f"{current_epoch} owns the stage now"
                ),
                error_type="StaleEpochError",
            )
        )


class FinalCheckpointTrigger(_StagePollingTrigger):
    """Waits until a finished stage may close: a qualifying checkpoint completed.

    On every poll it first makes sure a checkpoint that can close the stage is in flight
    (``ensure_final_checkpoint``: an aborted final checkpoint, or one aborted with a failed
    savepoint, is replaced at once), then asks for the closable checkpoint.

    :param pipeline_key: the pipeline's key in the coordination store.
    :param stage_id: the finished stage.
    :param store_url: SQLAlchemy URL of the coordination store.
    :param poll_interval: seconds between polls.
    :param timeout: give up after this many seconds (``timeout`` event); None waits forever.
    :param storage_uri: checkpoint storage root; checkpoints that complete inside a poll write
        their ``_metadata`` there. None: resolved with ``load_settings()`` when the trigger is
        created (in the worker that defers) and serialized from then on.
    :param storage_options: fsspec options of the checkpoint storage.
    :param epoch: the deferring attempt's epoch; if a newer attempt took the stage over, the
        trigger ends with an error event instead of resuming a stale attempt.
    :param deadline: absolute end (epoch seconds) of the wait; set from ``timeout`` when None.
    """

    def __init__(
        self,
        pipeline_key: str,
        stage_id: str,
        store_url: str,
        poll_interval: float = 0.5,
        timeout: float | None = None,
        *,
        storage_uri: str | None = None,
        storage_options: dict[str, Any] | None = None,
        epoch: int | None = None,
        deadline: float | None = None,
        finalckpt_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__(
            pipeline_key,
            stage_id,
            store_url,
            poll_interval,
            timeout,
            deadline=deadline,
            finalckpt_conn_id=finalckpt_conn_id,
        )
        if storage_uri is None:
            settings = load_settings()
            storage_uri = settings.storage_uri
            if storage_options is None:
                storage_options = settings.storage_options
        self.storage_uri = storage_uri
        self.storage_options = dict(storage_options or {})
        self.epoch = epoch
        self._coordinator: CoordinatorPort | None = None

    def _kwargs(self) -> dict[str, Any]:
        kwargs = super()._kwargs()
        kwargs.update(
            storage_uri=self.storage_uri,
            storage_options=self.storage_options,
            epoch=self.epoch,
        )
        return kwargs

    def _masked_kwargs(self) -> dict[str, Any]:
        kwargs = super()._masked_kwargs()
        kwargs["storage_uri"] = mask_url(self.storage_uri)
        kwargs["storage_options"] = mask_storage_options(self.storage_options)
        return kwargs

    def _resolve_secrets(self) -> Any:
        settings = super()._resolve_secrets()
        masked = json.dumps(self.storage_options) + self.storage_uri
        if MASK in masked:
            settings = settings or load_settings()
            if mask_url(settings.storage_uri) != self.storage_uri:
                raise ConfigurationError(
                    f"the trigger's checkpoint storage {self.storage_uri} is not this "
                    f"process's ({mask_url(settings.storage_uri)})"
                )
            self.storage_uri = settings.storage_uri
            self.storage_options = dict(settings.storage_options)
        return settings

    def _what(self) -> str:
        return f"the final checkpoint of {self._where()}"

    def _get_coordinator(self) -> CoordinatorPort:
        if self._coordinator is None:
            storage = CheckpointStorage(self.storage_uri, self.storage_options)
            self._coordinator = Coordinator(
                shared_engine(self.store_url), self.pipeline_key, writer=storage
            )
        return self._coordinator

    def _idle(self, snapshot: PipelineSnapshot) -> bool:
        if not snapshot.final_checkpoint_idle(self.stage_id, self.epoch, time.time()):
            return False
        self._report_stop(snapshot.stop)
        return True

    def _poll_coordinator(self) -> _Poll:
        """The coordinator decides (and may trigger or abort checkpoints): the shared snapshot
        found something to do, or could not tell.
        """
        coordinator = self._get_coordinator()
        view = stage_view(coordinator, self.stage_id)
        if self.epoch is not None and view.epoch != self.epoch:
            return self._stale(self.epoch, view.epoch)
        if view.lifecycle is StageLifecycle.CLOSED:
            assert view.closed_checkpoint_id is not None
            return _Poll(self._event(STATUS_CLOSABLE, checkpoint_id=view.closed_checkpoint_id))
        if view.lifecycle is not StageLifecycle.FINISHED:
            return _Poll(
                self._event(
                    STATUS_ERROR,
                    message=(
                        f"{self._where()} is {view.lifecycle.value}, not FINISHED: there is no "
                        "final checkpoint to wait for (was the stage reset?)"
                    ),
                    error_type="IllegalTransitionError",
                )
            )
        coordinator.ensure_final_checkpoint(self.stage_id)
        checkpoint_id = coordinator.closable_checkpoint(self.stage_id)
        if checkpoint_id is not None:
            return _Poll(self._event(STATUS_CLOSABLE, checkpoint_id=checkpoint_id))
        self._report_stop(coordinator.stop_request())
        return _Poll()

    def _report_stop(self, stop: StopRequest | None) -> None:
        if stop is not None and stop.mode is StopMode.SAVEPOINT:
            # A finished stage rides out a suspension here (still no worker slot): the resume
            # triggers the checkpoint it closes on.
            self._report(f"run {stop.state.value.lower()} by a stop with savepoint")


class StageResumeTrigger(_StagePollingTrigger):
    """Waits while a stage is suspended by a stop with savepoint (no worker slot, no Spark).

    Fires ``{"status": "resumed", "reason": "resumed" | "stop failed"}`` once the run is resumed
    or the savepoint failed (the run then keeps running), so the task continues the stage from
    its durable progress in the same DAG run. Read-only: it never changes the store.

    :param epoch: the suspended attempt's epoch; a newer attempt taking over ends the wait with
        an error event.
    """

    def __init__(
        self,
        pipeline_key: str,
        stage_id: str,
        store_url: str,
        poll_interval: float = 1.0,
        timeout: float | None = None,
        *,
        epoch: int | None = None,
        deadline: float | None = None,
        finalckpt_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__(
            pipeline_key,
            stage_id,
            store_url,
            poll_interval,
            timeout,
            deadline=deadline,
            finalckpt_conn_id=finalckpt_conn_id,
        )
        self.epoch = epoch

    def _kwargs(self) -> dict[str, Any]:
        kwargs = super()._kwargs()
        kwargs["epoch"] = self.epoch
        return kwargs

    def _what(self) -> str:
        return f"the resume of {self._where()}"

    def _idle(self, snapshot: PipelineSnapshot) -> bool:
        if not snapshot.resume_idle(self.stage_id, self.epoch):
            return False
        assert snapshot.stop is not None
        self._report_suspended(snapshot.stop)
        return True

    def _poll_coordinator(self) -> _Poll:
        coordinator: CoordinatorPort = Coordinator(shared_engine(self.store_url), self.pipeline_key)
        view = stage_view(coordinator, self.stage_id)
        if self.epoch is not None and view.epoch != self.epoch:
            return self._stale(self.epoch, view.epoch)
        stop = coordinator.stop_request()
        if stop is None or stop.state in (StopState.RESUMED, StopState.FAILED):
            reason = (
                "stop failed"
                if stop is not None and stop.state is StopState.FAILED
                else ("resumed")
            )
            return _Poll(
                self._event(
                    STATUS_RESUMED,
                    reason=reason,
                    stop_request_id=stop.request_id if stop else None,
                    message=stop.failure_reason if stop else None,
                )
            )
        if stop.mode is StopMode.DRAIN:
            return _Poll(
                self._event(
                    STATUS_ERROR,
                    message=f"{self._where()} is suspended but the run is being drained",
                    error_type="IllegalTransitionError",
                )
            )
        self._report_suspended(stop)
        return _Poll()

    def _report_suspended(self, stop: StopRequest) -> None:
        state = "savepoint in progress" if stop.state is StopState.REQUESTED else "suspended"
        self._report(
            f"{state} (savepoint {stop.savepoint_id}, stop requested by "
            f"{stop.requested_by or 'unknown'})"
        )


class StageClosedTrigger(_StagePollingTrigger):
    """Waits until a stage is CLOSED: its final checkpoint completed and its output committed.

    Read-only: it never triggers checkpoints. A pipeline or stage that is not registered yet is
    waited for (the pipeline registers when its DAG run starts), so a sensor may start first.

    :param deadline: absolute end (epoch seconds) of the wait; set from ``timeout`` when None.
    """

    def _what(self) -> str:
        return f"{self._where()} to close (its final checkpoint committed)"

    def _idle(self, snapshot: PipelineSnapshot) -> bool:
        if not snapshot.closed_idle(self.stage_id):
            return False
        self._report(f"is {snapshot.stages[self.stage_id].lifecycle.value}")
        return True

    def _poll_coordinator(self) -> _Poll:
        coordinator: CoordinatorPort = Coordinator(shared_engine(self.store_url), self.pipeline_key)
        try:
            view = stage_view(coordinator, self.stage_id)
        except (UnknownPipelineError, UnknownStageError) as exc:
            self._report(f"not registered yet ({exc})")
            return _Poll()
        if view.lifecycle is StageLifecycle.CLOSED:
            assert view.closed_checkpoint_id is not None
            return _Poll(self._event(STATUS_CLOSED, checkpoint_id=view.closed_checkpoint_id))
        self._report(f"is {view.lifecycle.value}")
        return _Poll()
