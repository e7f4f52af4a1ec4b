"""A network partition between the pipeline and its PostgreSQL store (issue 40 item 1).

The store runs in a network namespace behind a veth link (``faults/partition.py``) that the
test takes down: nothing answers, as when a network fails (not a refused connection). What must
hold: a call on an open connection fails within the connection's bounds instead of waiting for
the kernel's ~15 minute retransmission limit; the server drops the vanished client's session
(and its pipeline row lock) once the link is back, so a retry is not blocked; and a fake
pipeline whose store is cut at a batch record, a checkpoint's completion, a sink commit and a
close recovers exactly once (``faults.external`` ``store-partition`` scenarios).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from airflow_finalckpt.store.engine import make_engine
from faults.external import (
    PARTITION_CASES,
    PartitionCase,
    execute_scenario,
    store_partition_scenario,
)
from faults.partition import PartitionedPostgres, partition_unavailable
from faults.runs import Environment
from faults.worker import FAKE, WorkerHandle

pytestmark = pytest.mark.slow

#: Longer than the connection bounds (tcp_user_timeout 30 s, keepalives 10 + 3 x 5 s) with
#: room for a loaded machine; far below the 15 minutes an unbounded call would wait.
HANG_GUARD_S = 120.0


def require_partition() -> None:
    reason = partition_unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true" or os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"required here, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerHandle]:
    handle = WorkerHandle(FAKE, str(tmp_path_factory.mktemp("workers") / "worker.out"), spare=True)
    try:
        yield handle
    finally:
        handle.close()


def in_thread(call: object, guard: float) -> tuple[BaseException | None, float, bool]:
    """Run ``call`` in a thread: (its exception, seconds, whether it ended within ``guard``)."""
    outcome: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:  # the outcome under test
            outcome[0] = exc

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(guard)
    return outcome[0], time.monotonic() - start, not thread.is_alive()


def test_a_call_during_a_partition_fails_within_bounds_and_frees_its_lock() -> None:
    require_partition()
    with PartitionedPostgres() as server:
        engine = make_engine(server.admin_url)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE pipelines (key text PRIMARY KEY, n int)"))
            conn.execute(text("INSERT INTO pipelines VALUES ('p', 0)"))
        held = engine.connect()
        transaction = held.begin()
        held.execute(text("SELECT n FROM pipelines WHERE key = 'p' FOR UPDATE"))
        server.cut()

        def update_and_commit() -> None:
            held.execute(text("UPDATE pipelines SET n = n + 1 WHERE key = 'p'"))
            transaction.commit()

        error, seconds, ended = in_thread(update_and_commit, HANG_GUARD_S)
        assert ended, f"a store call hung for {HANG_GUARD_S:g} s during a partition"
        assert error is not None and "OperationalError" in type(error).__name__, error
        print(f"call failed {seconds:.1f} s into the partition: {str(error).splitlines()[0]}")
        server.restore()

        # The server must drop the vanished session and its row lock: a retry gets the lock.
        other = make_engine(server.admin_url)

        def lock_again() -> None:
            with other.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '90s'"))
                conn.execute(text("SELECT n FROM pipelines WHERE key = 'p' FOR UPDATE"))
                conn.execute(text("UPDATE pipelines SET n = n + 10 WHERE key = 'p'"))

        error, seconds, ended = in_thread(lock_again, HANG_GUARD_S)
        assert ended and error is None, error
        print(f"the retry got the row lock {seconds:.1f} s after the link was back")
        with other.connect() as conn:  # the cut transaction never committed
            assert conn.execute(text("SELECT n FROM pipelines")).scalar_one() == 10
        other.dispose()
        held.invalidate()
        engine.dispose()


@pytest.mark.parametrize("case", PARTITION_CASES, ids=lambda c: c.name.replace(" ", "_"))
def test_a_pipeline_recovers_exactly_once_from_a_store_partition(
    tmp_path: Path, worker: WorkerHandle, case: PartitionCase
) -> None:
    require_partition()
    with PartitionedPostgres() as server:
        env = Environment(tmp_path, store="postgres", pg_admin_url=server.admin_url)
        env.prepare(spark=False)
        try:
            report = execute_scenario(env, store_partition_scenario(0, server, case), worker)
        finally:
            env.cleanup()
        assert len(server.cuts) == 1 and server.cuts[0][1] is not None
        restored = server.cuts[0][1]
    first = report.attempts[0]
    assert first.status in ("failed", "completed"), first
    if case.seconds > 30:  # past tcp_user_timeout: the attempt must fail, not wait it out
        assert first.status == "failed" and first.error_type == "OperationalError", first
    assert report.problems() == [], report.problems()
    verdict = report.verdict
    assert verdict is not None and verdict.rows
    assert (verdict.lost, verdict.duplicated, verdict.wrong) == (0, 0, 0)
    assert (verdict.orphaned, verdict.leaked, verdict.pending) == ([], [], [])
    assert report.completed
    print(
        f"{case.name}: attempt 1 {first.status}; recovered "
        f"{report.ended_at - restored:.1f} s after the link was back"
    )
