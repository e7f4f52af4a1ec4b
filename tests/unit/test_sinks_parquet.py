"""ParquetTableSink: exactly-once publication on real files (rename and copy commits) and on
fsspec's in-memory filesystem (an object-store stand-in without atomic rename)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pandas as pd
import pyarrow.dataset as pads
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_finalckpt.core.errors import StorageError
from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import (
    AlreadyCommittedError,
    ForeignTransactionError,
    InvalidIdentifierError,
    NotPrecommittedError,
    ParquetTableSink,
    SinkError,
    SinkTransactionError,
    validate_identifier,
)
from airflow_finalckpt.sinks.base import SAFE_IDENTIFIER

HOSTILE_IDS = [
    "",
    ".",
    "..",
    "../x",
    "../../etc/passwd",
    "a/b",
    "/abs",
    "a\\b",
    "a\x00b",
    "x" * 300,
    "caf\u00e9",
    "\u0442\u0445\u043d",
    "a b",
    "a\n",
    "-leading-dash",
    ".hidden",
    "a=b",
]

SinkFactory = Callable[..., ParquetTableSink]


@pytest.fixture(params=["rename-local", "copy-local", "copy-memory"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(table URI, commit mode): local tables in both modes, and a memory:// table."""
    mode, where = request.param.split("-")
    if where == "local":
        yield str(tmp_path / "table"), mode
        return
    uri = f"memory://finalckpt-tests/{uuid.uuid4().hex}/table"
    yield uri, mode
    fs, root = fsspec.core.url_to_fs(uri)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def make_sink(location: tuple[str, str]) -> SinkFactory:
    """New sink objects on the same table: a fresh one per call simulates a restarted process."""
    uri, mode = location

    def factory(sink_id: str = "orders_sink") -> ParquetTableSink:
        return ParquetTableSink(sink_id, uri, commit_mode=mode)  # type: ignore[arg-type]

    return factory


def frame(*values: int) -> pd.DataFrame:
    return pd.DataFrame({"order_id": list(values), "amount": [v * 1.5 for v in values]})


def committed_ids(sink: ParquetTableSink) -> list[int]:
    data = sink.read_pandas()
    return sorted(data["order_id"].tolist()) if len(data.columns) else []


def stage(sink: ParquetTableSink, txn_id: str, *values: int, ckpt: int = 1) -> SinkTransaction:
    sink.write_pandas(txn_id, frame(*values))
    return sink.precommit(txn_id, ckpt)


# -- commit ----------------------------------------------------------------------------------


def test_commit_publishes_exactly_the_staged_rows(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.write_pandas("s1-e1-b1", frame(1, 2))
    sink.write_pandas("s1-e1-b1", frame(3))
    txn = sink.precommit("s1-e1-b1", 7)

    assert txn.sink_id == "orders_sink" and txn.txn_id == "s1-e1-b1" and txn.checkpoint_id == 7
    assert txn.payload["rows"] == 3 and len(txn.payload["files"]) == 2
    assert sink.commit(txn) is True

    data = sink.read_pandas().sort_values("order_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(data, frame(1, 2, 3))
    assert sink.is_committed("s1-e1-b1")
    assert sink.committed_txn_ids() == {"s1-e1-b1"}
    assert sink.staged_txn_ids() == set()


def test_second_commit_is_a_noop(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1, 2)

    assert sink.commit(txn) is True
    assert sink.commit(txn) is False
    assert committed_ids(sink) == [1, 2]


def test_commit_after_crash_uses_a_fresh_sink_object(make_sink: SinkFactory) -> None:
    """Crash between pre-commit and commit: the restored runtime only has the checkpoint's JSON."""
    txn_json = stage(make_sink(), "t1", 1, 2, 3).model_dump_json()

    restored = make_sink()
    assert committed_ids(restored) == []
    assert restored.commit(SinkTransaction.model_validate_json(txn_json)) is True
    assert make_sink().commit(SinkTransaction.model_validate_json(txn_json)) is False
    assert committed_ids(make_sink()) == [1, 2, 3]


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_two_transactions_commit_in_either_order(
    make_sink: SinkFactory, order: tuple[str, str]
) -> None:
    sink = make_sink()
    txns = {"a": stage(sink, "a", 1, 2, ckpt=1), "b": stage(sink, "b", 3, ckpt=2)}

    assert sink.commit(txns[order[0]]) is True
    assert committed_ids(sink) == ([1, 2] if order[0] == "a" else [3])
    assert sink.commit(txns[order[1]]) is True
    assert committed_ids(sink) == [1, 2, 3]
    assert sink.committed_txn_ids() == {"a", "b"}


def test_empty_transaction_commits(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = sink.precommit("nothing-written", 3)

    assert txn.payload["rows"] == 0 and txn.payload["files"] == []
    assert sink.commit(txn) is True
    assert sink.is_committed("nothing-written")
    assert committed_ids(sink) == []


def test_transactions_with_different_columns_read_as_one_table(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "a", 1))
    sink.write_pandas("b", pd.DataFrame({"order_id": [2], "note": ["late"]}))
    sink.commit(sink.precommit("b", 2))

    data = sink.read_pandas().sort_values("order_id").reset_index(drop=True)
    assert data["order_id"].tolist() == [1, 2]
    assert data["note"].isna().tolist() == [True, False] and data["note"][1] == "late"


# -- readers never see uncommitted data --------------------------------------------------------


def test_readers_never_see_staged_data(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "old", 1))

    sink.write_pandas("new", frame(2))
    assert committed_ids(sink) == [1]
    txn = sink.precommit("new", 2)
    assert committed_ids(sink) == [1]
    assert not any("new" in uri for uri in sink.committed_files())
    sink.commit(txn)
    assert committed_ids(sink) == [1, 2]


def test_plain_directory_readers_skip_staging(tmp_path: Path) -> None:
    """With rename commits, pyarrow/pandas directory reads see committed data only."""
    table = tmp_path / "table"
    sink = ParquetTableSink("plain", str(table), commit_mode="rename")
    sink.commit(stage(sink, "old", 1, 2))
    stage(sink, "pending", 3)  # pre-committed, never committed
    sink.write_pandas("open", frame(4))  # still open

    assert sorted(pd.read_parquet(table)["order_id"].tolist()) == [1, 2]
    assert sorted(pads.dataset(table).to_table()["order_id"].to_pylist()) == [1, 2]


def test_hidden_files_of_spark_writers_are_not_data(tmp_path: Path) -> None:
    """_SUCCESS, .crc and _temporary leftovers are neither listed, published as data, nor read."""
    sink = ParquetTableSink("spark_like", str(tmp_path / "table"), commit_mode="rename")
    sink.write_pandas("t1", frame(1, 2))
    staging = Path(sink.staging_location("t1"))
    (staging / "_SUCCESS").write_bytes(b"")
    (staging / ".part-0.parquet.crc").write_bytes(b"\x00garbage")
    (staging / "_temporary" / "0").mkdir(parents=True)
    (staging / "_temporary" / "0" / "part-half.parquet").write_bytes(b"PAR1 truncated")

    txn = sink.precommit("t1", 1)
    assert txn.payload["rows"] == 2 and len(txn.payload["files"]) == 1
    assert sink.commit(txn) is True
    assert committed_ids(sink) == [1, 2]
    assert sorted(pd.read_parquet(tmp_path / "table")["order_id"].tolist()) == [1, 2]


def test_rename_commit_publishes_the_whole_directory(tmp_path: Path) -> None:
    sink = ParquetTableSink("layout", str(tmp_path / "table"), commit_mode="rename")
    txn = stage(sink, "t1", 1)
    staging = Path(sink.staging_location("t1"))
    assert staging.is_dir() and (staging / "_manifest.json").is_file()

    sink.commit(txn)
    assert not staging.exists()
    published = tmp_path / "table" / "txn-t1"
    assert (published / "_manifest.json").is_file()
    assert [p.name for p in published.glob("*.parquet")] == txn.payload["files"]


def test_copy_commit_publishes_plain_files_and_drops_staging(tmp_path: Path) -> None:
    sink = ParquetTableSink("copier", str(tmp_path / "table"), commit_mode="copy")
    txn = stage(sink, "t1", 1, 2, ckpt=9)
    sink.commit(txn)

    published = tmp_path / "table" / "txn-t1"
    record = json.loads((published / "_manifest.json").read_text())
    assert record["checkpoint_id"] == 9 and record["rows"] == 2
    assert [entry["path"] for entry in record["files"]] == txn.payload["files"]
    assert sorted(p.name for p in published.glob("*.parquet")) == sorted(txn.payload["files"])
    assert not Path(sink.staging_location("t1")).exists()
    assert not (tmp_path / "table" / "_commits").exists()


def test_auto_mode_renames_locally_and_copies_elsewhere(tmp_path: Path) -> None:
    assert ParquetTableSink("a", str(tmp_path / "t")).commit_mode == "rename"
    assert ParquetTableSink("a", f"file://{tmp_path}/t").commit_mode == "rename"
    assert ParquetTableSink("a", "memory://bucket/t").commit_mode == "copy"
    assert ParquetTableSink("a", "memory://bucket/t", commit_mode="manifest").commit_mode == "copy"


def test_relative_local_path_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sink = ParquetTableSink("rel", "out/table")
    assert sink.table_uri == f"{tmp_path}/out/table"
    assert sink.staging_location("t1") == f"{tmp_path}/out/table/_staging/t1"


def test_tables_committed_in_both_modes_read_completely(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    renaming = ParquetTableSink("mixed", uri, commit_mode="rename")
    manifesting = ParquetTableSink("mixed", uri, commit_mode="copy")
    renaming.commit(stage(renaming, "r", 1))
    txn = stage(manifesting, "m", 2)
    manifesting.commit(txn)

    assert renaming.commit(txn) is False
    assert committed_ids(renaming) == committed_ids(manifesting) == [1, 2]
    assert renaming.committed_txn_ids() == {"r", "m"}


# -- abort -------------------------------------------------------------------------------------


def test_abort_drops_staged_data_and_keeps_committed(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "kept", 1))
    doomed = stage(sink, "doomed", 2)
    sink.write_pandas("open", frame(3))

    sink.abort(doomed)
    sink.abort(SinkTransaction(sink_id="orders_sink", txn_id="open"))  # never pre-committed

    assert committed_ids(sink) == [1]
    assert sink.staged_txn_ids() == set()
    assert not sink.is_committed("doomed")
    with pytest.raises(NotPrecommittedError, match="never pre-committed or it was aborted"):
        sink.commit(doomed)


def test_abort_is_idempotent(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    sink.abort(txn)
    sink.abort(txn)
    sink.abort(SinkTransaction(sink_id="orders_sink", txn_id="never-existed"))
    assert sink.staged_txn_ids() == set()


def test_aborting_a_committed_transaction_raises(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    sink.commit(txn)

    with pytest.raises(AlreadyCommittedError, match=r"'t1'.*already committed"):
        sink.abort(txn)
    assert committed_ids(sink) == [1]


def test_half_done_abort_can_never_be_committed(make_sink: SinkFactory, location: tuple) -> None:
    """abort deletes the manifest first: a crash right after leaves an uncommittable txn."""
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    fs, _ = fsspec.core.url_to_fs(sink.table_uri)
    fs.rm(f"{sink.staging_location('t1')}/_manifest.json")

    with pytest.raises(NotPrecommittedError):
        make_sink().commit(txn)
    assert sink.staged_txn_ids() == {"t1"}
    make_sink().abort(txn)
    assert sink.staged_txn_ids() == set() and committed_ids(sink) == []


# -- transaction state rules ---------------------------------------------------------------------


def test_sealed_and_committed_transactions_refuse_writes(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    with pytest.raises(SinkTransactionError, match="pre-committed and sealed"):
        sink.write_pandas("t1", frame(2))

    sink.commit(txn)
    with pytest.raises(AlreadyCommittedError, match="write to"):
        sink.write_pandas("t1", frame(2))
    with pytest.raises(AlreadyCommittedError, match="pre-commit"):
        sink.precommit("t1", 2)
    assert committed_ids(sink) == [1]


def test_precommit_again_describes_the_same_data(make_sink: SinkFactory) -> None:
    sink = make_sink()
    first = stage(sink, "t1", 1, 2, ckpt=4)
    second = sink.precommit("t1", 5)

    assert second.checkpoint_id == 5
    assert second.payload["files"] == first.payload["files"] and second.payload["rows"] == 2
    assert sink.commit(second) is True
    assert sink.commit(first) is False
    assert committed_ids(sink) == [1, 2]


def test_commit_requires_a_precommitted_transaction(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.write_pandas("open", frame(1))
    with pytest.raises(NotPrecommittedError, match="carries no checkpoint id"):
        sink.commit(SinkTransaction(sink_id="orders_sink", txn_id="open"))
    with pytest.raises(NotPrecommittedError, match="never pre-committed"):
        sink.commit(SinkTransaction(sink_id="orders_sink", txn_id="open", checkpoint_id=1))
    assert committed_ids(sink) == [] and not sink.is_committed("open")


def test_commit_refuses_a_transaction_of_another_sink(make_sink: SinkFactory) -> None:
    txn = stage(make_sink("sink_a"), "t1", 1)
    with pytest.raises(ForeignTransactionError, match="belongs to sink 'sink_a'"):
        make_sink("sink_b").commit(txn)
    with pytest.raises(ForeignTransactionError):
        make_sink("sink_b").abort(txn)


def test_commit_refuses_files_that_differ_from_the_precommit(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    forged = txn.model_copy(update={"payload": {**txn.payload, "files": ["part-other.parquet"]}})
    with pytest.raises(SinkTransactionError, match="refusing to publish"):
        sink.commit(forged)
    assert sink.commit(txn) is True


def test_corrupt_manifest_gives_a_clear_error(tmp_path: Path) -> None:
    sink = ParquetTableSink("corrupt", str(tmp_path / "t"), commit_mode="rename")
    txn = stage(sink, "t1", 1)
    (Path(sink.staging_location("t1")) / "_manifest.json").write_text("{not json")
    with pytest.raises(SinkError, match="not valid JSON"):
        sink.commit(txn)


def test_non_parquet_data_fails_at_precommit(tmp_path: Path) -> None:
    """A broken staged file must fail the pre-commit (the checkpoint), not a later reader."""
    sink = ParquetTableSink("broken", str(tmp_path / "t"))
    staging = Path(sink.staging_location("t1"))
    staging.mkdir(parents=True)
    (staging / "part-0.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SinkError, match="not a readable Parquet file"):
        sink.precommit("t1", 1)


# -- identifiers -------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_hostile_transaction_ids_are_rejected(make_sink: SinkFactory, hostile: str) -> None:
    sink = make_sink()
    operations: list[Callable[[], object]] = [
        lambda: sink.staging_location(hostile),
        lambda: sink.write_pandas(hostile, frame(1)),
        lambda: sink.precommit(hostile, 1),
        lambda: sink.is_committed(hostile),
        lambda: sink.commit(
            SinkTransaction(sink_id="orders_sink", txn_id=hostile, checkpoint_id=1)
        ),
        lambda: sink.abort(SinkTransaction(sink_id="orders_sink", txn_id=hostile)),
    ]
    for operation in operations:
        with pytest.raises(InvalidIdentifierError, match="invalid transaction id") as caught:
            operation()
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, StorageError)
    assert sink.staged_txn_ids() == set() and sink.committed_txn_ids() == set()


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_hostile_sink_ids_are_rejected(tmp_path: Path, hostile: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid sink id"):
        ParquetTableSink(hostile, str(tmp_path / "t"))


def test_longest_valid_id_is_accepted(make_sink: SinkFactory) -> None:
    longest = "t" * 200
    sink = make_sink()
    assert sink.commit(stage(sink, longest, 1)) is True
    assert sink.committed_txn_ids() == {longest}


@given(st.text(max_size=220))
def test_identifiers_are_accepted_only_as_one_safe_path_segment(text: str) -> None:
    try:
        accepted = validate_identifier(text, "id")
    except InvalidIdentifierError:
        assert SAFE_IDENTIFIER.fullmatch(text) is None
        return
    assert accepted == text
    assert 1 <= len(text) <= 200 and text.isascii() and text.isprintable()
    assert "/" not in text and "\\" not in text and not text.startswith((".", "-"))
    assert os.path.basename(text) == text


def test_unknown_commit_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="sink 's': argument commit_mode='bogus'"):
        ParquetTableSink("s", str(tmp_path / "t"), commit_mode="bogus")  # type: ignore[arg-type]


# -- races and random schedules ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rename", "copy"])
def test_concurrent_commits_publish_once(tmp_path: Path, mode: str) -> None:
    """Eight committers (separate sink objects) race on one txn: one wins, rows appear once.

    Local files only: there rename and link are exclusive. An object store is exclusive only if
    its backend honours conditional PUTs (docs/sinks.md); fsspec's memory:// does not promise it.
    """

    def make_sink() -> ParquetTableSink:
        return ParquetTableSink("orders_sink", str(tmp_path / "t"), commit_mode=mode)  # type: ignore[arg-type]

    txn = stage(make_sink(), "contended", 1, 2, 3)
    contenders = 8
    barrier = threading.Barrier(contenders)
    results: list[bool] = []
    errors: list[BaseException] = []

    def contend() -> None:
        sink = make_sink()
        barrier.wait()
        try:
            results.append(sink.commit(txn))
        except BaseException as exc:  # reported below; a thread must not swallow it
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(results) == [False] * (contenders - 1) + [True]
    assert committed_ids(make_sink()) == [1, 2, 3]


TXN_PLANS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3),  # rows
        st.sampled_from(["commit", "commit-twice", "abort", "leave-pending"]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=TXN_PLANS, order=st.randoms(use_true_random=False))
def test_random_schedules_hold_exactly_the_committed_rows(plans: list, order) -> None:
    with tempfile.TemporaryDirectory() as directory:
        sink = ParquetTableSink("random", f"{directory}/table")
        expected: list[int] = []
        decisions = []
        next_value = 0
        for index, (rows, decision) in enumerate(plans):
            values = list(range(next_value, next_value + rows))
            next_value += rows
            txn_id = f"r-e1-b{index}"
            if values:
                sink.write_pandas(txn_id, frame(*values))
            decisions.append((sink.precommit(txn_id, index + 1), decision, values))
        order.shuffle(decisions)
        for txn, decision, values in decisions:
            if decision.startswith("commit"):
                assert ParquetTableSink("random", f"{directory}/table").commit(txn) is True
                expected += values
            if decision == "commit-twice":
                assert sink.commit(txn) is False
            if decision == "abort":
                sink.abort(txn)

        assert committed_ids(sink) == sorted(expected)
        pending = {txn.txn_id for txn, decision, _ in decisions if decision == "leave-pending"}
        assert sink.staged_txn_ids() == pending
