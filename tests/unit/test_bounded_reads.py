"""Every read of user-writable storage has a size cap (issue 37): a file of any size planted
where the plugin reads one of its own documents (a driver's spec, result and heartbeat, a
savepoint's file list and bundled files, a sink's manifests, ``_metadata`` for ``progress``)
is refused in one line after reading at most its cap, never read whole. The files here are
sparse (no disk used) and 300 MiB, over every document cap; tracemalloc's peak shows what a
read allocated (the whole file, before)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import (
    MAX_DOCUMENT_BYTES,
    MAX_SMALL_DOCUMENT_BYTES,
    read_capped,
)

HUGE = 300 << 20
MB = 1 << 20


def sparse(path: Path, size: int = HUGE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.seek(size - 1)
        out.write(b"}")
    return path


def peak_of(call: Callable[[], Any]) -> tuple[Any, int]:
    """What ``call`` returned or raised, and the peak of its Python allocations."""
    tracemalloc.start()
    try:
        try:
            outcome: Any = call()
        except FinalCheckpointError as exc:
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_read_capped_reads_the_cap_and_refuses_one_byte_more(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 10)
    assert read_capped(fs, str(exact), 10, what="doc") == b"x" * 10
    with pytest.raises(FinalCheckpointError, match="is larger than the 9 bytes") as refused:
        read_capped(fs, str(exact), 9, what="doc")
    assert "\n" not in str(refused.value)
    with pytest.raises(FileNotFoundError):
        read_capped(fs, str(tmp_path / "absent"), 9, what="doc")


def _driver_file(tmp_path: Path, name: str) -> Callable[[], Any]:
    from airflow_finalckpt.spark.job import Files

    storage = CheckpointStorage(str(tmp_path / "chk"))
    files = Files(storage, "p", "enrich")
    sparse(tmp_path / "chk" / "p" / "drivers" / "enrich" / "s1" / name)
    return lambda: files.read_json("s1", name)


def _savepoint_manifest(tmp_path: Path) -> Callable[[], Any]:
    from airflow_finalckpt.storage import savepoint_files

    sparse(tmp_path / "sp" / savepoint_files.FILES_MANIFEST)
    fs = LocalFileSystem()
    return lambda: savepoint_files.read_manifest(fs, str(tmp_path / "sp"), "sp")


def _bundled_file(tmp_path: Path) -> Callable[[], Any]:
    from airflow_finalckpt.storage import savepoint_files

    src = sparse(tmp_path / "sp" / "files" / "state" / "big.json")
    fs = LocalFileSystem()
    entry = {"size": 100, "sha256": "0" * 64}
    target = str(tmp_path / "pipeline" / "state" / "big.json")
    return lambda: savepoint_files._copy_verified(fs, str(src), fs, target, entry, "sp")


def _parquet_manifest(tmp_path: Path) -> Callable[[], Any]:
    from airflow_finalckpt.sinks.parquet_files import TableFiles

    path = sparse(tmp_path / "t" / "txn-x" / "_manifest.json")
    return lambda: TableFiles(LocalFileSystem(), "out").read_manifest(str(path))


def _staged_manifest(tmp_path: Path) -> Callable[[], Any]:
    from airflow_finalckpt.sinks import DeltaTableSink

    sink = DeltaTableSink("out", str(tmp_path / "delta"))
    path = sparse(tmp_path / "delta" / "finalckpt" / "out" / "x" / "_finalckpt_manifest.json")
    return lambda: sink._read_json(LocalFileSystem(), str(path))


def _metadata(tmp_path: Path) -> Callable[[], Any]:
    sparse(tmp_path / "chk" / "p" / "chk-1" / "_metadata")
    storage = CheckpointStorage(str(tmp_path / "chk"))
    return lambda: storage.read_checkpoint(str(tmp_path / "chk" / "p" / "chk-1"))


READERS: dict[str, tuple[Callable[[Path], Callable[[], Any]], int]] = {
    "heartbeat.json": (lambda p: _driver_file(p, "heartbeat.json"), MAX_SMALL_DOCUMENT_BYTES),
    "result.json": (lambda p: _driver_file(p, "result.json"), MAX_DOCUMENT_BYTES),
    "spec.json": (lambda p: _driver_file(p, "spec.json"), MAX_DOCUMENT_BYTES),
    "savepoint file list": (_savepoint_manifest, MAX_DOCUMENT_BYTES),
    "savepoint bundled file": (_bundled_file, 100),
    "parquet sink manifest": (_parquet_manifest, MAX_DOCUMENT_BYTES),
    "staged sink manifest": (_staged_manifest, MAX_DOCUMENT_BYTES),
    "_metadata": (_metadata, 64 * MB),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_oversized_file_is_refused_after_reading_at_most_its_cap(
    tmp_path: Path, reader: str
) -> None:
    setup, cap = READERS[reader]
    outcome, peak = peak_of(setup(tmp_path))
    assert isinstance(outcome, FinalCheckpointError), outcome
    message = str(outcome)
    assert "\n" not in message and f"larger than the {cap} bytes" in message, message
    assert peak < cap + 32 * MB, f"{reader}: {peak / MB:.0f} MiB allocated"


def test_progress_reads_metadata_within_its_cap(tmp_path: Path) -> None:
    """``finalckpt progress`` shows the plan's statuses for a checkpoint whose _metadata it
    cannot read; it used to read the whole file first."""
    from types import SimpleNamespace

    from airflow_finalckpt.cli import progress

    path = sparse(tmp_path / "p" / "chk-1" / "_metadata")
    plan = SimpleNamespace(statuses={})
    info = SimpleNamespace(metadata_path=str(path), plan=plan)
    statuses, peak = peak_of(lambda: progress.recorded_statuses(info))  # type: ignore[arg-type]
    assert statuses == {}
    assert peak < 96 * MB, f"{peak / MB:.0f} MiB allocated"
