"""The triggers against a real coordinator in a SQLite coordination store.

``run()`` is driven with asyncio exactly as the triggerer does (first event wins); the pipeline
is moved on by the test through the coordinator's own transitions, from a worker thread so the
trigger's event loop keeps running.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from airflow.models.trigger import Trigger
from airflow.sdk._shared.module_loading import import_string
from airflow.triggers.base import TriggerEvent

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.hooks.finalckpt import dispose_engines
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from airflow_finalckpt.triggers import (
    FinalCheckpointTrigger,
    StageClosedTrigger,
    StageResumeTrigger,
)
from airflow_finalckpt.triggers import final_checkpoint as trigger_module

KEY = "trigger-pipeline"
T = TypeVar("T")

pytestmark = pytest.mark.usefixtures("airflow_home")


# ---------------------------------------------------------------------------------- helpers


class Store:
    """A migrated SQLite coordination store plus checkpoint storage in a temp directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'coordination.db'}"
        self.storage_uri = str(tmp_path / "checkpoints")
        self.engine = make_engine(self.url)
        ensure_schema(self.engine)
        self.storage = CheckpointStorage(self.storage_uri)

    def coordinator(self, key: str = KEY) -> Coordinator:
        return Coordinator(self.engine, key, writer=self.storage)

    def final_trigger(self, stage_id: str, **kwargs: Any) -> FinalCheckpointTrigger:
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("timeout", 20)
        kwargs.setdefault("storage_uri", self.storage_uri)
        pipeline_key = kwargs.pop("pipeline_key", KEY)
        return FinalCheckpointTrigger(pipeline_key, stage_id, self.url, **kwargs)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path)
    yield s
    s.engine.dispose()
    dispose_engines()


def register(coordinator: Coordinator, *stages: Stage) -> None:
    coordinator.register(StageGraph.build(stages))


def finish(coordinator: Coordinator, stage_id: str, epoch: int) -> int | None:
    outcome = coordinator.finish(
        stage_id, epoch, StageSnapshot(end_of_data=EndOfData(manifest=[f"{stage_id}.parquet"]))
    )
    return outcome.eager_checkpoint_id


async def first_event(trigger: Any, timeout: float = 20) -> TriggerEvent:
    """The first event of ``run()``, as the triggerer takes it."""
    return await asyncio.wait_for(anext(trigger.run()), timeout)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def eventually(check: Callable[[], T | None], timeout: float = 10) -> T:
    """Poll a blocking check from a thread until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------- closable


def test_finished_stage_is_closable_on_its_eager_checkpoint(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("extract"), Stage("load", upstream=("extract",)))
    epoch = coordinator.start_attempt("extract").epoch
    eager = finish(coordinator, "extract", epoch)
    assert eager is not None

    event = run(first_event(store.final_trigger("extract", epoch=epoch)))

    assert event.payload == {
        "status": "closable",
        "checkpoint_id": eager,
        "pipeline_key": KEY,
        "stage_id": "extract",
    }
    # The checkpoint is a real, complete one: metadata in storage, stage still FINISHED (the
    # trigger only waits; closing is the task's job).
    info = coordinator.checkpoint(eager)
    assert info.state is CheckpointState.COMPLETED
    assert info.metadata_path is not None and Path(info.metadata_path).is_file()
    assert coordinator.stage("extract").lifecycle is StageLifecycle.FINISHED


def test_waits_while_the_final_checkpoint_is_pending(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("left"), Stage("right"))
    left = coordinator.start_attempt("left").epoch
    right = coordinator.start_attempt("right").epoch
    eager = finish(coordinator, "left", left)
    assert eager is not None
    assert coordinator.checkpoint(eager).state is CheckpointState.PENDING  # waits for "right"

    async def scenario() -> TriggerEvent:
        waiting = asyncio.ensure_future(first_event(store.final_trigger("left", epoch=left)))
        await asyncio.sleep(0.4)
        assert not waiting.done(), "closable before the eager checkpoint completed"
        outcome = await asyncio.to_thread(coordinator.record_batch, "right", right)
        assert outcome.completed == (eager,)
        return await waiting

    assert run(scenario()).payload["checkpoint_id"] == eager


def test_already_closed_stage_reports_its_checkpoint(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("only"))
    epoch = coordinator.start_attempt("only").epoch
    eager = finish(coordinator, "only", epoch)
    assert eager is not None
    coordinator.close("only", epoch, eager)

    event = run(first_event(store.final_trigger("only")))

    assert event.payload["status"] == "closable"
    assert event.payload["checkpoint_id"] == eager


# ---------------------------------------------------------------------------------- savepoints


def test_waits_for_savepoint_and_retriggers_after_it_is_aborted(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"), Stage("c"))
    a = coordinator.start_attempt("a").epoch
    c = coordinator.start_attempt("c").epoch
    stop = coordinator.request_stop(StopMode.SAVEPOINT, requested_by="test")
    savepoint = stop.savepoint_id
    assert savepoint is not None
    # "a" finishes while the savepoint waits: it acknowledges it, no eager checkpoint is
    # triggered (the stage waits for that exact savepoint).
    assert finish(coordinator, "a", a) is None

    async def scenario() -> TriggerEvent:
        waiting = asyncio.ensure_future(first_event(store.final_trigger("a", epoch=a)))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the trigger must wait while the savepoint is in progress"
        ids = [i.checkpoint_id for i in await asyncio.to_thread(coordinator.checkpoints)]
        assert ids == [savepoint], "nothing may be triggered while the savepoint runs"

        assert await asyncio.to_thread(coordinator.abort, savepoint, "test aborts it")
        # Only the trigger's ensure_final_checkpoint can trigger the replacement checkpoint.
        pending = await eventually(lambda: coordinator.pending_for("c"))
        assert not waiting.done()
        outcome = await asyncio.to_thread(coordinator.record_batch, "c", c)
        assert outcome.completed == tuple(pending)
        return await waiting

    event = run(scenario())

    assert event.payload["status"] == "closable"
    replacement = event.payload["checkpoint_id"]
    assert replacement > savepoint
    info = coordinator.checkpoint(replacement)
    assert info.kind is CheckpointKind.CHECKPOINT
    assert info.reason is TriggerReason.EAGER_FINAL
    assert coordinator.stop_request().state is StopState.FAILED  # type: ignore[union-attr]


def test_a_finished_stage_waits_through_a_suspension_and_closes_after_resume(
    store: Store,
) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"), Stage("c"))
    a = coordinator.start_attempt("a").epoch
    c = coordinator.start_attempt("c").epoch
    savepoint = coordinator.request_stop(StopMode.SAVEPOINT).savepoint_id
    finish(coordinator, "a", a)  # threshold: the first id after the savepoint

    async def scenario() -> TriggerEvent:
        waiting = asyncio.ensure_future(first_event(store.final_trigger("a", epoch=a)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        outcome = await asyncio.to_thread(coordinator.record_batch, "c", c)
        assert outcome.completed == (savepoint,)
        await asyncio.to_thread(coordinator.suspend, "c", c)
        await asyncio.sleep(0.3)
        assert not waiting.done(), "suspended: nothing can close the stage until the resume"
        await asyncio.to_thread(coordinator.resume, "bob")
        # c continues from its savepoint and answers the resume's checkpoint at its first batch
        c2 = (await asyncio.to_thread(coordinator.start_attempt, "c")).epoch
        await asyncio.to_thread(coordinator.record_batch, "c", c2)
        return await waiting

    event = run(scenario())

    assert event.payload["status"] == "closable"
    assert event.payload["checkpoint_id"] > savepoint  # the resume's eager checkpoint


def resume_trigger(store: Store, stage_id: str, **kwargs: Any) -> StageResumeTrigger:
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("timeout", 20)
    return StageResumeTrigger(KEY, stage_id, store.url, **kwargs)


def test_resume_trigger_waits_while_suspended_and_fires_on_resume(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"))
    a = coordinator.start_attempt("a").epoch
    coordinator.request_stop(StopMode.SAVEPOINT, "alice")
    coordinator.record_batch("a", a)
    coordinator.suspend("a", a)
    before = coordinator.stop_request()
    assert before is not None and before.state is StopState.COMPLETED

    async def scenario() -> TriggerEvent:
        waiting = asyncio.ensure_future(first_event(resume_trigger(store, "a", epoch=a)))
        await asyncio.sleep(0.4)
        assert not waiting.done()
        await asyncio.to_thread(coordinator.resume, "bob")
        return await waiting

    event = run(scenario())

    assert event.payload["status"] == "resumed"
    assert event.payload["reason"] == "resumed"
    assert event.payload["stop_request_id"] == before.request_id
    assert coordinator.stage("a").lifecycle is StageLifecycle.SUSPENDED  # read-only trigger


def test_resume_trigger_fires_when_the_savepoint_fails(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"), Stage("b"))
    a = coordinator.start_attempt("a").epoch
    coordinator.start_attempt("b")
    savepoint = coordinator.request_stop(StopMode.SAVEPOINT).savepoint_id
    assert savepoint is not None
    coordinator.record_batch("a", a)
    coordinator.suspend("a", a)  # b never answers: the savepoint is aborted

    async def scenario() -> TriggerEvent:
        waiting = asyncio.ensure_future(first_event(resume_trigger(store, "a", epoch=a)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await asyncio.to_thread(coordinator.abort, savepoint, "declined by b")
        return await waiting

    event = run(scenario())

    assert event.payload["status"] == "resumed"
    assert event.payload["reason"] == "stop failed"
    assert "declined by b" in event.payload["message"]


def test_resume_trigger_of_a_stale_attempt_is_an_error(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"))
    a = coordinator.start_attempt("a").epoch
    coordinator.request_stop(StopMode.SAVEPOINT)
    coordinator.record_batch("a", a)
    coordinator.suspend("a", a)
    coordinator.start_attempt("a")  # a retry took over (still suspended)

    event = run(first_event(resume_trigger(store, "a", epoch=a)))

    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "StaleEpochError"


def test_resume_trigger_round_trips_through_serialize(store: Store) -> None:
    trigger = resume_trigger(store, "a", epoch=7)
    classpath, kwargs = trigger.serialize()
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["epoch"] == 7


# ---------------------------------------------------------------------------------- errors


def test_unknown_pipeline_is_an_error_event(store: Store) -> None:
    event = run(first_event(store.final_trigger("extract", pipeline_key="no-such-pipeline")))

    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "UnknownPipelineError"
    assert "no-such-pipeline" in event.payload["message"]
    assert "not registered" in event.payload["message"]


def test_unknown_stage_is_an_error_event(store: Store) -> None:
    register(store.coordinator(), Stage("extract"))

    event = run(first_event(store.final_trigger("typo")))

    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "UnknownStageError"
    assert "'typo'" in event.payload["message"]


def test_stage_that_is_not_finished_is_an_error_event(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("extract"))
    epoch = coordinator.start_attempt("extract").epoch
    finish(coordinator, "extract", epoch)
    coordinator.reset_stage("extract")

    event = run(first_event(store.final_trigger("extract")))

    assert event.payload["status"] == "error"
    assert "NOT_STARTED, not FINISHED" in event.payload["message"]


def test_stale_attempt_is_an_error_event(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"), Stage("c"))
    a = coordinator.start_attempt("a").epoch
    coordinator.start_attempt("c")
    finish(coordinator, "a", a)
    newer = coordinator.start_attempt("a").epoch  # e.g. a retry took the stage over

    event = run(first_event(store.final_trigger("a", epoch=a)))

    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "StaleEpochError"
    assert f"epoch {newer} owns" in event.payload["message"]


def test_transient_store_errors_are_retried_then_reported(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    coordinator = store.coordinator()
    register(coordinator, Stage("only"))
    epoch = coordinator.start_attempt("only").epoch
    eager = finish(coordinator, "only", epoch)
    calls: list[int] = []
    real_poll = FinalCheckpointTrigger._poll

    def flaky(self: FinalCheckpointTrigger) -> Any:
        calls.append(1)
        if len(calls) <= 3:
            raise OperationalError("SELECT 1", {}, Exception("database is locked"))
        return real_poll(self)

    monkeypatch.setattr(FinalCheckpointTrigger, "_poll", flaky)
    event = run(first_event(store.final_trigger("only")))
    assert event.payload["checkpoint_id"] == eager
    assert len(calls) == 4

    monkeypatch.setattr(trigger_module, "TRANSIENT_ERROR_LIMIT", 2)
    calls.clear()
    event = run(first_event(store.final_trigger("only")))
    assert event.payload["status"] == "error"
    assert "failed 2 times in a row" in event.payload["message"]
    assert "database is locked" in event.payload["message"]


def test_timeout_event(store: Store) -> None:
    coordinator = store.coordinator()
    register(coordinator, Stage("a"), Stage("c"))
    a = coordinator.start_attempt("a").epoch
    coordinator.start_attempt("c")
    finish(coordinator, "a", a)  # its eager checkpoint waits for "c" forever

    started = time.monotonic()
    event = run(first_event(store.final_trigger("a", timeout=0.3)))

    assert time.monotonic() - started < 5
    assert event.payload["status"] == "timeout"
    assert "timed out after 0.3 s" in event.payload["message"]
    assert "'a'" in event.payload["message"]


# ---------------------------------------------------------------------------------- closed


def test_stage_closed_trigger_waits_for_close(store: Store) -> None:
    coordinator = store.coordinator()

    async def scenario() -> TriggerEvent:
        trigger = StageClosedTrigger(KEY, "only", store.url, poll_interval=0.05, timeout=20)
        waiting = asyncio.ensure_future(first_event(trigger))
        await asyncio.sleep(0.3)  # not even registered yet: the sensor may start first
        assert not waiting.done()
        await asyncio.to_thread(register, coordinator, Stage("only"))
        epoch = (await asyncio.to_thread(coordinator.start_attempt, "only")).epoch
        eager = await asyncio.to_thread(finish, coordinator, "only", epoch)
        await asyncio.sleep(0.3)
        assert not waiting.done(), "FINISHED is not CLOSED: output is not committed yet"
        assert eager is not None
        await asyncio.to_thread(coordinator.close, "only", epoch, eager)
        return await waiting

    event = run(scenario())

    assert event.payload == {
        "status": "closed",
        "checkpoint_id": 1,
        "pipeline_key": KEY,
        "stage_id": "only",
    }


def test_stage_closed_trigger_times_out(store: Store) -> None:
    trigger = StageClosedTrigger(KEY, "never", store.url, poll_interval=0.05, timeout=0.2)

    event = run(first_event(trigger))

    assert event.payload["status"] == "timeout"
    assert "'never'" in event.payload["message"]


# ---------------------------------------------------------------------------------- serialization


@pytest.mark.parametrize(
    "make",
    [
        lambda url: FinalCheckpointTrigger(
            "p", "s", url, 0.25, 30, storage_uri="/ckpt", storage_options={"a": 1}, epoch=3
        ),
        lambda url: FinalCheckpointTrigger("p", "s", url, storage_uri="memory://x"),
        lambda url: StageClosedTrigger("p", "s", url, poll_interval=2, timeout=60),
        lambda url: StageClosedTrigger("p", "s", url),
    ],
)
def test_serialize_round_trips_through_the_trigger_table(make: Callable[[str], Any]) -> None:
    url = "postgresql+psycopg://user:s3cret@db:5432/finalckpt"
    trigger = make(url)
    classpath, kwargs = trigger.serialize()

    assert json.loads(json.dumps(kwargs)) == kwargs, "kwargs must be plain JSON"
    # What the scheduler stores (Fernet-encrypted) and the triggerer rebuilds from.
    row = Trigger.from_object(trigger)
    rebuilt = import_string(row.classpath)(**row.kwargs)

    assert type(rebuilt) is type(trigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert classpath.startswith("airflow_finalckpt.triggers.final_checkpoint.")
    assert "s3cret" not in row.encrypted_kwargs
    assert "s3cret" not in json.dumps(row.kwargs)  # not even decrypted (issue 27)
    # The repr (logged by the triggerer) never shows the password.
    assert "s3cret" not in repr(rebuilt)
    assert "user:***@db" in repr(rebuilt)


def test_deadline_survives_serialization() -> None:
    trigger = StageClosedTrigger("p", "s", "sqlite:////tmp/x.db", timeout=60)
    _, kwargs = trigger.serialize()
    assert kwargs["deadline"] == pytest.approx(time.time() + 60, abs=5)

    time.sleep(0.05)
    rebuilt = StageClosedTrigger(**kwargs)
    assert rebuilt.deadline == kwargs["deadline"], "a restart must not extend the wait"


def test_storage_defaults_to_the_resolved_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "ckpt"))
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_OPTIONS", '{"auto_mkdir": true}')

    _, kwargs = FinalCheckpointTrigger("p", "s", "sqlite:////tmp/x.db").serialize()

    assert kwargs["storage_uri"] == str(tmp_path / "ckpt")
    assert kwargs["storage_options"] == {"auto_mkdir": True}


def test_invalid_poll_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        StageClosedTrigger("p", "s", "sqlite:////tmp/x.db", poll_interval=0)


def test_a_rebuilt_trigger_takes_the_store_password_from_its_own_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trigger table holds the masked URL; the triggerer puts the password back from its
    own settings of the same connection, and refuses settings naming another store."""
    url = "postgresql+psycopg://user:s3cret@db:5432/finalckpt"
    _, kwargs = StageClosedTrigger("p", "s", url).serialize()
    assert kwargs["store_url"] == "postgresql+psycopg://user:***@db:5432/finalckpt"
    assert kwargs["finalckpt_conn_id"] == "finalckpt_default"

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)
    rebuilt = StageClosedTrigger(**kwargs)
    rebuilt._resolve_secrets()
    assert rebuilt.store_url == url

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url.replace("@db:", "@other:"))
    with pytest.raises(ConfigurationError, match="is not this process's"):
        StageClosedTrigger(**kwargs)._resolve_secrets()
