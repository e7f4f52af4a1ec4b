"""The run-time check of ``split_keys``: no split-key value appears in two batches.

A stage grouped by its split keys is batchable only if the splits really partition the data by
them. Each batch's distinct split-key values (read from the part it just wrote: a small
read of a few columns) are added to a compact record, value -> batch key, kept as one state
file recorded with the batch (so it survives a crash and a resume, and a redone batch is not
counted twice); a value already recorded for another batch fails the stage before the batch is
recorded, so nothing of it is committed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame

from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.core.model import StateHandle
from airflow_finalckpt.core.plan_check import SplitKeyRepeatedError, repeated_split_key
from airflow_finalckpt.storage import CheckpointStorage

#: The state handle of the record (not a user state: no ``state:`` prefix).
SPLIT_KEYS_HANDLE = "split_keys"


def batch_values(frame: DataFrame, keys: Sequence[str], stage_id: str) -> list[str]:
    """The distinct split-key values of a batch's output, each as a JSON list."""
    columns = {c.lower(): c for c in frame.columns}
    missing = [k for k in keys if k.lower() not in columns]
    if missing:
        raise StageDefinitionError(
            f"stage {stage_id!r}: split_keys {list(keys)} must be columns of the stage's "
            f"output, which has no {missing} (columns: {frame.columns}); name the output "
            "columns the splits partition the data by"
        )
    rows = frame.select(*[columns[k.lower()] for k in keys]).distinct().collect()
    return sorted(json.dumps([_plain(v) for v in row], default=str) for row in rows)


def _plain(value: object) -> object:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def record_batch_values(
    storage: CheckpointStorage,
    pipeline_key: str,
    stage_id: str,
    handles: Mapping[str, StateHandle],
    batch_key: str,
    values: Sequence[str],
) -> StateHandle:
    """Add a batch's values to the stage's record; SplitKeyRepeatedError if one is known."""
    handle = handles.get(SPLIT_KEYS_HANDLE)
    seen: dict[str, str] = {}
    if handle is not None:
        seen = dict(json.loads(storage.read_state(pipeline_key, handle)))
    clash = repeated_split_key(seen, values, batch_key)
    if clash is not None:
        value, earlier = clash
        raise SplitKeyRepeatedError(
            f"stage {stage_id!r}: split-key value {value} appears in batch {earlier} and in "
            f"batch {batch_key}: the splits do not partition the data by the split_keys, so "
            "a grouped result per batch would be wrong. Remove split_keys (the stage then runs "
            "as one batch per attempt) or split the input by those columns"
        )
    seen.update(dict.fromkeys(values, batch_key))
    return storage.write_state(
        pipeline_key,
        f"state/{stage_id}/split_keys/{batch_key}.json",
        json.dumps(seen, sort_keys=True).encode(),
        name=SPLIT_KEYS_HANDLE,
    )
