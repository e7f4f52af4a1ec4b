"""Checkpoint storage: layout, path confinement, atomic durable writes, state checksums."""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.errors import (
    ConfigurationError,
    MetadataError,
    StorageError,
    UnsafePathError,
)
from airflow_finalckpt.core.metadata import CheckpointWriter, dump_metadata
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    StageCheckpointRecord,
    StageStatus,
    StateHandle,
    TriggerReason,
)
from airflow_finalckpt.storage import (
    CheckpointStorage,
    decode_run_id,
    encode_run_id,
    validate_pipeline_key,
    validate_state_path,
)
from airflow_finalckpt.storage import atomic as atomic_module
from airflow_finalckpt.storage.atomic import atomic_write

KEY = "orders_daily.v2"


def record(
    checkpoint_id: int, *, key: str = KEY, kind: CheckpointKind = CheckpointKind.CHECKPOINT
) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline_key=key,
        checkpoint_id=checkpoint_id,
        kind=kind,
        reason=TriggerReason.PERIODIC,
        graph={"stages": [{"stage_id": "a", "upstream": [], "task_id": None}]},
        graph_fingerprint="f" * 64,
        triggered_at=1000.0 + checkpoint_id,
        completed_at=1001.0 + checkpoint_id,
        stages={
            "a": StageCheckpointRecord(
                stage_id="a",
                status=StageStatus.PARTIALLY_FINISHED,
                finished_splits=frozenset({"s1"}),
            )
        },
    )


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh memory:// root: the memory filesystem is process-global, so each test owns one."""
    root = f"memory://ckpt-{uuid.uuid4().hex}"
    yield root
    fs = MemoryFileSystem()
    path = root.removeprefix("memory:/")
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(params=["local-path", "file-uri", "memory-uri"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, memory_root: str) -> CheckpointStorage:
    roots = {
        "local-path": str(tmp_path / "ckpt"),
        "file-uri": f"file://{tmp_path}/ckpt",
        "memory-uri": memory_root,
    }
    return CheckpointStorage(roots[request.param])


# -- layout and round trip --------------------------------------------------------------------


def _port_members() -> list[str]:
    return sorted(
        name
        for name, value in vars(CheckpointWriter).items()
        if callable(value) and not name.startswith("_")
    )


def _signature(function: Any) -> list[tuple[str, Any, Any, Any]]:
    """Parameters (name, kind, default, resolved type) and the resolved return type."""
    hints = typing.get_type_hints(function)
    parameters = [
        (p.name, p.kind, p.default, hints.get(p.name))
        for p in inspect.signature(function).parameters.values()
    ]
    return [*parameters, ("return", None, None, hints.get("return"))]


def test_storage_is_a_checkpoint_writer(storage: CheckpointStorage) -> None:
    """Every method of the coordinator's port, with the port's signature: a runtime Protocol
    ``isinstance`` only checks that the names exist, so a renamed keyword (``replace_orphan``)
    or a changed return type would pass it and break the coordinator's calls."""
    members = _port_members()
    assert members == [
        "checkpoint_dir_ids",
        "discard_checkpoint",
        "discard_checkpoint_dir",
        "write_checkpoint",
    ]
    for name in members:
        port, ours = getattr(CheckpointWriter, name), getattr(CheckpointStorage, name)
        assert _signature(ours) == _signature(port), name
    assert isinstance(storage, CheckpointWriter)


def test_write_then_read_checkpoint(storage: CheckpointStorage) -> None:
    original = record(5, kind=CheckpointKind.SAVEPOINT)
    path, size = storage.write_checkpoint(original)
    assert path == f"{storage.root}/{KEY}/chk-5/_metadata"
    assert size == len(dump_metadata(original))
    assert storage.fs.size(storage._to_fs_path(path)) == size
    assert storage.read_checkpoint(path) == original


def test_public_paths_follow_the_root_style(tmp_path: Path, memory_root: str) -> None:
    local = CheckpointStorage(str(tmp_path))
    assert local.checkpoint_dir(KEY, 3) == f"{tmp_path}/{KEY}/chk-3"
    assert local.pipeline_dir(KEY) == f"{tmp_path}/{KEY}"
    file_uri = CheckpointStorage(f"file://{tmp_path}")
    assert file_uri.checkpoint_dir(KEY, 3) == f"file://{tmp_path}/{KEY}/chk-3"
    memory = CheckpointStorage(memory_root)
    assert memory.metadata_path(KEY, 3) == f"memory:///{memory_root[9:]}/{KEY}/chk-3/_metadata"


def test_read_checkpoint_accepts_dir_metadata_path_uri_and_relative_path(
    tmp_path: Path,
) -> None:
    storage = CheckpointStorage(str(tmp_path))
    original = record(8)
    storage.write_checkpoint(original)
    for path in [
        f"{tmp_path}/{KEY}/chk-8",
        f"{tmp_path}/{KEY}/chk-8/",
        f"{tmp_path}/{KEY}/chk-8/_metadata",
        f"file://{tmp_path}/{KEY}/chk-8/_metadata",
        f"file://{tmp_path}/{KEY}/chk-8",
        f"{KEY}/chk-8",
        f"{KEY}/chk-8/_metadata",
    ]:
        assert storage.read_checkpoint(path) == original, path


def test_locate_parses_a_checkpoint_path(storage: CheckpointStorage) -> None:
    location = storage.locate(storage.checkpoint_dir(KEY, 12))
    assert (location.pipeline_key, location.checkpoint_id) == (KEY, 12)
    assert location.metadata_path == storage.metadata_path(KEY, 12)


def test_missing_checkpoint_gives_a_clear_error(storage: CheckpointStorage) -> None:
    with pytest.raises(MetadataError, match=r"no checkpoint metadata at .*/chk-4/_metadata"):
        storage.read_checkpoint(storage.checkpoint_dir(KEY, 4))


def test_corrupt_metadata_on_disk_names_the_file(storage: CheckpointStorage) -> None:
    path, _ = storage.write_checkpoint(record(2))
    fs_path = storage._to_fs_path(path)
    storage.fs.pipe_file(fs_path, storage.fs.cat_file(fs_path)[:50])
    with pytest.raises(MetadataError) as caught:
        storage.read_checkpoint(path)
    assert path in str(caught.value)
    assert "not valid JSON" in str(caught.value)


def test_list_checkpoints_returns_completed_ones_by_id(storage: CheckpointStorage) -> None:
    for checkpoint_id in (10, 2, 9):
        storage.write_checkpoint(record(checkpoint_id))
    pipeline = storage._to_fs_path(storage.pipeline_dir(KEY))
    put(storage, f"{pipeline}/chk-3/state.bin", b"in progress, no _metadata")
    put(storage, f"{pipeline}/chk-11/._metadata.tmp-deadbeef", b"crashed mid-write")
    put(storage, f"{pipeline}/chk-007/_metadata", b"not a canonical id")
    put(storage, f"{pipeline}/shared/_metadata", b"not a checkpoint dir")
    assert storage.list_checkpoints(KEY) == [
        (2, storage.metadata_path(KEY, 2)),
        (9, storage.metadata_path(KEY, 9)),
        (10, storage.metadata_path(KEY, 10)),
    ]


def test_list_checkpoints_of_an_unknown_pipeline_is_empty(storage: CheckpointStorage) -> None:
    assert storage.list_checkpoints("never_ran") == []


def test_discard_checkpoint_is_idempotent(storage: CheckpointStorage) -> None:
    keep, _ = storage.write_checkpoint(record(1))
    path, _ = storage.write_checkpoint(record(2))
    storage.write_state(KEY, "chk-2/a/state.bin", b"state")
    storage.discard_checkpoint(path)
    assert not storage.fs.exists(storage._to_fs_path(storage.checkpoint_dir(KEY, 2)))
    storage.discard_checkpoint(path)
    storage.discard_checkpoint(storage.checkpoint_dir(KEY, 77))
    assert storage.list_checkpoints(KEY) == [(1, keep)]
    assert storage.read_checkpoint(keep) == record(1)


def test_discard_removes_metadata_before_anything_else(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = storage.write_checkpoint(record(2))
    storage.write_state(KEY, "chk-2/a/state.bin", b"state")

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("crash while deleting the directory")

    monkeypatch.setattr(storage.fs, "rm", crash)
    with pytest.raises(StorageError, match="cannot discard checkpoint"):
        storage.discard_checkpoint(path)
    assert storage.list_checkpoints(KEY) == []


def test_rewriting_identical_metadata_is_a_no_op(storage: CheckpointStorage) -> None:
    first = storage.write_checkpoint(record(3))
    assert storage.write_checkpoint(record(3)) == first


def test_rewriting_a_checkpoint_with_other_content_is_refused(storage: CheckpointStorage) -> None:
    storage.write_checkpoint(record(3))
    with pytest.raises(StorageError, match="already has different metadata"):
        storage.write_checkpoint(record(3, kind=CheckpointKind.SAVEPOINT))
    assert storage.read_checkpoint(storage.checkpoint_dir(KEY, 3)) == record(3)


def test_a_leftover_of_a_failed_completion_is_replaced_when_told_so(
    storage: CheckpointStorage,
) -> None:
    """FC-1: the coordinator completes an id that was never completed; whatever its directory
    holds (a complete-looking _metadata of a rolled-back completion, a temporary file) goes."""
    storage.write_checkpoint(record(3))
    chk = storage.fs._strip_protocol(storage.checkpoint_dir(KEY, 3))
    storage.fs.pipe_file(f"{chk}/._metadata.tmp-0123", b"partial")
    replacement = record(3, kind=CheckpointKind.SAVEPOINT)
    path, size = storage.write_checkpoint(replacement, replace_orphan=True)
    assert storage.read_checkpoint(path) == replacement
    assert size == len(dump_metadata(replacement))
    storage.fs.invalidate_cache(chk)
    # the temporary file is gone; a savepoint also lists the files it holds (none here)
    assert sorted(p.rsplit("/", 1)[-1] for p in storage.fs.ls(chk, detail=False)) == [
        "_files.json",
        "_metadata",
    ]
    # an empty directory (a write that failed before its rename) is fine too
    storage.fs.makedirs(storage.fs._strip_protocol(storage.checkpoint_dir(KEY, 4)), exist_ok=True)
    storage.write_checkpoint(record(4), replace_orphan=True)
    assert storage.read_checkpoint(storage.checkpoint_dir(KEY, 4)) == record(4)


def test_checkpoint_dir_ids_lists_complete_and_incomplete_directories(
    storage: CheckpointStorage,
) -> None:
    assert storage.checkpoint_dir_ids(KEY) == []
    storage.write_checkpoint(record(2))
    storage.write_checkpoint(record(10))
    pipeline = storage.fs._strip_protocol(storage.pipeline_dir(KEY))
    storage.fs.makedirs(f"{pipeline}/chk-7", exist_ok=True)  # no _metadata
    storage.fs.pipe_file(f"{pipeline}/chk-7/._metadata.tmp-0123", b"partial")
    storage.fs.makedirs(f"{pipeline}/state", exist_ok=True)
    assert storage.checkpoint_dir_ids(KEY) == [2, 7, 10]
    assert storage.list_checkpoints(KEY) == [
        (2, storage.metadata_path(KEY, 2)),
        (10, storage.metadata_path(KEY, 10)),
    ]
    storage.discard_checkpoint_dir(KEY, 7)
    storage.discard_checkpoint_dir(KEY, 10)
    storage.discard_checkpoint_dir(KEY, 10)  # idempotent
    assert storage.checkpoint_dir_ids(KEY) == [2]


def test_a_pipeline_dir_copied_to_another_root_restores(tmp_path: Path) -> None:
    source = CheckpointStorage(str(tmp_path / "cluster-a"))
    handle = source.write_state(KEY, "chk-4/a/state-0.bin", b"window contents")
    path, _ = source.write_checkpoint(record(4))
    shutil.copytree(tmp_path / "cluster-a" / KEY, tmp_path / "cluster-b" / KEY)
    target = CheckpointStorage(str(tmp_path / "cluster-b"))
    assert target.read_checkpoint(f"{KEY}/chk-4") == source.read_checkpoint(path)
    assert target.read_state(KEY, handle) == b"window contents"


def test_storage_options_reach_the_filesystem(tmp_path: Path) -> None:
    storage = CheckpointStorage(f"file://{tmp_path}", {"auto_mkdir": True})
    assert storage.fs.auto_mkdir is True


@pytest.mark.parametrize(
    ("root", "problem"),
    [("", "is empty"), ("   ", "is empty"), ("nosuchprotocol://x", "cannot open checkpoint")],
)
def test_bad_root_is_a_configuration_error(root: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        CheckpointStorage(root)


# -- confinement ------------------------------------------------------------------------------

HOSTILE_KEYS = [
    ("../x", "starts with '.'"),
    ("..", "starts with '.'"),
    ("a..b", "contains '..'"),
    ("/abs", "starts with '/'"),
    ("a/b", "contains the character '/'"),
    ("a\\b", "contains the character '\\\\'"),
    ("a\x00b", "contains the character '\\x00'"),
    ("", "it is empty"),
    ("k" * 201, "201 characters long, the limit is 200"),
    ("ключ", "starts with 'к' (U+043A)"),
    ("a\uff0fb", "contains the character '\uff0f' (U+FF0F)"),  # full-width slash
    ("-flag", "starts with '-'"),
    (".hidden", "starts with '.'"),
    ("a b", "contains the character ' '"),
    ("key\n", "contains the character '\\n'"),
    ("s3://bucket", "contains the character ':'"),
    ("%2e%2e", "starts with '%'"),
    (5, "it is a int, not a string"),
]


@pytest.mark.parametrize(("key", "rule"), HOSTILE_KEYS)
def test_hostile_pipeline_keys_are_refused_naming_key_and_rule(key: Any, rule: str) -> None:
    with pytest.raises(UnsafePathError) as caught:
        validate_pipeline_key(key)
    message = str(caught.value)
    assert f"unsafe pipeline key {key!r}" in message
    assert rule in message
    assert "1-200 ASCII characters" in message


@pytest.mark.parametrize(("key", "rule"), HOSTILE_KEYS)
def test_every_storage_entry_point_refuses_hostile_keys(
    storage: CheckpointStorage, key: Any, rule: str
) -> None:
    calls = [
        lambda: storage.pipeline_dir(key),
        lambda: storage.checkpoint_dir(key, 1),
        lambda: storage.list_checkpoints(key),
        lambda: storage.write_state(key, "state.bin", b"x"),
        lambda: storage.resolve_handle(key, "state.bin"),
    ]
    if isinstance(key, str):
        calls.append(lambda: storage.write_checkpoint(record(1, key=key)))
    for call in calls:
        with pytest.raises(UnsafePathError, match="unsafe pipeline key"):
            call()


@pytest.mark.parametrize("key", ["a", "A_b.c=d-e", "_x", "0", "k" * 200, "dag=etl.run-1"])
def test_safe_pipeline_keys_are_accepted(key: str) -> None:
    assert validate_pipeline_key(key) == key


@pytest.mark.parametrize(
    ("relpath", "rule"),
    [
        ("../other/state", "contains '..'"),
        ("a/../../b", "contains '..'"),
        ("/abs/state", "an empty name"),
        ("a//b", "an empty name"),
        ("a/", "an empty name"),
        ("", "it is empty"),
        ("./a", "contains '.'"),
        ("a\\b", "contains 'a\\\\b'"),
        ("a\x00b", "contains 'a\\x00b'"),
        ("ключ/state", "contains 'ключ'"),
        ("chk-1/_metadata", "reserved for checkpoint metadata"),
        ("_metadata", "reserved for checkpoint metadata"),
        ("/".join(["d"] * 33), "33 levels deep"),
        ("n" * 201, "contains 'nnnn"),
    ],
)
def test_hostile_state_paths_are_refused(
    storage: CheckpointStorage, relpath: str, rule: str
) -> None:
    with pytest.raises(UnsafePathError, match="unsafe state path") as caught:
        validate_state_path(relpath)
    assert rule in str(caught.value)
    with pytest.raises(UnsafePathError):
        storage.write_state(KEY, relpath, b"x")
    with pytest.raises(UnsafePathError):
        storage.resolve_handle(KEY, relpath)


def test_resolve_handle_refuses_a_handle_that_escapes_the_pipeline_dir(
    storage: CheckpointStorage,
) -> None:
    escaping = StateHandle(
        name="evil", path="../other_pipeline/chk-1/state", size=0, sha256="0" * 64
    )
    with pytest.raises(UnsafePathError, match=r"contains '\.\.'"):
        storage.resolve_handle(KEY, escaping)
    with pytest.raises(UnsafePathError):
        storage.read_state(KEY, escaping)


def test_resolve_handle_stays_under_the_pipeline_dir(storage: CheckpointStorage) -> None:
    resolved = storage.resolve_handle(KEY, "chk-1/a/state%3A0.bin")
    assert resolved == f"{storage.pipeline_dir(KEY)}/chk-1/a/state%3A0.bin"


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../escape/chk-1",
        f"{KEY}/../other/chk-1",
        f"{KEY}/chk-1/../../x/chk-1",
        f"{KEY}",
        f"{KEY}/chk-1/extra/_metadata",
        f"{KEY}/chk-01",
        f"{KEY}/chk-0",
        f"{KEY}/checkpoint-1",
        f"..{KEY}/chk-1",
        f"{KEY}//chk-1",
        f"{KEY}/chk-1\x00",
        "s3://bucket/ckpt/key/chk-1",
    ],
)
def test_read_checkpoint_refuses_paths_that_are_not_checkpoints_under_the_root(
    storage: CheckpointStorage, path: str
) -> None:
    with pytest.raises(UnsafePathError):
        storage.read_checkpoint(path)
    with pytest.raises(UnsafePathError):
        storage.discard_checkpoint(path)


def test_paths_outside_the_root_are_named_in_the_error(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "root"))
    (tmp_path / "root-sibling" / KEY / "chk-1").mkdir(parents=True)
    with pytest.raises(UnsafePathError, match="is outside checkpoint storage"):
        storage.read_checkpoint(f"{tmp_path}/root-sibling/{KEY}/chk-1")


@pytest.mark.parametrize("checkpoint_id", [0, -1, True, 1.0, "1", None])
def test_invalid_checkpoint_ids_are_refused(storage: CheckpointStorage, checkpoint_id: Any) -> None:
    with pytest.raises(UnsafePathError, match="invalid checkpoint id"):
        storage.checkpoint_dir(KEY, checkpoint_id)


# -- run ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "encoded"),
    [
        (
            "manual__2026-11-22T03:45:16.123456+00:00",
            "manual__2026-11-22T03%3A45%3A16.123456%2B00%3A00",
        ),
        ("scheduled__2026-01-01T00:00:00+00:00", "scheduled__2026-01-01T00%3A00%3A00%2B00%3A00"),
        ("../../etc", "..%2F..%2Fetc"),
        ("a/b", "a%2Fb"),
        ("ключ", "%D0%BA%D0%BB%D1%8E%D1%87"),
        ("100%", "100%25"),
        ("~tilde", "%7Etilde"),
        ("nul\x00", "nul%00"),
        ("...", "..."),
    ],
)
def test_run_ids_encode_to_one_safe_component(run_id: str, encoded: str) -> None:
    assert encode_run_id(run_id) == encoded
    assert decode_run_id(encoded) == run_id


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_run_id_encoding_is_reversible_and_safe(run_id: str) -> None:
    try:
        encoded = encode_run_id(run_id)
    except UnsafePathError as exc:
        # '.' and '..'; or non-ASCII text whose %XX escapes exceed the 200-character limit
        too_long = "is too long" in str(exc) and len(run_id.encode("utf-8")) * 3 > 200
        assert run_id in (".", "..") or too_long, exc
        return
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-%")
    assert encoded not in (".", "..")
    assert decode_run_id(encoded) == run_id


@pytest.mark.parametrize(
    ("run_id", "problem"),
    [
        ("", "non-empty string"),
        (".", "'.' and '..' name directories"),
        ("..", "'.' and '..' name directories"),
        ("r" * 201, "encodes to 201 characters, the limit is 200"),
        (":" * 67, "encodes to 201 characters"),
        ("bad\ud800", "not valid Unicode"),
        (None, "non-empty string"),
    ],
)
def test_unsafe_run_ids_are_refused(run_id: Any, problem: str) -> None:
    with pytest.raises(UnsafePathError, match=problem):
        encode_run_id(run_id)


@pytest.mark.parametrize(
    ("component", "problem"),
    [
        ("%41", "not in canonical form"),
        ("%2f", "use only"),
        ("%4", "use only"),
        ("a/b", "use only"),
        ("a~b", "use only"),
        ("", "use only"),
        ("%FF", "not UTF-8"),
    ],
)
def test_decode_run_id_refuses_what_encode_never_produces(component: str, problem: str) -> None:
    with pytest.raises(UnsafePathError, match=problem):
        decode_run_id(component)


# -- state files ------------------------------------------------------------------------------


def test_write_and_read_state(storage: CheckpointStorage) -> None:
    data = b"\x00state\xff" * 100
    handle = storage.write_state(KEY, "chk-1/agg/windows.bin", data, name="windows")
    assert handle == StateHandle(
        name="windows",
        path="chk-1/agg/windows.bin",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    assert storage.read_state(KEY, handle) == data
    default_name = storage.write_state(KEY, "shared/broadcast.json", b"{}")
    assert default_name.name == "broadcast.json"


def test_corrupt_state_is_refused_naming_the_file(storage: CheckpointStorage) -> None:
    handle = storage.write_state(KEY, "chk-1/agg/windows.bin", b"abcdef")
    fs_path = storage._to_fs_path(storage.resolve_handle(KEY, handle))
    storage.fs.pipe_file(fs_path, b"abcdeX")
    with pytest.raises(StorageError) as caught:
        storage.read_state(KEY, handle)
    message = str(caught.value)
    assert storage.resolve_handle(KEY, handle) in message
    assert "'windows.bin'" in message
    assert "corrupt" in message
    assert hashlib.sha256(b"abcdeX").hexdigest() in message


def test_truncated_state_is_refused(storage: CheckpointStorage) -> None:
    handle = storage.write_state(KEY, "s.bin", b"abcdef")
    storage.fs.pipe_file(storage._to_fs_path(storage.resolve_handle(KEY, handle)), b"abc")
    with pytest.raises(StorageError, match=r"expected 6 bytes .* found 3 bytes"):
        storage.read_state(KEY, handle)


def test_missing_state_is_refused(storage: CheckpointStorage) -> None:
    handle = StateHandle(name="gone", path="chk-1/gone.bin", size=1, sha256="0" * 64)
    with pytest.raises(
        StorageError, match=r"state file .*chk-1/gone.bin \(handle 'gone'\) is missing"
    ):
        storage.read_state(KEY, handle)


# -- atomic, durable writes -------------------------------------------------------------------


def put(storage: CheckpointStorage, fs_path: str, data: bytes) -> None:
    """Plant a file behind the storage's back (creating directories on local disk)."""
    storage.fs.makedirs(fs_path.rsplit("/", 1)[0], exist_ok=True)
    storage.fs.pipe_file(fs_path, data)


def files_under(storage: CheckpointStorage, uri: str) -> list[str]:
    fs_path = storage._to_fs_path(uri)
    return sorted(p.rsplit("/", 1)[-1] for p in storage.fs.find(fs_path))


def half_write_then_crash(original: Any) -> Any:
    def write(self: Any, data: bytes) -> int:
        original(self, data[: len(data) // 2])
        raise OSError("simulated crash: disk full after half the bytes")

    return write


def cannot_delete(*args: Any, **kwargs: Any) -> None:
    raise OSError("the process is dead, it deletes nothing")


@pytest.mark.parametrize(
    ("writer_class", "fs_class"),
    [(LocalFileOpener, LocalFileSystem), (MemoryFile, MemoryFileSystem)],
    ids=["local-file", "memory-file"],
)
def test_a_crash_mid_write_leaves_no_partial_metadata(
    writer_class: Any,
    fs_class: Any,
    tmp_path: Path,
    memory_root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = str(tmp_path) if writer_class is LocalFileOpener else memory_root
    storage = CheckpointStorage(root)
    previous, _ = storage.write_checkpoint(record(1))
    monkeypatch.setattr(writer_class, "write", half_write_then_crash(writer_class.write))
    monkeypatch.setattr(fs_class, "rm_file", cannot_delete)  # no cleanup after a real crash
    with pytest.raises(StorageError, match="simulated crash"):
        storage.write_checkpoint(record(2))
    monkeypatch.undo()
    assert not storage.fs.exists(storage._to_fs_path(storage.metadata_path(KEY, 2)))
    leftovers = files_under(storage, storage.checkpoint_dir(KEY, 2))
    assert len(leftovers) == 1
    assert leftovers[0].startswith("._metadata.tmp-")
    assert storage.list_checkpoints(KEY) == [(1, previous)]
    assert storage.read_checkpoint(previous) == record(1)
    with pytest.raises(MetadataError, match="no checkpoint metadata"):
        storage.read_checkpoint(storage.checkpoint_dir(KEY, 2))
    path, _ = storage.write_checkpoint(record(2))  # the retry after restart succeeds
    assert storage.read_checkpoint(path) == record(2)


@pytest.mark.parametrize(
    "writer_class", [LocalFileOpener, MemoryFile], ids=["local-file", "memory-file"]
)
def test_a_failed_write_removes_its_temporary_file(
    writer_class: Any, tmp_path: Path, memory_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path) if writer_class is LocalFileOpener else memory_root
    storage = CheckpointStorage(root)
    monkeypatch.setattr(writer_class, "write", half_write_then_crash(writer_class.write))
    with pytest.raises(StorageError, match="simulated crash"):
        storage.write_state(KEY, "chk-1/a/state.bin", b"0123456789")
    monkeypatch.undo()
    assert files_under(storage, storage.checkpoint_dir(KEY, 1)) == []


def test_a_crash_before_the_rename_leaves_no_metadata_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage(str(tmp_path))
    previous, _ = storage.write_checkpoint(record(1))

    def crash(*args: Any) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(atomic_module.os, "replace", crash)
    with pytest.raises(StorageError, match="before rename"):
        storage.write_checkpoint(record(2))
    monkeypatch.undo()
    assert not (tmp_path / KEY / "chk-2" / "_metadata").exists()
    assert list((tmp_path / KEY / "chk-2").iterdir()) == []
    assert storage.list_checkpoints(KEY) == [(1, previous)]


def test_a_crash_before_the_rename_leaves_no_metadata_memory(
    memory_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage(memory_root)
    previous, _ = storage.write_checkpoint(record(1))

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(storage.fs, "mv", crash)
    with pytest.raises(StorageError, match="before rename"):
        storage.write_checkpoint(record(2))
    monkeypatch.undo()
    assert not storage.fs.exists(storage._to_fs_path(storage.metadata_path(KEY, 2)))
    assert storage.list_checkpoints(KEY) == [(1, previous)]


def test_a_killed_writer_leaves_only_an_ignored_temporary_file(tmp_path: Path) -> None:
    """SIGKILL mid-write: no cleanup runs, the half-written temp file stays; it is invisible."""
    storage = CheckpointStorage(str(tmp_path))
    previous, _ = storage.write_checkpoint(record(1))
    chk2 = tmp_path / KEY / "chk-2"
    chk2.mkdir()
    (chk2 / f"._metadata.tmp-{uuid.uuid4().hex}").write_bytes(dump_metadata(record(2))[:40])
    assert storage.list_checkpoints(KEY) == [(1, previous)]
    with pytest.raises(MetadataError, match="no checkpoint metadata"):
        storage.read_checkpoint(str(chk2))
    path, _ = storage.write_checkpoint(record(2))
    assert storage.read_checkpoint(path) == record(2)


def test_local_writes_fsync_the_file_and_the_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(atomic_module.os, "fsync", recording_fsync)
    storage = CheckpointStorage(str(tmp_path))
    storage.write_checkpoint(record(6))
    chk = tmp_path / KEY / "chk-6"
    assert len(synced) == 3
    assert synced[0].startswith(f"{chk}/._metadata.tmp-")  # the data, before the rename
    assert synced[1:] == [str(chk), str(tmp_path / KEY)]  # the rename, and the new directory


class RecordingObjectStore(MemoryFileSystem):
    """An object store stand-in: it must get one put, never a rename (not atomic there)."""

    protocol = ("s3",)
    cachable = False

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.puts.append(path)
        super().pipe_file(path, value, **kwargs)

    def mv(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("rename is not atomic on an object store")


def test_object_stores_get_a_single_put() -> None:
    fs = RecordingObjectStore()
    path = f"/bucket-{uuid.uuid4().hex}/key/chk-1/_metadata"
    try:
        atomic_write(fs, path, b"complete")
        assert fs.puts == [path]
        assert fs.cat_file(path) == b"complete"
        assert fs.find(path.rsplit("/", 1)[0]) == [path]
    finally:
        fs.rm(path.split("/")[1], recursive=True)


def test_any_fsspec_uri_works_through_the_registry(memory_root: str) -> None:
    assert fsspec.get_filesystem_class("memory") is MemoryFileSystem
    storage = CheckpointStorage(memory_root)
    assert isinstance(storage.fs, MemoryFileSystem)
    path, _ = storage.write_checkpoint(record(1))
    assert path.startswith("memory://")
    assert CheckpointStorage(memory_root).read_checkpoint(path) == record(1)
