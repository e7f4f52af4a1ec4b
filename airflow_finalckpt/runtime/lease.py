"""The attempt lease: how the coordinator knows that a running stage's attempt is gone.

A running attempt renews its lease at its start and then every third of the lease from a
daemon thread (a long Spark batch keeps it alive; a SIGKILLed worker stops renewing), and ends
it when the attempt fails with an error the task will report (``release_attempt``), so the
pending checkpoints that wait for it are answered from its durable progress at once instead of
after the lease (``core.plan.attempt_gone``, docs/protocol.md).
"""

from __future__ import annotations

import threading
from types import TracebackType

from airflow_finalckpt.core.errors import StaleEpochError
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.runtime.values import Log


class AttemptLease:
    """Keep attempt ``epoch`` of ``stage_id`` alive while the ``with`` block runs; a block that
    raises (except StaleEpochError: a newer attempt owns the stage) releases it.
    """

    def __init__(
        self,
        coordinator: CoordinatorPort,
        stage_id: str,
        epoch: int,
        lease_s: float,
        log: Log,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"attempt_lease_s must be > 0 seconds, got {lease_s!r}")
        self.coordinator = coordinator
        self.stage_id = stage_id
        self.epoch = epoch
        self.lease_s = float(lease_s)
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _renew(self) -> bool:
        """One renewal; False once the attempt is not the running one (finished, fenced)."""
        try:
            return self.coordinator.renew_lease(self.stage_id, self.epoch, self.lease_s)
        except Exception as exc:  # a store hiccup: the next renewal may pass, the lease holds
            self.log.info("stage %s: cannot renew the attempt lease: %s", self.stage_id, exc)
            return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 3) and self._renew():
            pass

    def __enter__(self) -> AttemptLease:
        self._renew()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"finalckpt-lease-{self.stage_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc is None or isinstance(exc, StaleEpochError):
            return
        try:
            answered = self.coordinator.release_attempt(self.stage_id, self.epoch)
        except Exception as release_error:  # the lease still expires; the task's error wins
            self.log.info(
                "stage %s: cannot release the failed attempt (epoch %d; its lease expires "
                "within %g s): %s",
                self.stage_id,
                self.epoch,
                self.lease_s,
                release_error,
            )
            return
        self.log.info(
            "stage %s: attempt epoch %d failed (%s): released; checkpoints no longer wait for it%s",
            self.stage_id,
            self.epoch,
            type(exc).__name__,
            " (answered from its durable progress)" if answered else "",
        )
