"""The deployment's generated signing key (issue 37) is one key per store, whoever asks first:
workers that start sealing code at the same moment (several Celery workers, several
KubernetesExecutor pods) all get the value that won the insert, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from airflow_finalckpt.store import deployment_secrets
from airflow_finalckpt.store.deployment_secrets import (
    CODE_SIGNING_KEY,
    ensure_secret,
    stored_secret,
)
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

WORKERS = 6


def test_concurrent_first_callers_share_one_generated_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = [make_engine(store_url) for _ in range(WORKERS)]
    ensure_schema(engines[0])
    assert stored_secret(engines[0], CODE_SIGNING_KEY) is None
    start, seen = threading.Barrier(WORKERS), []
    all_read = threading.Barrier(WORKERS, timeout=60)

    def read_then_wait(engine: object, name: str) -> str | None:
        found = stored_secret(engine, name)  # type: ignore[arg-type]
        all_read.wait()  # every worker found none before any of them inserts: the race
        return found

    monkeypatch.setattr(deployment_secrets, "stored_secret", read_then_wait)

    def worker(index: int) -> None:
        start.wait()
        seen.append(ensure_secret(engines[index], CODE_SIGNING_KEY))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(seen) == WORKERS and len(set(seen)) == 1, seen
        assert stored_secret(engines[0], CODE_SIGNING_KEY) == seen[0]
        assert len(seen[0]) >= 43  # 256 random bits, url-safe base64
    finally:
        for engine in engines:
            engine.dispose()
