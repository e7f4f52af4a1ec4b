"""Partitions (Airflow's AIP-76) as plain values: the keys a stage reports at run time, carried
on its sink transactions, and which of them a commit announces.

A partition key rides on the transactions of the batch that reported it, never beside them: a
transaction that is aborted (a crashed attempt's batch, the batches after a stop) takes its keys
with it, and a commit announces exactly the keys of the transactions it made visible. A
recompute (a clear of a succeeded stage) supersedes the stage's earlier committed transactions,
so its commit announces only what it recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.core.model import SinkTransaction, TransactionState

#: Payload key of a transaction: the partition keys its rows belong to (``add_partitions``).
PARTITION_KEYS = "partition_keys"
#: Payload key set on a committed transaction when its stage was reset to recompute: its rows
#: were replaced (or are about to be), it no longer counts for the stage's next commit.
SUPERSEDED = "superseded"
#: Airflow's limit (the metadata database's column width, ``airflow.models.base.ID_LEN``).
MAX_KEY_LENGTH = 250


def check_partition_keys(stage_id: str, keys: str | Iterable[str]) -> tuple[str, ...]:
    """``keys`` (one key or several) as a tuple, or a one-line error naming the bad one."""
    listed = [keys] if isinstance(keys, str) else list(keys)
    for key in listed:
        if not isinstance(key, str) or not key.strip():
            raise StageDefinitionError(
                f"stage {stage_id!r}: partition key {key!r} is not a non-empty string"
            )
        if len(key) > MAX_KEY_LENGTH:
            raise StageDefinitionError(
                f"stage {stage_id!r}: partition key {key[:40]!r}... has {len(key)} characters, "
                f"Airflow keeps at most {MAX_KEY_LENGTH}"
            )
    return tuple(listed)


def with_partitions(txns: Sequence[SinkTransaction], keys: Iterable[str]) -> list[SinkTransaction]:
    """The batch's transactions carrying the partition keys its transform reported."""
    listed = sorted(set(keys))
    if not listed:
        return list(txns)
    return [t.model_copy(update={"payload": {**t.payload, PARTITION_KEYS: listed}}) for t in txns]


def counts(txn: SinkTransaction, state: str) -> bool:
    """A transaction of the stage's current commit: committed, and not superseded by a reset."""
    return state == TransactionState.COMMITTED.value and not txn.payload.get(SUPERSEDED)


def committed_partitions(transactions: Iterable[tuple[SinkTransaction, str]]) -> list[str]:
    """The partition keys a stage's commit made visible: those of its counted transactions."""
    keys: set[str] = set()
    for txn, state in transactions:
        if counts(txn, state):
            keys.update(str(k) for k in txn.payload.get(PARTITION_KEYS) or ())
    return sorted(keys)
