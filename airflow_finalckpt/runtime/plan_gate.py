"""The plan check's gate in front of every batch of an attempt (``core.plan_check``).

A transform whose plan is not split-local (an aggregate, window, dedup, global sort, limit or a
join of two batch inputs, not keyed by the split keys), or that ran a Spark action on its batch
on the driver (rule ``driver-action-on-batch``), runs all of the attempt's pending splits
as one batch, the plain job's semantics: finished stages are still skipped, sinks still commit
exactly once, a crash redoes the stage's unfinished splits. A fixed ``batch_size`` on such a
stage is refused with the reason and the ways out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from airflow_finalckpt.core.plan_check import (
    BatchingRefusedError,
    PlanCheck,
    Verdict,
    refuse_fixed_batches,
)
from airflow_finalckpt.runtime.batches import batch_key
from airflow_finalckpt.runtime.values import Batch, Log, StageLogic, StageSpec, ThroughputHints


def next_batch(index: int, pending: Sequence[str], size: int, output_read: bool) -> Batch:
    """The next batch: the first ``size`` of the ``pending`` splits."""
    splits = tuple(pending[:size])
    return Batch(
        index=index,
        key=batch_key(splits),
        splits=splits,
        last=size >= len(pending),
        output_read=output_read,
    )


class PlanGate:
    """Asks the stage logic for the plan check of each batch (if it has one: ``check_plan``)
    and cuts the batch to all pending splits when the plan needs the whole input.
    """

    def __init__(
        self,
        spec: StageSpec,
        logic: StageLogic,
        log: Log,
        hints: ThroughputHints | None,
        boundary: Callable[[], object],
    ) -> None:
        self.spec = spec
        self.logic = logic
        self.log = log
        self.hints = hints
        self.boundary = boundary
        #: The verdict of this attempt (None: nothing checked yet, or no check).
        self.plan: PlanCheck | None = None

    @property
    def whole_input(self) -> bool:
        """Whether this attempt runs its pending splits as one batch."""
        return self.plan is not None and self.plan.whole_input

    def check(self, batch: Batch) -> PlanCheck | None:
        """The logic's plan check of ``batch`` (None: the logic has none, or no frame)."""
        check = getattr(self.logic, "check_plan", None)
        if check is None:
            return None
        try:
            result: PlanCheck | None = check(batch)
        except Exception:
            self.boundary()  # a stale attempt stops with StaleEpochError (see the runner)
            raise
        return result

    def checked(self, batch: Batch, pending: Sequence[str]) -> Batch:
        """``batch``, or all ``pending`` splits as one batch when the transform's plan needs
        the whole input; a fixed ``batch_size`` is refused then (BatchingRefusedError).
        """
        check = self.check(batch)
        first = self.plan is None
        if check is None:
            return batch
        if not check.whole_input:
            if first:
                self.plan = check
                self._say(check, "")
            return batch
        fixed = self.spec.policy.fixed
        if fixed is not None:
            raise BatchingRefusedError(refuse_fixed_batches(self.spec.stage_id, fixed, check))
        self.plan = check
        if len(batch.splits) == len(pending):
            if first:
                self._say(check, f"; its {len(pending)} pending splits run as one batch")
            return batch
        self._say(
            check,
            f"; its {len(pending)} pending splits run as one batch (the plain job's result; "
            "split_keys=... or an incremental aggregation would let it batch)",
        )
        whole = next_batch(batch.index, pending, len(pending), batch.output_read)
        self.check(whole)  # the logic prepares the transform's frame of the whole batch
        return whole

    def _say(self, check: PlanCheck, tail: str) -> None:
        """The verdict in the task log and where ``finalckpt progress`` and the UI show it."""
        if check.verdict is not Verdict.SPLIT_LOCAL or tail:
            self.log.info("stage %s: %s%s", self.spec.stage_id, check.describe(), tail)
        note = getattr(self.hints, "note_plan", None)
        if note is not None:
            split_local = check.verdict is Verdict.SPLIT_LOCAL
            note(self.spec.stage_id, None if split_local else check.describe())
