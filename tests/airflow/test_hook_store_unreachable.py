"""A task starting while the coordination database is unreachable: the hook retries with
back-off (``[finalckpt] store_connect_retries`` / ``store_connect_backoff_s``), then fails with
one clear error, and leaves nothing behind (no cached engine, no checkpoint directory)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_finalckpt.hooks import FinalCkptHook
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.store.connect import StoreUnreachableError

UNREACHABLE = "postgresql+psycopg://finalckpt:hunter2@127.0.0.1:1/coord"
MASKED = "postgresql+psycopg://finalckpt:***@127.0.0.1:1/coord"


@pytest.fixture
def unreachable_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    storage = tmp_path / "checkpoints"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", UNREACHABLE)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(storage))
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_RETRIES", "2")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_BACKOFF_S", "0.01")
    hook_module.dispose_engines()
    return storage


def test_the_hook_retries_then_fails_clearly_and_creates_nothing(
    unreachable_store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="airflow_finalckpt.store.connect")
    hook = FinalCkptHook()
    with pytest.raises(StoreUnreachableError) as info:
        hook.get_coordinator("orders.manual__1")
    message = str(info.value)
    assert message.startswith(f"cannot reach the coordination store {MASKED}: 3 attempts failed")
    assert "hunter2" not in message
    retries = [
        r.getMessage() for r in caplog.records if "is unreachable (attempt" in r.getMessage()
    ]
    assert len(retries) == 2, retries
    assert "attempt 1 of 3" in retries[0] and "attempt 2 of 3" in retries[1]
    assert not unreachable_store.exists()  # no checkpoint storage touched
    assert not any(url == UNREACHABLE for _pid, url in hook_module._ENGINES)  # nothing cached


def test_shared_engine_reports_each_retry(unreachable_store: Path) -> None:
    seen: list[tuple[int, float]] = []
    with pytest.raises(StoreUnreachableError, match="2 attempts failed"):
        hook_module.shared_engine(
            UNREACHABLE,
            retries=1,
            backoff_s=0.01,
            on_retry=lambda attempt, _error, delay: seen.append((attempt, delay)),
        )
    assert seen == [(1, 0.01)]
    assert hook_module._ENGINES == {}
