"""A stage's declared split list and whether it changed since its progress was recorded.

Checkpoints keep a stage's finished split *ids* (not a bitmap over the declared order), so a
changed list never misreads progress; what the ids alone cannot tell is that the list itself
changed (splits added or removed since). The stage's progress records the fingerprint of the
list it declared (sha256 of its ids in declared order); a restored attempt declaring another
list is told how the two differ. Progress is never dropped: finished splits no longer declared
keep their committed output, declared splits not finished are processed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from airflow_finalckpt.core.errors import SplitListChangedError, StageDefinitionError
from airflow_finalckpt.core.metadata.envelope import json_sha256

#: The rule a finished stage whose declared split list changed breaks (named in its error).
FINISHED_SPLIT_LIST_RULE = "finished-stage-split-list-changed"


def split_list_fingerprint(splits: Sequence[str]) -> str:
    """The sha256 of the split ids in declared order (their canonical JSON array, as every
    fingerprint of the metadata: ASCII-only, so any Python string has one).
    """
    if isinstance(splits, str):
        raise TypeError("splits must be a sequence of split ids, not one string")
    return json_sha256(list(splits))


@dataclass(frozen=True)
class SplitListChange:
    """How a declared split list differs from the one the progress was recorded with:
    ``undeclared_finished`` finished splits are no longer declared (their output stays
    committed), ``pending`` declared splits are not finished (they will be processed).
    """

    undeclared_finished: int
    pending: int

    def describe(self, stage_id: str, since: str) -> str:
        """One warning line for the task log; ``since``: where the progress came from."""
        return (
            f"stage {stage_id}: split list changed since {since} (its "
            f"fingerprint differs): {self.undeclared_finished} finished split(s) are no longer "
            f"declared (their output stays committed, nothing is undone) and {self.pending} "
            "declared split(s) are not finished (they will be processed)"
        )


def split_list_change(
    recorded: str | None, declared: Sequence[str], finished: Collection[str]
) -> SplitListChange | None:
    """None when the list is unchanged or the recorded fingerprint is unknown (progress
    written before fingerprints were kept, or no progress); else how the lists differ.
    """
    if recorded is None or recorded == split_list_fingerprint(declared):
        return None
    wanted = set(declared)
    return SplitListChange(
        undeclared_finished=sum(1 for s in finished if s not in wanted),
        pending=sum(1 for s in wanted if s not in finished),
    )


#: The rule a started stage's changed split list breaks, and the argument that allows it.
LOST_SPLITS_RULE = "finished-splits-stay-declared"
ALLOW_ARGUMENT = "allow_split_list_change"
#: The split-list rules (part of the public API, with ``core.restore``'s graph-change rules).
SPLIT_LIST_RULES = (FINISHED_SPLIT_LIST_RULE, LOST_SPLITS_RULE)


class LostFinishedSplitsError(StageDefinitionError):
    """A started stage no longer declares splits it finished: resuming could process their
    data twice, the same on every try (permanent), until the list or the operator changes.
    """


def check_finished_splits_declared(
    stage_id: str, declared: Sequence[str], finished: Collection[str], since: str, allowed: bool
) -> None:
    """Refuse a resume whose split list lost finished splits unless the operator allows it."""
    wanted = set(declared)
    lost = sorted(s for s in finished if s not in wanted)
    if not lost or allowed:
        return
    shown = lost[:5] + (["..."] if len(lost) > 5 else [])
    raise LostFinishedSplitsError(
        f"stage {stage_id!r} violates rule {LOST_SPLITS_RULE!r}: {len(lost)} finished split(s) "
        f"{shown} are not among its current splits (the split list changed since {since}), "
        "so resuming could process their data twice; declare them again, or pass "
        f"{ALLOW_ARGUMENT}=True to the stage's operator if those inputs were removed on purpose "
        "(their committed output stays)"
    )


def _ways_out(stage_id: str, origin: str) -> str:
    """The ways out of a finished stage's changed split list that apply to where the run's
    pipeline key came from (``core.pipeline_keys.KeyOrigin``'s values).
    """
    recompute = "reset the stage to recompute it (`finalckpt reset DAG_ID RUN_ID --stage "
    recompute += f"{stage_id}`, then clear the task)"
    keep = "declare the splits it finished with"
    if origin == "conf":
        first = (
            'run it under a pipeline of its own (start the DAG run without "pipeline_key" in '
            "its conf: each DAG run then gets its own)"
        )
    elif origin == "operator":
        first = (
            "run it under a pipeline of its own (the stage's pipeline_key argument gives this "
            "run a finished pipeline: make it differ per run, or leave it out: one per DAG run)"
        )
    elif origin == "restore":
        first = "restore a savepoint taken with the current inputs, or none (a new pipeline)"
    else:  # the DAG run's own pipeline: nothing in the conf or the DAG to change
        return f"{recompute}, or {keep}"
    return f"{first}, {recompute}, or {keep}"


def check_finished_split_list(
    stage_id: str,
    recorded: str | None,
    declared: Sequence[str],
    key_origin: str = "default",
) -> None:
    """A finished stage is re-published only with the split list it finished: new or late
    input (a reused pipeline key, a file added to a finished day) must never be skipped
    silently. Raises ``SplitListChangedError`` naming the rule and the ways out that apply to
    where the pipeline key came from (``key_origin``).
    """
    if recorded is None or recorded == split_list_fingerprint(declared):
        return
    raise SplitListChangedError(
        f"stage {stage_id!r} is finished but now declares another list of {len(declared)} "
        f"splits (rule {FINISHED_SPLIT_LIST_RULE}): re-publishing it "
        f"would skip the new input; {_ways_out(stage_id, key_origin)}"
    )


@dataclass(frozen=True)
class DeclaredSplits:
    """A stage's split list as its DAG declares it before any run: the ids of a fixed list, or
    None when they are known only when the task runs (a callable, an incremental source, the
    upstream stages' parts); and whether the stage allows losing finished splits.
    """

    splits: tuple[str, ...] | None
    allow_change: bool = False


def dry_run_split_list(
    stage_id: str,
    *,
    finished_stage: bool,
    recorded: str | None,
    finished: Collection[str],
    declared: DeclaredSplits | None,
    since: str,
) -> str:
    """What a run of the stage declaring ``declared`` will be told about its split list, by
    the rules its task applies (a dry run of a restore or continuation): raises the task's own
    error for a refusal (``SplitListChangedError``, ``LostFinishedSplitsError``), else one line.
    ``recorded``: the fingerprint the stage's progress was recorded with (None: not known).
    """
    if recorded is None:
        return "split list: not recorded (progress from before fingerprints were kept)"
    if declared is None or declared.splits is None:
        return (
            "split list: declared when the task runs; it checks rules "
            f"{FINISHED_SPLIT_LIST_RULE} and {LOST_SPLITS_RULE} then"
        )
    splits = list(declared.splits)
    if finished_stage:
        check_finished_split_list(stage_id, recorded, splits)
        return "split list: unchanged"
    check_finished_splits_declared(stage_id, splits, finished, since, declared.allow_change)
    change = split_list_change(recorded, splits, finished)
    return "split list: unchanged" if change is None else change.describe(stage_id, since)
