"""Self-contained savepoints on real fsspec filesystems (local and memory://, no mocks): a
savepoint holds every file it references; copying only its directory to another root restores."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from airflow_finalckpt.core.errors import StorageError
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    EndOfData,
    StageCheckpointRecord,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.savepoint_files import FILES_DIR, FILES_MANIFEST, bundled_files

KEY = "flights"


@pytest.fixture
def memory_roots() -> Iterator[tuple[str, str]]:
    roots = (f"memory://src-{uuid.uuid4().hex}", f"memory://dst-{uuid.uuid4().hex}")
    yield roots
    fs = MemoryFileSystem()
    for root in roots:
        path = root.removeprefix("memory:/")
        if fs.exists(path):
            fs.rm(path, recursive=True)


def _pipeline(storage: CheckpointStorage, kind: CheckpointKind, cid: int = 4) -> CheckpointRecord:
    """A two-stage pipeline as the Spark runtime lays it out: ingest fully finished (its
    output parts in the end_of_data manifest), enrich partially finished with keyed and
    stage-global state frames and an output handle naming its part."""
    fs, put = storage.fs, storage.fs._strip_protocol

    def part(rel: str, payload: bytes) -> None:
        fs.makedirs(put(storage.resolve_handle(KEY, rel)), exist_ok=True)
        fs.pipe_file(put(storage.resolve_handle(KEY, f"{rel}/part-0.parquet")), payload)
        fs.pipe_file(put(storage.resolve_handle(KEY, f"{rel}/_SUCCESS")), b"")

    part("data/ingest/b0", b"ingest-0")
    part("data/ingest/b1", b"ingest-1")
    part("data/enrich/b0", b"enrich-0")
    part("state/enrich/state_w/u1", b"window-state")
    part("state/enrich/global_dim/u2", b"dimension")
    part("data/ingest/b-old", b"superseded, not referenced")
    keyed = storage.write_state(
        KEY, "state/enrich/state_w/u1.json", b'{"path": "state/enrich/state_w/u1"}', name="state:w"
    )
    glob = storage.write_state(
        KEY,
        "state/enrich/global_dim/u2.json",
        b'{"path": "state/enrich/global_dim/u2"}',
        name="global:dim",
    )
    out = storage.write_state(
        KEY,
        "data/enrich/_parts/b0.json",
        b'{"parts": ["data/enrich/b0"]}',
        name="output:data/enrich/b0",
    )
    return CheckpointRecord(
        pipeline_key=KEY,
        checkpoint_id=cid,
        kind=kind,
        reason=TriggerReason.MANUAL,
        graph={
            "stages": [
                {"stage_id": "ingest", "upstream": [], "task_id": None},
                {"stage_id": "enrich", "upstream": ["ingest"], "task_id": None},
            ]
        },
        graph_fingerprint="f" * 64,
        triggered_at=1.0,
        completed_at=2.0,
        stages={
            "ingest": StageCheckpointRecord(
                stage_id="ingest",
                status=StageStatus.FULLY_FINISHED,
                end_of_data=EndOfData(manifest=["data/ingest/b0", "data/ingest/b1"]),
            ),
            "enrich": StageCheckpointRecord(
                stage_id="enrich",
                status=StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"data/ingest/b0"}),
                state=(keyed, glob, out),
            ),
        },
    )


EXPECTED = {
    "data/enrich/_parts/b0.json",
    "data/enrich/b0/_SUCCESS",
    "data/enrich/b0/part-0.parquet",
    "data/ingest/b0/_SUCCESS",
    "data/ingest/b0/part-0.parquet",
    "data/ingest/b1/_SUCCESS",
    "data/ingest/b1/part-0.parquet",
    "state/enrich/global_dim/u2.json",
    "state/enrich/global_dim/u2/_SUCCESS",
    "state/enrich/global_dim/u2/part-0.parquet",
    "state/enrich/state_w/u1.json",
    "state/enrich/state_w/u1/_SUCCESS",
    "state/enrich/state_w/u1/part-0.parquet",
}


def _copy_tree(src: CheckpointStorage, src_dir: str, dst: CheckpointStorage, dst_dir: str) -> None:
    """Copy one directory between two storages file by file (as a user's `cp -r` would)."""
    base = str(src.fs._strip_protocol(src_dir)).rstrip("/")
    target = str(dst.fs._strip_protocol(dst_dir)).rstrip("/")
    for path in src.fs.find(base):
        dest = f"{target}/{str(path)[len(base) + 1 :]}"
        dst.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        dst.fs.pipe_file(dest, src.fs.cat_file(path))


def _files_of(storage: CheckpointStorage) -> dict[str, bytes]:
    base = str(storage.fs._strip_protocol(storage.pipeline_dir(KEY))).rstrip("/")
    storage.fs.invalidate_cache(base)
    return {
        str(p)[len(base) + 1 :]: bytes(storage.fs.cat_file(p))
        for p in storage.fs.find(base)
        if not str(p)[len(base) + 1 :].startswith("chk-")
    }


@pytest.mark.parametrize("target", ["memory", "local"])
def test_only_the_savepoint_dir_copied_to_another_root_restores_every_file(
    memory_roots: tuple[str, str], tmp_path: Path, target: str
) -> None:
    source = CheckpointStorage(str(tmp_path / "source"))
    record = _pipeline(source, CheckpointKind.SAVEPOINT)
    path, _ = source.write_checkpoint(record)
    assert set(bundled_files(source, path)) == EXPECTED
    originals = _files_of(source)

    other = CheckpointStorage(memory_roots[1] if target == "memory" else str(tmp_path / "other"))
    _copy_tree(source, source.checkpoint_dir(KEY, 4), other, other.checkpoint_dir(KEY, 4))
    copied_path = other.metadata_path(KEY, 4)
    loaded = other.read_checkpoint(copied_path)
    assert loaded == record
    assert other.materialize(loaded, copied_path) == len(EXPECTED)
    restored = _files_of(other)
    assert set(restored) == EXPECTED  # the superseded part stayed behind
    assert all(restored[rel] == originals[rel] for rel in EXPECTED)
    # the handles verify against their checksums in the new root
    for handle in loaded.stages["enrich"].state:
        other.read_state(KEY, handle)
    assert other.materialize(loaded, copied_path) == 0  # idempotent: every task calls it


def test_a_memory_savepoint_restores_into_a_local_root(
    memory_roots: tuple[str, str], tmp_path: Path
) -> None:
    source = CheckpointStorage(memory_roots[0])
    record = _pipeline(source, CheckpointKind.SAVEPOINT, cid=9)
    source.write_checkpoint(record)
    other = CheckpointStorage(str(tmp_path / "other"))
    _copy_tree(source, source.checkpoint_dir(KEY, 9), other, other.checkpoint_dir(KEY, 9))
    assert other.materialize(record, other.checkpoint_dir(KEY, 9)) == len(EXPECTED)
    assert set(_files_of(other)) == EXPECTED


def test_local_savepoint_files_are_hard_links_that_survive_the_originals(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    record = _pipeline(storage, CheckpointKind.SAVEPOINT)
    storage.write_checkpoint(record)
    original = tmp_path / "ckpt" / KEY / "data/ingest/b0/part-0.parquet"
    kept = tmp_path / "ckpt" / KEY / "chk-4" / FILES_DIR / "data/ingest/b0/part-0.parquet"
    assert os.stat(original).st_ino == os.stat(kept).st_ino
    original.unlink()  # what gc does to an unreferenced part
    assert kept.read_bytes() == b"ingest-0"


@pytest.mark.parametrize("kind", [CheckpointKind.CHECKPOINT, CheckpointKind.DRAINED_SAVEPOINT])
def test_checkpoints_and_drained_savepoints_copy_nothing(
    tmp_path: Path, kind: CheckpointKind
) -> None:
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    path, _ = storage.write_checkpoint(_pipeline(storage, kind))
    chk = tmp_path / "ckpt" / KEY / "chk-4"
    assert sorted(p.name for p in chk.iterdir()) == ["_metadata"]
    assert list(bundled_files(storage, path)) == []


def test_a_corrupt_copy_is_refused_naming_the_file(tmp_path: Path) -> None:
    source = CheckpointStorage(str(tmp_path / "source"))
    record = _pipeline(source, CheckpointKind.SAVEPOINT)
    source.write_checkpoint(record)
    other = CheckpointStorage(str(tmp_path / "other"))
    _copy_tree(source, source.checkpoint_dir(KEY, 4), other, other.checkpoint_dir(KEY, 4))
    bad = tmp_path / "other" / KEY / "chk-4" / FILES_DIR / "state/enrich/state_w/u1/part-0.parquet"
    bad.write_bytes(b"window-statX")
    with pytest.raises(StorageError, match=r"state_w/u1/part-0\.parquet does not match"):
        other.materialize(record, other.checkpoint_dir(KEY, 4))

    manifest = tmp_path / "other" / KEY / "chk-4" / FILES_MANIFEST
    doc = json.loads(manifest.read_text())
    doc["files"]["data/ingest/b0/_SUCCESS"]["size"] = 5
    manifest.write_text(json.dumps(doc))
    with pytest.raises(StorageError, match="is corrupt"):
        other.materialize(record, other.checkpoint_dir(KEY, 4))


def test_a_missing_copy_is_refused(tmp_path: Path) -> None:
    source = CheckpointStorage(str(tmp_path / "source"))
    record = _pipeline(source, CheckpointKind.SAVEPOINT)
    source.write_checkpoint(record)
    other = CheckpointStorage(str(tmp_path / "other"))
    _copy_tree(source, source.checkpoint_dir(KEY, 4), other, other.checkpoint_dir(KEY, 4))
    (tmp_path / "other" / KEY / "chk-4" / FILES_DIR / "data/ingest/b1/part-0.parquet").unlink()
    with pytest.raises(StorageError, match="copy the whole savepoint directory"):
        other.materialize(record, other.checkpoint_dir(KEY, 4))


def test_a_symlinked_file_is_never_bundled(tmp_path: Path) -> None:
    """A referenced file that is a symlink (to a secret elsewhere on the machine) is refused
    when the savepoint bundles its files: nothing of it is copied and no _metadata written."""
    from airflow_finalckpt.core.errors import UnsafePathError

    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    record = _pipeline(storage, CheckpointKind.SAVEPOINT)
    secret = tmp_path / "outside-secret"
    secret.write_bytes(b"not checkpoint data")
    planted = tmp_path / "ckpt" / KEY / "data/ingest/b0/part-0.parquet"
    planted.unlink()
    planted.symlink_to(secret)
    with pytest.raises(UnsafePathError, match="symlink"):
        storage.write_checkpoint(record)
    assert not (tmp_path / "ckpt" / KEY / "chk-4" / "_metadata").exists()
