"""Child process of test_sinks_lakehouse_crash: a small pipeline writing to one table sink that
SIGKILLs itself at the requested point, like a crashed Airflow worker or Spark driver.

Usage: ``python lakehouse_crash_child.py <iceberg|delta> <root> <point|none> <batch>``.

Each batch ``b<k>`` stages two files of ``ROWS`` rows, is pre-committed and recorded in
``<root>/checkpoint.json`` (the completed checkpoint covering it), a transaction ``x<k>`` opened
after it is aborted (as on close), then ``b<k>`` is committed. On start the child restores like the
stage runtime: staged transactions no checkpoint covers are aborted, covered ones are committed
again (idempotently), and the batches not covered are redone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem
from lakehouse_helpers import make_sink

from airflow_finalckpt.core.model import SinkTransaction

BATCHES, ROWS = 4, 10
POINTS = ("before-precommit", "after-precommit", "after-table-commit", "before-ack", "during-abort")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(sink: Any, point: str, batch: int) -> None:
    """Crash hooks that are not between two calls of the pipeline below."""
    if point == "after-table-commit":  # the table holds the commit, the sink's marker not yet
        mark = sink._mark_committed

        def mark_or_die(txn_id: str) -> None:
            if txn_id == f"b{batch}":
                die()
            mark(txn_id)

        sink._mark_committed = mark_or_die
    if point == "during-abort":  # manifest gone, one data file deleted, the rest left behind
        real_rm = LocalFileSystem.rm

        def rm(self: LocalFileSystem, path: Any, recursive: bool = False, **kw: Any) -> None:
            if recursive and str(path).rstrip("/").endswith(f"/x{batch}"):
                next(iter(sorted(Path(str(path)).glob("*.parquet")))).unlink()
                die()
            real_rm(self, path, recursive=recursive, **kw)

        LocalFileSystem.rm = rm  # type: ignore[method-assign]


def rows(first: int, count: int) -> pa.Table:
    return pa.table({"order_id": pa.array(range(first, first + count), pa.int64())})


def main(kind: str, root: str, point: str, batch: int) -> None:
    sink = make_sink(kind, root)
    arm(sink, point, batch)
    checkpoint = Path(root) / "checkpoint.json"
    covered: dict[str, Any] = json.loads(checkpoint.read_text()) if checkpoint.exists() else {}
    for txn_id in sorted(sink.staged_txn_ids() - set(covered)):  # lingering: abort
        sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id=txn_id, checkpoint_id=0))
    for document in covered.values():  # covered by a completed checkpoint: commit (again)
        sink.commit(SinkTransaction.model_validate(document))
    for k in range(BATCHES):
        txn_id = f"b{k}"
        if txn_id in covered:
            continue
        sink.write_arrow(txn_id, rows(k * ROWS, ROWS // 2))
        sink.write_arrow(txn_id, rows(k * ROWS + ROWS // 2, ROWS - ROWS // 2))
        if point == "before-precommit" and k == batch:
            die()
        txn = sink.precommit(txn_id, k + 1)
        covered[txn_id] = txn.model_dump(mode="json")
        temporary = checkpoint.with_suffix(".tmp")
        temporary.write_text(json.dumps(covered))
        os.replace(temporary, checkpoint)
        if point == "after-precommit" and k == batch:
            die()
        sink.write_arrow(f"x{k}", rows(1000 + k, 3))
        sink.write_arrow(f"x{k}", rows(2000 + k, 3))
        sink.abort(sink.precommit(f"x{k}", k + 1))
        sink.commit(txn)
        if point == "before-ack" and k == batch:
            die()
    print("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
