"""A split-batch boundary's acknowledgements decided at once, before anything is written.

A boundary makes the batch durable and answers every pending checkpoint that waits for the
stage (``Coordinator.record_batch``). Step by step that is a read and a write per checkpoint and
per table; here the store reads what the answers decide on in one statement, this module
decides all of them on plain values, and the store writes the outcome in one statement
(PostgreSQL) or one per table (SQLite). An answer that would complete its checkpoint is not
decided here: the boundary takes the step-by-step path, which completes it (once per
checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_finalckpt.core.model import SinkTransaction, TransactionState
from airflow_finalckpt.core.transitions import stamps_on_ack


@dataclass(frozen=True)
class Awaiting:
    """A pending checkpoint that waits for the stage, as the boundary read it."""

    checkpoint_id: int
    acks_pending: int
    triggered_at: float


@dataclass(frozen=True)
class StoredTxn:
    """A stored transaction of the stage: pre-committed, or one the batch records again."""

    txn: SinkTransaction
    state: str


@dataclass(frozen=True)
class BoundaryAcks:
    """What a boundary writes besides the stage's progress.

    ``acked``: the checkpoints it acknowledges, oldest first; ``stamp``: the checkpoint that
    covers the stage's uncovered transactions (None: none does); ``new``: the batch's
    transactions the store does not hold yet (inserted covered by ``stamp``); ``uncommitted``:
    the stage's pre-committed transactions afterwards, what each acknowledgement records.
    """

    acked: tuple[Awaiting, ...]
    stamp: int | None
    new: tuple[SinkTransaction, ...]
    uncommitted: tuple[SinkTransaction, ...]


def decide_boundary(
    awaiting: Iterable[Awaiting],
    newest_acked: int | None,
    stored: Sequence[StoredTxn],
    batch: Sequence[SinkTransaction],
) -> BoundaryAcks | None:
    """The boundary's acknowledgements, as the step-by-step path makes them: oldest first,
    the first one that stamps (``stamps_on_ack``) covers every uncovered transaction, a
    transaction id already stored is not recorded again. None: an acknowledgement would
    complete its checkpoint (take the step-by-step path).
    """
    acked = tuple(sorted(awaiting, key=lambda a: a.checkpoint_id))
    if any(a.acks_pending <= 1 for a in acked):
        return None
    stamp = next(
        (a.checkpoint_id for a in acked if stamps_on_ack(a.checkpoint_id, newest_acked)), None
    )
    known = {(s.txn.sink_id, s.txn.txn_id) for s in stored}
    new: dict[tuple[str, str], SinkTransaction] = {}
    for txn in batch:
        key = (txn.sink_id, txn.txn_id)
        if key not in known and key not in new:  # a repeated id: the first one is inserted
            new[key] = txn.model_copy(update={"checkpoint_id": None})
    pending = [s.txn for s in stored if s.state == TransactionState.PRECOMMITTED.value]
    uncommitted = [*pending, *new.values()]
    if all(txn.checkpoint_id is not None for txn in uncommitted):
        stamp = None  # nothing to cover: no stamp to write
    if stamp is not None:
        uncommitted = [_covered(txn, stamp) for txn in uncommitted]
    return BoundaryAcks(
        acked=acked,
        stamp=stamp,
        new=tuple(new.values()),
        uncommitted=tuple(sorted(uncommitted, key=lambda x: (x.sink_id, x.txn_id))),
    )


def _covered(txn: SinkTransaction, checkpoint_id: int) -> SinkTransaction:
    if txn.checkpoint_id is not None:
        return txn
    return txn.model_copy(update={"checkpoint_id": checkpoint_id})
