"""A table-format sink replacing the slice a pipeline run owns (``replace_slice``): every
transaction of the stage goes into ONE table commit that also removes the slice's old rows, so
readers see the old slice or the new one, never both, never half.

The commit records all the transaction ids (``finalckpt.txn-ids``) besides the first one
(``finalckpt.txn-id``, what older readers look for); before committing, the table's history is
searched for any of them, so a replay (after a crash between the table commit and the markers,
or by a racing committer) changes nothing. Each transaction gets its committed marker after.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks.base import NotPrecommittedError


class StagedTableSink(Protocol):
    """What a slice replace uses of ``sinks.staged.StagedTableSink`` (a Protocol, so that
    module can call this one without this one importing it back).
    """

    sink_id: str
    on_step: Callable[[str], None]

    def _check_owned(self, txn: SinkTransaction) -> str: ...

    def _require_checkpoint(self, txn: SinkTransaction) -> None: ...

    def _manifest(self, txn_id: str) -> dict[str, Any] | None: ...

    def _has_marker(self, txn_id: str) -> bool: ...

    def _table_committed(self, candidates: dict[str, dict[str, Any] | None]) -> set[str]: ...

    def _publish_replacing(self, manifests: dict[str, dict[str, Any]]) -> bool: ...

    def _mark_committed(self, txn_id: str) -> None: ...


#: Summary / commit-info key listing every transaction id a slice replace published.
TXN_IDS_KEY = "finalckpt.txn-ids"
#: Summary / commit-info key: the slice (JSON) a commit replaced.
SLICE_KEY = "finalckpt.replaced-slice"


def txn_ids_of(info: Mapping[str, Any], txn_id_key: str) -> set[str]:
    """The transaction ids a commit's summary / commit info records (one, or a slice's all)."""
    found = {str(info[txn_id_key])} if info.get(txn_id_key) is not None else set()
    listed = info.get(TXN_IDS_KEY)
    if listed:
        found |= {t for t in str(listed).split(",") if t}
    return found


def commit_replacing(sink: StagedTableSink, txns: Sequence[SinkTransaction]) -> bool:
    """Replace the sink's slice with the transactions' files in one table commit, once."""
    ids = [sink._check_owned(t) for t in txns]
    for txn in txns:
        sink._require_checkpoint(txn)
    manifests = {txn_id: sink._manifest(txn_id) for txn_id in ids}
    if any(sink._has_marker(t) for t in ids) or sink._table_committed(manifests):
        _mark_all(sink, [t for t, m in manifests.items() if m is not None])
        return False
    missing = [
        t.txn_id
        for t in txns
        if manifests[t.txn_id] is None and t.payload.get("location", "") is not None
    ]
    if missing:
        raise NotPrecommittedError(
            f"sink {sink.sink_id!r}: transactions {missing} have no pre-committed files to "
            "commit: they were never pre-committed or were aborted; nothing was replaced"
        )
    present = {t: m for t, m in manifests.items() if m is not None}
    if not present:
        return False  # pre-committed before the table existed: no rows, no table to replace in
    published = sink._publish_replacing(present)
    sink.on_step("table-committed")
    _mark_all(sink, list(present))
    return published


def _mark_all(sink: StagedTableSink, txn_ids: Sequence[str]) -> None:
    for txn_id in txn_ids:
        sink._mark_committed(txn_id)


def _typed(value: Any, like: Any) -> Any:
    """The slice value (a rendered string, usually) as the type of a statistic."""
    if isinstance(like, datetime.datetime):
        return datetime.datetime.fromisoformat(str(value))
    if isinstance(like, datetime.date):
        return datetime.date.fromisoformat(str(value))
    if isinstance(like, int | float):
        return type(like)(value)
    return str(value)


def file_in_slice(low: Any, high: Any, value: Any) -> bool | None:
    """From a file's min / max statistics of a slice column: True if every row has ``value``,
    False if none has, None if it cannot tell (no statistics, or a range around the value).
    """
    if low is None or high is None:
        return None
    try:
        wanted = _typed(value, low)
    except (TypeError, ValueError):
        return None
    if low == high == wanted:
        return True
    if wanted < low or wanted > high:
        return False
    return None
