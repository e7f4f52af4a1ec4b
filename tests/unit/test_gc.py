"""Garbage collection of intermediate outputs and superseded state (runtime/gc.py).

A real coordinator on SQLite and real files in the pipeline directory, laid out by hand the way
the runtime and the Spark stage logic lay them out; modification times are set explicitly so the
grace period and the in-flight rule are exercised deterministically.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core.errors import UnknownPipelineError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StateHandle,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.runtime import gc
from airflow_finalckpt.runtime.gc import GcBlockedError, KeepReason, collect_garbage
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "gc-demo"
NOW = time.time()


@pytest.fixture(autouse=True)
def _fresh_now() -> None:
    """File ages are relative to the real clock: take "now" when each test starts, not when
    the module was collected (a full suite runs for minutes before this test)."""
    global NOW
    NOW = time.time()


HOUR = 3600.0


@dataclass
class Env:
    coord: Coordinator
    storage: CheckpointStorage
    root: Path  # the pipeline directory
    engine_url: str

    def path(self, rel: str) -> Path:
        return self.root / rel


@pytest.fixture
def env(tmp_path: Path) -> Env:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    return Env(coord, storage, Path(storage.pipeline_dir(KEY)), url)


def chain(*stage_ids: str) -> StageGraph:
    return StageGraph.from_edges(stage_ids, list(itertools.pairwise(stage_ids)))


def set_mtime(path: Path, ts: float) -> None:
    """Set the modification time of a file, or of a directory tree and everything in it."""
    if path.is_dir():
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for name in filenames + dirnames:
                os.utime(os.path.join(dirpath, name), (ts, ts))
    os.utime(path, (ts, ts))


def write_dir(env: Env, rel: str, ts: float, files: Mapping[str, bytes] | None = None) -> Path:
    target = env.path(rel)
    target.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {"part-00000.parquet": b"p" * 100, "_SUCCESS": b""}).items():
        (target / name).write_bytes(data)
    set_mtime(target, ts)
    return target


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def output_part(env: Env, stage: str, batch: str, ts: float) -> tuple[str, StateHandle]:
    """An output part and its handle, as SparkStageLogic.output_handle writes them."""
    rel = f"data/{stage}/{batch}"
    write_dir(env, rel, ts)
    doc = {"stage_id": stage, "batch": batch, "parts": [rel]}
    handle = env.storage.write_state(
        KEY,
        f"data/{stage}/_parts/{batch}.json",
        json.dumps(doc).encode(),
        name=f"output:{rel}",
    )
    set_mtime(env.path(handle.path), ts)
    return rel, handle


def state_frame(
    env: Env, stage: str, name: str, ts: float, *, kind: str = "state", data_dir: str | None = None
) -> tuple[str, StateHandle]:
    """A state frame directory and its JSON handle, as SparkStageLogic.persist_state writes them
    (``data_dir`` puts the frame somewhere else than beside its handle)."""
    rel_dir = f"state/{stage}/{kind}_{name}/{uuid.uuid4().hex}"
    frame_dir = data_dir or rel_dir
    write_dir(env, frame_dir, ts)
    handle = env.storage.write_state(
        KEY,
        f"{rel_dir}.json",
        json.dumps({"path": frame_dir, "columns": ["k"]}).encode(),
        name=f"{kind}:{name}",
    )
    set_mtime(env.path(handle.path), ts)
    return frame_dir, handle


def finish_and_close(env: Env, stage: str, epoch: int, snapshot: StageSnapshot) -> int:
    env.coord.finish(stage, epoch, snapshot)
    cid = env.coord.closable_checkpoint(stage)
    assert cid is not None, f"{stage} should be closable on its eager final checkpoint"
    env.coord.close(stage, epoch, cid)
    return cid


def flush_retention(env: Env, graph: StageGraph) -> None:
    """Keep only the newest checkpoint, and take one now (all stages must be finished)."""
    env.coord.register(graph, CoordinatorOptions(retain_checkpoints=1))
    cid = env.coord.trigger(TriggerReason.MANUAL)
    assert cid is not None and env.coord.checkpoint(cid).state is CheckpointState.COMPLETED


# ---------------------------------------------------------------------------- state


def test_superseded_state_is_deleted_and_current_state_kept(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    epoch = env.coord.start_attempt("a", total_splits=3).epoch
    old_dir, old = state_frame(env, "a", "win", NOW - 5 * HOUR)
    # a stage-global frame whose handle document points to a directory not beside the handle
    dims_dir, dims = state_frame(
        env, "a", "dims", NOW - 5 * HOUR, kind="global", data_dir="state/a/frames/dims-v1"
    )
    p1, h1 = output_part(env, "a", "b1", NOW - 5 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["s1"], state=[h1, dims, old])
    new_dir, new = state_frame(env, "a", "win", NOW - 4 * HOUR)
    p2, h2 = output_part(env, "a", "b2", NOW - 4 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["s2"], state=[h1, h2, dims, new])
    expected_bytes = tree_bytes(env.path(old_dir)) + tree_bytes(env.path(old.path))

    report = collect_garbage(env.coord, env.storage)

    assert sorted(report.deleted_paths) == sorted([old_dir, old.path])
    assert report.bytes_freed == expected_bytes > 0
    assert report.files_deleted == 3 and report.dirs_deleted == 1
    assert not env.path(old_dir).exists() and not env.path(old.path).exists()
    for rel in (new_dir, new.path, dims_dir, dims.path, p1, p2, h1.path, h2.path):
        assert env.path(rel).exists(), rel
    referenced = report.kept_because(KeepReason.REFERENCED)
    assert "stage a progress" in referenced[new_dir]
    assert dims_dir in referenced and "output of a needed by b (NOT_STARTED)" in referenced[p1]
    assert report.errors == ()


def test_retained_checkpoint_keeps_superseded_state_until_retention_drops_it(env: Env) -> None:
    graph = chain("a", "b")
    env.coord.register(graph)
    epoch = env.coord.start_attempt("a", total_splits=5).epoch
    s1_dir, s1 = state_frame(env, "a", "win", NOW - 5 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["x1"], state=[s1])
    cid = env.coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    outcome = env.coord.record_batch("a", epoch, finished_splits=["x2"], state=[s1])
    assert outcome.completed == (cid,)
    s2_dir, s2 = state_frame(env, "a", "win", NOW - 4 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["x3"], state=[s2])

    report = collect_garbage(env.coord, env.storage)
    assert report.deleted == ()
    assert f"checkpoint {cid}" in report.kept_because(KeepReason.REFERENCED)[s1_dir]
    assert env.path(s1_dir).exists()

    env.coord.register(graph, CoordinatorOptions(retain_checkpoints=1))
    newer = env.coord.trigger(TriggerReason.MANUAL)
    assert newer is not None
    env.coord.record_batch("a", epoch, finished_splits=["x4"], state=[s2])
    assert env.coord.checkpoint(cid).state is CheckpointState.DISCARDED

    report = collect_garbage(env.coord, env.storage)
    assert sorted(report.deleted_paths) == sorted([s1_dir, s1.path])
    assert env.path(s2_dir).exists() and not env.path(s1_dir).exists()


def test_pending_checkpoint_acknowledgement_protects_superseded_state(env: Env) -> None:
    env.coord.register(StageGraph.from_edges(["a", "b"], []))
    a = env.coord.start_attempt("a", total_splits=5).epoch
    b = env.coord.start_attempt("b", total_splits=5).epoch
    s1_dir, s1 = state_frame(env, "a", "win", NOW - 5 * HOUR)
    env.coord.record_batch("a", a, finished_splits=["x1"], state=[s1])
    cid = env.coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    env.coord.record_batch("a", a, finished_splits=["x2"], state=[s1])  # acks cid with s1
    _s2_dir, s2 = state_frame(env, "a", "win", NOW - 4 * HOUR)
    env.coord.record_batch("a", a, finished_splits=["x3"], state=[s2])  # s1 superseded live
    assert env.coord.checkpoint(cid).state is CheckpointState.PENDING  # b has not answered

    report = collect_garbage(env.coord, env.storage)
    assert report.deleted == ()
    assert f"pending checkpoint {cid}" in report.kept_because(KeepReason.REFERENCED)[s1_dir]

    assert env.coord.record_batch("b", b, finished_splits=["y1"]).completed == (cid,)
    report = collect_garbage(env.coord, env.storage)
    assert report.deleted == ()
    assert f"checkpoint {cid}" in report.kept_because(KeepReason.REFERENCED)[s1_dir]
    assert env.storage.read_checkpoint(str(env.coord.checkpoint(cid).metadata_path)).stages[
        "a"
    ].state == (s1,)


def test_savepoint_keeps_its_state_after_checkpoint_retention(env: Env) -> None:
    graph = chain("a", "b")
    env.coord.register(graph)
    epoch = env.coord.start_attempt("a", total_splits=5).epoch
    s1_dir, s1 = state_frame(env, "a", "win", NOW - 5 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["x1"], state=[s1])
    stop = env.coord.request_stop(StopMode.SAVEPOINT)
    env.coord.record_batch("a", epoch)  # the batch boundary answers the savepoint
    env.coord.suspend("a", epoch)
    savepoint = stop.savepoint_id
    assert env.coord.stop_request().state is StopState.COMPLETED  # type: ignore[union-attr]
    env.coord.resume()
    epoch = env.coord.start_attempt("a", total_splits=5).epoch
    _s2_dir, s2 = state_frame(env, "a", "win", NOW - 4 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["x2"], state=[s2])
    env.coord.register(graph, CoordinatorOptions(retain_checkpoints=1))
    for _ in range(2):
        assert env.coord.trigger(TriggerReason.MANUAL) is not None
        env.coord.record_batch("a", epoch, state=[s2])

    report = collect_garbage(env.coord, env.storage)
    assert report.deleted == ()
    assert f"savepoint {savepoint}" in report.kept_because(KeepReason.REFERENCED)[s1_dir]


def test_frame_beside_a_missing_handle_document_is_kept(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    epoch = env.coord.start_attempt("a", total_splits=3).epoch
    frame_dir, handle = state_frame(env, "a", "win", NOW - 5 * HOUR)
    env.coord.finish("a", epoch, StageSnapshot(state=(handle,)))
    env.path(handle.path).unlink()  # the document is lost: its conventional frame stays
    report = collect_garbage(env.coord, env.storage, grace_s=0)
    assert report.deleted == ()
    assert env.path(frame_dir).exists()
    assert any(handle.path in note and "missing" in note for note in report.notes)


# ---------------------------------------------------------------------------- outputs


def test_output_parts_live_until_downstream_closed_and_no_checkpoint_needs_them(
    env: Env,
) -> None:
    graph = chain("a", "b")
    env.coord.register(graph)
    a = env.coord.start_attempt("a", total_splits=2).epoch
    p1, h1 = output_part(env, "a", "b1", NOW - 5 * HOUR)
    env.coord.record_batch("a", a, finished_splits=["d1"], state=[h1])
    p2, h2 = output_part(env, "a", "b2", NOW - 5 * HOUR)
    env.coord.record_batch("a", a, finished_splits=["d2"], state=[h1, h2])
    cp_a = finish_and_close(
        env, "a", a, StageSnapshot(state=(h1, h2), end_of_data=EndOfData(manifest=[p1, p2]))
    )

    def kept_parts() -> dict[str, str]:
        report = collect_garbage(env.coord, env.storage)
        assert report.deleted == ()
        referenced = report.kept_because(KeepReason.REFERENCED)
        assert {p1, p2} <= set(referenced)
        return referenced

    assert "needed by b (NOT_STARTED)" in kept_parts()[p1]
    b = env.coord.start_attempt("b", total_splits=2).epoch
    pb, hb = output_part(env, "b", "c1", NOW - 4 * HOUR)
    env.coord.record_batch("b", b, finished_splits=[p1], state=[hb])
    assert "needed by b (RUNNING)" in kept_parts()[p2]
    finish_and_close(env, "b", b, StageSnapshot(state=(hb,), end_of_data=EndOfData(manifest=[pb])))
    assert env.coord.stage("b").lifecycle is StageLifecycle.CLOSED
    # b is CLOSED, but a retained checkpoint still records it NOT_STARTED: a restore re-reads
    assert f"b (NOT_STARTED in checkpoint {cp_a})" in kept_parts()[p1]

    flush_retention(env, graph)
    report = collect_garbage(env.coord, env.storage)
    assert sorted(report.deleted_paths) == sorted([p1, p2])
    assert not env.path(p1).exists() and not env.path(p2).exists()
    # the handles stay (the closed stage's final snapshot names them); b's parts are the output
    assert env.path(h1.path).exists() and env.path(h2.path).exists()
    assert env.path(pb).exists()
    assert "no downstream stage" in report.kept_because(KeepReason.REFERENCED)[pb]
    assert any("output parts of stage a are consumed" in n for n in report.notes)


def test_diamond_parts_needed_until_every_downstream_stage_closed(env: Env) -> None:
    graph = StageGraph.from_edges(["src", "l", "r"], [("src", "l"), ("src", "r")])
    env.coord.register(graph)
    s = env.coord.start_attempt("src", total_splits=1).epoch
    part, handle = output_part(env, "src", "b1", NOW - 5 * HOUR)
    finish_and_close(
        env, "src", s, StageSnapshot(state=(handle,), end_of_data=EndOfData(manifest=[part]))
    )
    left = env.coord.start_attempt("l", total_splits=1).epoch
    finish_and_close(env, "l", left, StageSnapshot(finished_splits=frozenset({part})))
    report = collect_garbage(env.coord, env.storage)
    assert report.deleted == ()
    assert "needed by r (NOT_STARTED)" in report.kept_because(KeepReason.REFERENCED)[part]
    right = env.coord.start_attempt("r", total_splits=1).epoch
    finish_and_close(env, "r", right, StageSnapshot(finished_splits=frozenset({part})))
    flush_retention(env, graph)
    assert collect_garbage(env.coord, env.storage).deleted_paths == [part]


# ---------------------------------------------------------------------------- in flight


def test_grace_period_and_in_flight_batches_of_running_stages_are_kept(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    epoch = env.coord.start_attempt("a", total_splits=9).epoch
    _p1, h1 = output_part(env, "a", "b1", NOW - 3 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["s1"], state=[h1])
    leftover = write_dir(env, "data/a/b0-crashed", NOW - 4 * HOUR)  # before the last record
    slow = write_dir(env, "data/a/b2-slow", NOW - 1 * HOUR)  # after it, older than the grace
    young = write_dir(env, "data/a/b3-young", NOW - 60)
    foreign = write_dir(env, "data/other/x", NOW - 1 * HOUR)  # not a running stage's

    report = collect_garbage(env.coord, env.storage, grace_s=600)

    assert sorted(report.deleted_paths) == ["data/a/b0-crashed", "data/other/x"]
    assert not leftover.exists() and not foreign.exists()
    assert slow.exists() and young.exists()
    assert "data/a/b2-slow" in report.kept_because(KeepReason.IN_FLIGHT)
    assert "grace period 600 s" in report.kept_because(KeepReason.GRACE)["data/a/b3-young"]
    # with no grace at all the running stage's unrecorded batches are still protected
    report = collect_garbage(env.coord, env.storage, grace_s=0)
    assert report.deleted == ()
    assert set(report.kept_because(KeepReason.IN_FLIGHT)) == {"data/a/b2-slow", "data/a/b3-young"}
    # once the stage is no longer running, nothing of it is in flight
    env.coord.finish("a", epoch, StageSnapshot(state=(h1,)))
    report = collect_garbage(env.coord, env.storage, grace_s=600, clock=lambda: NOW + HOUR)
    assert sorted(report.deleted_paths) == ["data/a/b2-slow", "data/a/b3-young"]


def test_running_stage_without_recorded_batch_keeps_all_its_files(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    env.coord.start_attempt("a", total_splits=9)
    write_dir(env, "data/a/b1", NOW - 5 * HOUR)
    write_dir(env, "state/a/state_win/0123", NOW - 5 * HOUR)
    report = collect_garbage(env.coord, env.storage, grace_s=0)
    assert report.deleted == ()
    assert set(report.kept_because(KeepReason.IN_FLIGHT)) == {
        "data/a/b1",
        "state/a/state_win/0123",
    }


def test_temporary_files_of_cut_short_writes_go_where_their_directory_stays(env: Env) -> None:
    """FC-5: a crash inside an atomic write leaves ``.<name>.tmp-<hex>``; inside a kept unit
    (a referenced output part) or a retained checkpoint directory nothing else removes it."""
    env.coord.register(chain("a", "b"))
    epoch = env.coord.start_attempt("a", total_splits=9).epoch
    p1, h1 = output_part(env, "a", "b1", NOW - 3 * HOUR)
    env.coord.record_batch("a", epoch, finished_splits=["s1"], state=[h1])
    cid = env.coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    env.coord.record_batch("a", epoch, finished_splits=["s2"], state=[h1])
    assert env.coord.checkpoint(cid).state is CheckpointState.COMPLETED

    def temp(rel: str, ts: float) -> Path:
        path = env.path(rel)
        path.write_bytes(b"partial")
        set_mtime(path, ts)
        return path

    # older than the stage's last recorded batch (its handle, 3 hours ago): not in flight
    old_in_part = temp(f"{p1}/.part-00001.parquet.tmp-0a0a", NOW - 4 * HOUR)
    young_in_part = temp(f"{p1}/.part-00002.parquet.tmp-0b0b", NOW - 60)
    old_in_chk = temp(f"chk-{cid}/._metadata.tmp-0c0c", NOW - 2 * HOUR)
    metadata = env.path(f"chk-{cid}/_metadata")

    dry = collect_garbage(env.coord, env.storage, grace_s=600, dry_run=True)
    assert old_in_part.exists() and old_in_chk.exists()
    report = collect_garbage(env.coord, env.storage, grace_s=600)
    expected = sorted([f"{p1}/.part-00001.parquet.tmp-0a0a", f"chk-{cid}/._metadata.tmp-0c0c"])
    assert sorted(dry.deleted_paths) == sorted(report.deleted_paths) == expected
    assert report.files_deleted == 2 and report.dirs_deleted == 0
    assert not old_in_part.exists() and not old_in_chk.exists()
    assert young_in_part.exists() and metadata.exists()  # within the grace period; not a temp
    assert env.path(p1).is_dir() and env.path(h1.path).exists()
    # a running stage's temporary file newer than its last recorded batch may be in flight
    set_mtime(young_in_part, NOW - HOUR)
    report = collect_garbage(env.coord, env.storage, grace_s=0)
    assert report.deleted == () and young_in_part.exists()
    env.coord.finish("a", epoch, StageSnapshot(state=(h1,)))
    report = collect_garbage(env.coord, env.storage, grace_s=0)
    assert report.deleted_paths == [f"{p1}/.part-00002.parquet.tmp-0b0b"]


# ---------------------------------------------------------------------------- safety


def test_dry_run_deletes_nothing_and_a_second_run_is_a_no_op(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    garbage = [write_dir(env, f"state/a/state_win/{i}", NOW - 5 * HOUR) for i in range(3)]
    dry = collect_garbage(env.coord, env.storage, dry_run=True)
    assert dry.dry_run and len(dry.deleted) == 3
    assert all(p.exists() for p in garbage)
    real = collect_garbage(env.coord, env.storage)
    assert real.deleted == dry.deleted and real.bytes_freed == dry.bytes_freed > 0
    assert not any(p.exists() for p in garbage)
    again = collect_garbage(env.coord, env.storage)
    assert again.deleted == () and again.errors == ()


def test_never_touches_checkpoints_scaffolding_or_anything_outside(env: Env) -> None:
    graph = chain("a", "b")
    env.coord.register(graph)
    epoch = env.coord.start_attempt("a", total_splits=1).epoch
    finish_and_close(env, "a", epoch, StageSnapshot())
    chk = env.path("chk-999")
    write_dir(env, "chk-999", NOW - 9 * HOUR, {"_metadata": b"not ours"})
    faults = write_dir(env, "faults", NOW - 9 * HOUR, {"enrich.crashed": b"x"})
    sibling = env.root.parent / "other-pipeline" / "data" / "a" / "b1"
    sibling.mkdir(parents=True)
    (sibling / "part-0.parquet").write_bytes(b"x")
    set_mtime(sibling, NOW - 9 * HOUR)
    temp = env.path("data/a/_parts/.b9.json.tmp-0f0f")
    temp.parent.mkdir(parents=True)
    temp.write_bytes(b"{")
    set_mtime(temp, NOW - 9 * HOUR)
    empty_stage_dir = env.path("state/a/state_win")
    empty_stage_dir.mkdir(parents=True)
    set_mtime(empty_stage_dir, NOW - 9 * HOUR)

    report = collect_garbage(env.coord, env.storage, grace_s=0)

    assert report.deleted_paths == ["data/a/_parts/.b9.json.tmp-0f0f"]
    assert chk.exists() and faults.exists() and sibling.exists()
    assert env.path("data/a/_parts").is_dir() and empty_stage_dir.is_dir()


def test_files_vanishing_under_a_collector_are_fine(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.coord.register(chain("a", "b"))
    for i in range(4):
        write_dir(env, f"state/a/state_win/{i}", NOW - 5 * HOUR)
    real_rm = env.storage.fs.rm

    def rm_raced(path: str, recursive: bool = False, **kw: object) -> None:
        if path.endswith("/1"):  # another collector deletes this one first
            real_rm(path, recursive=True)
        real_rm(path, recursive=recursive, **kw)

    monkeypatch.setattr(env.storage.fs, "rm", rm_raced)
    report = collect_garbage(env.coord, env.storage)
    assert report.errors == ()
    assert sorted(report.deleted_paths) == [f"state/a/state_win/{i}" for i in (0, 2, 3)]
    assert list(env.path("state/a/state_win").iterdir()) == []


def test_concurrent_collectors_delete_each_unit_once(env: Env) -> None:
    env.coord.register(chain("a", "b"))
    expected = [f"state/a/state_win/{i:02d}" for i in range(24)]
    for rel in expected:
        write_dir(env, rel, NOW - 5 * HOUR)
    kept_dir, kept = state_frame(env, "b", "win", NOW - 5 * HOUR)
    epoch = env.coord.start_attempt("b", total_splits=1).epoch
    env.coord.finish("b", epoch, StageSnapshot(state=(kept,)))
    barrier = threading.Barrier(3)
    reports: list[gc.GcReport] = []
    failures: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            reports.append(collect_garbage(env.coord, env.storage))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == [] and len(reports) == 3
    assert all(r.errors == () for r in reports)
    deleted = [p for r in reports for p in r.deleted_paths]
    assert sorted(deleted) == expected  # each unit reported by exactly one collector
    assert not any(env.path(rel).exists() for rel in expected)
    assert env.path(kept_dir).exists() and env.path(kept.path).exists()


def test_unreadable_retained_checkpoint_blocks_collection(env: Env) -> None:
    graph = chain("a", "b")
    env.coord.register(graph)
    epoch = env.coord.start_attempt("a", total_splits=1).epoch
    cid = finish_and_close(env, "a", epoch, StageSnapshot())
    garbage = write_dir(env, "state/a/state_win/0", NOW - 5 * HOUR)
    metadata = Path(str(env.coord.checkpoint(cid).metadata_path))
    metadata.write_bytes(b'{"truncated":')

    with pytest.raises(GcBlockedError, match=f"checkpoint {cid}"):
        collect_garbage(env.coord, env.storage)
    assert garbage.exists()

    metadata.unlink()  # gone (e.g. discarded meanwhile): nothing can restore from it
    report = collect_garbage(env.coord, env.storage)
    assert report.deleted_paths == ["state/a/state_win/0"]
    assert any("is gone" in note for note in report.notes)


def test_unknown_pipeline_and_bad_grace(env: Env) -> None:
    with pytest.raises(UnknownPipelineError):
        collect_garbage(Coordinator(env.coord.engine, "nope"), env.storage)
    env.coord.register(chain("a", "b"))
    with pytest.raises(ValueError, match="grace"):
        collect_garbage(env.coord, env.storage, grace_s=-1)


def test_works_on_a_non_local_filesystem(tmp_path: Path) -> None:
    """memory:// stands in for an object store: URIs, no directory modification times."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    ensure_schema(engine)
    storage = CheckpointStorage(f"memory://gc-{uuid.uuid4().hex}")
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(chain("a", "b"))
    epoch = coord.start_attempt("a", total_splits=1).epoch
    kept = storage.write_state(KEY, "state/a/state_win/new.json", b'{"path": "state/a/x/new"}')
    storage.write_state(KEY, "state/a/x/new/part-0.parquet", b"n" * 10)
    storage.write_state(KEY, "state/a/state_win/old.json", b'{"path": "state/a/x/old"}')
    storage.write_state(KEY, "state/a/x/old/part-0.parquet", b"o" * 10)
    coord.finish("a", epoch, StageSnapshot(state=(kept.model_copy(update={"name": "state:win"}),)))

    report = collect_garbage(coord, storage, clock=lambda: time.time() + HOUR)

    assert sorted(report.deleted_paths) == ["state/a/state_win/old.json", "state/a/x/old"]
    assert report.bytes_freed == len(b'{"path": "state/a/x/old"}') + 10
    fs = storage.fs
    assert fs.exists(storage.resolve_handle(KEY, "state/a/x/new/part-0.parquet"))
    assert not fs.exists(storage.resolve_handle(KEY, "state/a/x/old/part-0.parquet"))


# ---------------------------------------------------------------------------- after close


class _NoopLogic:
    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        pass

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


def _run_and_close(env: Env) -> EndOfData | None:
    env.coord.register(chain("a", "b"))
    spec = StageSpec(pipeline_key=KEY, stage_id="a", splits=("s1", "s2"), batch_size=1)
    runner = StageRunner(env.coord, spec, _NoopLogic())
    runner.run()
    return runner.try_close()


def test_closing_a_stage_collects_garbage(env: Env) -> None:
    garbage = write_dir(env, "state/a/state_win/old", NOW - 5 * HOUR)
    young = write_dir(env, "state/a/state_win/young", NOW - 10)
    assert _run_and_close(env) is not None
    assert env.coord.stage("a").lifecycle is StageLifecycle.CLOSED
    assert not garbage.exists()
    assert young.exists()  # the default grace period applies


def test_a_failing_collection_does_not_fail_the_close(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object, **_kw: object) -> gc.GcReport:
        raise RuntimeError("storage on fire")

    monkeypatch.setattr(gc, "collect_garbage", broken)
    with caplog.at_level(logging.WARNING):
        assert _run_and_close(env) is not None
    assert env.coord.stage("a").lifecycle is StageLifecycle.CLOSED
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("storage on fire" in r.getMessage() for r in warnings)


def test_gc_never_deletes_what_a_retained_savepoint_references(env: Env, tmp_path: Path) -> None:
    """Everything a retained savepoint references survives collection: in the pipeline
    directory (a restore in place) and in the savepoint's own copy (the savepoint directory
    copied alone to another root restores, every file verified)."""
    import shutil

    from airflow_finalckpt.storage.savepoint_files import bundled_files

    graph = chain("a", "b")
    env.coord.register(graph)
    a = env.coord.start_attempt("a", total_splits=2).epoch
    p1, h1 = output_part(env, "a", "b1", NOW - 5 * HOUR)
    p2, h2 = output_part(env, "a", "b2", NOW - 5 * HOUR)
    env.coord.record_batch("a", a, finished_splits=["d1", "d2"], state=[h1, h2])
    finish_and_close(
        env, "a", a, StageSnapshot(state=(h1, h2), end_of_data=EndOfData(manifest=[p1, p2]))
    )
    b = env.coord.start_attempt("b", total_splits=2).epoch
    s1_dir, s1 = state_frame(env, "b", "win", NOW - 5 * HOUR)
    g_dir, g = state_frame(env, "b", "dim", NOW - 5 * HOUR, kind="global")
    pb1, hb1 = output_part(env, "b", "c1", NOW - 5 * HOUR)
    env.coord.record_batch("b", b, finished_splits=[p1], state=[s1, g, hb1])
    stop = env.coord.request_stop(StopMode.SAVEPOINT)
    env.coord.record_batch("b", b)
    env.coord.suspend("b", b)
    assert env.coord.stop_request().state is StopState.COMPLETED  # type: ignore[union-attr]
    savepoint = env.coord.checkpoint(stop.savepoint_id or 0).metadata_path
    assert savepoint is not None
    referenced = set(bundled_files(env.storage, savepoint))
    assert {f"{p1}/_SUCCESS", f"{p2}/_SUCCESS", f"{s1_dir}/_SUCCESS", f"{g_dir}/_SUCCESS"} <= (
        referenced
    )
    # the run goes on to the end: superseded state, consumed parts, retention of checkpoints
    env.coord.resume()
    b = env.coord.start_attempt("b", total_splits=2).epoch
    _s2_dir, s2 = state_frame(env, "b", "win", NOW - 4 * HOUR)
    pb2, hb2 = output_part(env, "b", "c2", NOW - 4 * HOUR)
    env.coord.record_batch("b", b, finished_splits=[p1, p2], state=[s2, g, hb1, hb2])
    unreferenced = write_dir(env, "state/b/state_win/never-recorded", NOW - 5 * HOUR)
    finish_and_close(
        env, "b", b, StageSnapshot(state=(g, hb1, hb2), end_of_data=EndOfData(manifest=[pb1, pb2]))
    )
    flush_retention(env, graph)

    report = collect_garbage(env.coord, env.storage, grace_s=0)

    assert "state/b/state_win/never-recorded" in report.deleted_paths  # collection did run
    assert not unreferenced.exists()
    for rel in referenced:
        assert env.path(rel).exists(), f"gc deleted {rel}, which savepoint {savepoint} needs"
    # the savepoint directory alone, copied to another root, still restores every file
    other = CheckpointStorage(str(tmp_path / "other-root"))
    chk = Path(savepoint).parent
    shutil.copytree(chk, tmp_path / "other-root" / KEY / chk.name)
    copied = str(tmp_path / "other-root" / KEY / chk.name)
    record = other.read_checkpoint(copied)
    assert other.materialize(record, copied) == len(referenced)
    for handle in record.stages["b"].state:
        other.read_state(KEY, handle)
    assert (tmp_path / "other-root" / KEY / s1_dir / "part-00000.parquet").read_bytes() == (
        env.path(f"{s1_dir}/part-00000.parquet").read_bytes()
    )
