"""Measured batch throughput kept beside the checkpoints, shared by the runs of one scope.

A stage's next attempt, and the next DAG run of the same stage, size their first batch from what
was measured instead of guessing again. A hint is advisory: unreadable or foreign content is
ignored (the stage sizes its first batch cold: ``core.batching.cold_throughput``), and losing it
costs one cold batch, never correctness.
"""

from __future__ import annotations

import json
import logging

from airflow_finalckpt.core.batching import Throughput
from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.storage.checkpoint_storage import CheckpointStorage

log = logging.getLogger(__name__)


#: Per pipeline: the latest batch throughput of each stage, for ``finalckpt progress``.
BATCHES_DIR = "batches"
#: ... and beside it, how the plan check batches the stage.
PLAN_SUFFIX = ".plan.json"


class StorageThroughputHints:
    """``<storage root>/=hints/<scope>/<stage_id>.json``; scope: the DAG id or pipeline key.

    With ``pipeline_key`` every save is also written to ``<pipeline>/batches/<stage_id>.json``,
    where ``finalckpt progress`` shows it.
    """

    def __init__(
        self, storage: CheckpointStorage, scope: str, pipeline_key: str | None = None
    ) -> None:
        self.storage = storage
        self.scope = scope
        self.pipeline_key = pipeline_key

    def load(self, stage_id: str) -> Throughput | None:
        """The stage's last stored throughput; None if there is none or it is unreadable."""
        try:
            return _parse(self.storage.read_hint(self.scope, stage_id))
        except (FinalCheckpointError, ValueError) as exc:
            log.warning("ignoring the batch throughput hint of stage %s: %s", stage_id, exc)
            return None

    def save(self, stage_id: str, throughput: Throughput) -> None:
        """Store the stage's throughput for the next run; a failure is only logged (advisory)."""
        try:
            doc = json.dumps(throughput.to_dict(), sort_keys=True).encode()
            self.storage.write_hint(self.scope, stage_id, doc)
            if self.pipeline_key is not None:
                self.storage.write_state(
                    self.pipeline_key, f"{BATCHES_DIR}/{stage_id}.json", doc, name=stage_id
                )
        except FinalCheckpointError as exc:  # advisory: never fails a batch
            log.warning("cannot save the batch throughput hint of stage %s: %s", stage_id, exc)

    def note_plan(self, stage_id: str, text: str | None) -> None:
        """Keep how the plan check batches the stage (``core.plan_check``; None: split-local,
        nothing to say) where ``finalckpt progress`` and the UI show it; a failure is only
        logged.
        """
        if self.pipeline_key is None:
            return
        try:
            doc = json.dumps({"plan": text}).encode()
            self.storage.write_state(
                self.pipeline_key, f"{BATCHES_DIR}/{stage_id}{PLAN_SUFFIX}", doc, name=stage_id
            )
        except FinalCheckpointError as exc:
            log.warning("cannot note the batch plan of stage %s: %s", stage_id, exc)


def read_batch_throughput(
    storage: CheckpointStorage, pipeline_key: str, stage_id: str
) -> Throughput | None:
    """The latest measured batch throughput of a pipeline's stage (None: none recorded)."""
    try:
        return _parse(storage.read_file(pipeline_key, f"{BATCHES_DIR}/{stage_id}.json"))
    except (FinalCheckpointError, ValueError):
        return None


def read_batch_plan(storage: CheckpointStorage, pipeline_key: str, stage_id: str) -> str | None:
    """How the plan check batches a pipeline's stage, in words (None: not noted)."""
    try:
        data = storage.read_file(pipeline_key, f"{BATCHES_DIR}/{stage_id}{PLAN_SUFFIX}")
        plan = None if data is None else json.loads(data)["plan"]
        return None if plan is None else str(plan)
    except (FinalCheckpointError, ValueError, KeyError, TypeError):
        return None


def _parse(data: bytes | None) -> Throughput | None:
    return None if data is None else Throughput.from_dict(json.loads(data))
