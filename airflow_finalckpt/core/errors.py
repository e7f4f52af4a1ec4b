"""Errors of the protocol core.

Every error a user can cause carries a message that names what is wrong and what to do, so the
CLI, the API server and the operators can show it as is.
"""

from __future__ import annotations


class FinalCheckpointError(Exception):
    """Base class of every error raised by airflow-finalckpt."""


class InvalidGraphError(FinalCheckpointError):
    """The pipeline graph itself is malformed (cycle, duplicate or unknown stage id)."""


class IllegalGraphChangeError(FinalCheckpointError):
    """Restoring a checkpoint into the current graph would break a restore rule.

    ``stage_id`` and ``rule`` name the offending stage and the rule, so callers can show both.
    """

    def __init__(self, stage_id: str, rule: str, detail: str) -> None:
        self.stage_id = stage_id
        self.rule = rule
        super().__init__(f"stage {stage_id!r} violates restore rule {rule!r}: {detail}")


class MetadataError(FinalCheckpointError):
    """Checkpoint metadata cannot be read: missing, truncated, corrupt or of an unknown version."""


class UnsupportedMetadataVersionError(MetadataError):
    """The metadata was written by a newer airflow-finalckpt than this one."""


class StorageError(FinalCheckpointError):
    """Checkpoint storage refused an operation (bad path, traversal attempt, I/O failure)."""


class UnsafePathError(StorageError):
    """A pipeline key, run id or path would escape the configured checkpoint storage root."""


class CoordinationError(FinalCheckpointError):
    """A coordinator transition was refused."""


class UnknownPipelineError(CoordinationError):
    """No pipeline with that key is registered in the coordination store."""


class UnknownStageError(CoordinationError):
    """The stage id is not part of the pipeline's registered graph."""


class UnknownCheckpointError(CoordinationError):
    """No checkpoint with that id exists for the pipeline."""


class StaleEpochError(CoordinationError):
    """An acknowledgement or commit came from a stage attempt that has been superseded.

    Airflow can run two attempts of one task at once (zombies); only the newest epoch may act.
    """

    def __init__(self, stage_id: str, epoch: int, current: int) -> None:
        self.stage_id = stage_id
        self.epoch = epoch
        self.current = current
        super().__init__(
            f"stage {stage_id!r}: attempt epoch {epoch} is stale (current epoch is {current}); "
            "a newer attempt of this stage owns it now, this attempt must stop"
        )


class CheckpointNotPendingError(CoordinationError):
    """An acknowledgement or decline arrived for a checkpoint that is no longer pending."""


class IllegalTransitionError(CoordinationError):
    """The requested transition is not allowed from the stage's or pipeline's current state."""


class StopRequestError(CoordinationError):
    """A stop / resume request cannot be accepted (already stopping, finished, drained...)."""


class ConfigurationError(FinalCheckpointError):
    """The store URL or checkpoint storage configuration is missing or malformed."""


class ForeignCheckpointError(FinalCheckpointError):
    """The checkpoint or savepoint belongs to another pipeline."""


class DrainedSavepointError(FinalCheckpointError):
    """A drained savepoint cannot be resumed or restored: its windows already fired."""


class UnknownRunError(CoordinationError):
    """No pipeline run is known for this Airflow DAG run (no stage task of it has started)."""


class StageDefinitionError(FinalCheckpointError):
    """A stage is defined wrongly in the DAG (no transform, no splits, unknown primary input)."""


class InvalidStageArgumentError(StageDefinitionError, ValueError):
    """A stage operator argument is invalid (caught when the DAG file is parsed); a ValueError
    too, as Python's convention for a bad argument value.
    """


class InvalidRunConfError(FinalCheckpointError):
    """A DAG run conf value of airflow-finalckpt is malformed (e.g. ``allow_drop_stages``)."""


class RecomputeRefusedError(FinalCheckpointError):
    """A cleared, committed stage cannot recompute without appending to a sink that declares
    no slice (``core.rerun.recompute_refusal`` names the ways out).
    """


class PipelineDrivenError(FinalCheckpointError):
    """Another DAG run drives the pipeline (``core.driving``): this run may not start a stage
    attempt (it would fence that run's attempts and be fenced back).
    """


class SplitListChangedError(FinalCheckpointError):
    """A finished stage declares another split list than the one it finished: new input
    would be skipped if its finished output were re-published.
    """


class SourceRangeBusyError(FinalCheckpointError):
    """Another pipeline run holds an uncommitted range of the same incremental source: this
    run may read only after that range committed (transient: a retry may find it committed).
    """


class SourceRefusedError(FinalCheckpointError):
    """An incremental source cannot take its range as documented (an overwrite or delete
    snapshot, a rewritten table history, a cursor moved behind the run's back).
    """


#: Errors that a retry cannot fix: the DAG, the conf or the savepoint must change first.
#: Everything else (database or storage I/O, a stale attempt, a stop in progress) may be
#: transient and keeps Airflow's retries.
PERMANENT_ERRORS: tuple[type[FinalCheckpointError], ...] = (
    InvalidGraphError,
    IllegalGraphChangeError,
    StageDefinitionError,
    InvalidRunConfError,
    UnsafePathError,
    MetadataError,
    ForeignCheckpointError,
    DrainedSavepointError,
    RecomputeRefusedError,
    PipelineDrivenError,
    SplitListChangedError,
    SourceRefusedError,
)


def is_permanent(exc: BaseException) -> bool:
    """Whether ``exc`` fails the same way on every retry (bad restore path, illegal graph
    change, drained savepoint, bad DAG or stage definition): the task should fail at once.
    """
    return isinstance(exc, PERMANENT_ERRORS)


class UnknownDagError(FinalCheckpointError):
    """Airflow does not know the DAG (not parsed yet, or a typo)."""
