"""The pipeline run state the UI, REST and CLI show: a stop wins over the stages' lifecycles, and a
stop with savepoint reads *suspended* only after every running stage has parked."""

from __future__ import annotations

import pytest

from airflow_finalckpt.control.states import PipelineRunState, run_state
from airflow_finalckpt.coordination import StopRequest
from airflow_finalckpt.core.model import StageLifecycle, StopMode, StopState

L = StageLifecycle


def stop(mode: StopMode, state: StopState) -> StopRequest:
    return StopRequest(
        request_id=1,
        mode=mode,
        state=state,
        savepoint_id=7,
        requested_by="user",
        requested_at=0.0,
        finished_at=None,
        failure_reason=None,
    )


@pytest.mark.parametrize(
    ("lifecycles", "stop_request", "expected"),
    [
        ((L.NOT_STARTED, L.NOT_STARTED), None, PipelineRunState.NOT_STARTED),
        ((L.CLOSED, L.RUNNING), None, PipelineRunState.RUNNING),
        ((L.CLOSED, L.CLOSED), None, PipelineRunState.FINISHED),
        (
            (L.CLOSED, L.RUNNING),
            stop(StopMode.SAVEPOINT, StopState.REQUESTED),
            PipelineRunState.STOPPING,
        ),
        # the savepoint completed, but enrich has not parked yet (Spark not released)
        (
            (L.CLOSED, L.RUNNING),
            stop(StopMode.SAVEPOINT, StopState.COMPLETED),
            PipelineRunState.STOPPING,
        ),
        (
            (L.CLOSED, L.SUSPENDED, L.NOT_STARTED),
            stop(StopMode.SAVEPOINT, StopState.COMPLETED),
            PipelineRunState.SUSPENDED,
        ),
        ((L.RUNNING,), stop(StopMode.DRAIN, StopState.REQUESTED), PipelineRunState.DRAINING),
        ((L.CLOSED,), stop(StopMode.DRAIN, StopState.COMPLETED), PipelineRunState.DRAINED),
        # a failed or resumed stop no longer shapes the state
        (
            (L.CLOSED, L.RUNNING),
            stop(StopMode.SAVEPOINT, StopState.FAILED),
            PipelineRunState.RUNNING,
        ),
        (
            (L.CLOSED, L.RUNNING),
            stop(StopMode.SAVEPOINT, StopState.RESUMED),
            PipelineRunState.RUNNING,
        ),
    ],
)
def test_run_state(
    lifecycles: tuple[StageLifecycle, ...],
    stop_request: StopRequest | None,
    expected: PipelineRunState,
) -> None:
    assert run_state(lifecycles, stop_request) is expected
