"""What a pipeline run must look like after any faults and a recovery.

``verify_run`` compares a finished run with the fault-free result and with itself:

- rows: each sink holds every expected row exactly once, with the expected values (lost,
  duplicated, wrong and unexpected rows are counted separately);
- transactions: the coordinator's transactions table agrees with every sink's commit records
  (nothing committed on one side only, nothing left pre-committed, no batch committed twice under
  two transaction ids) and no sink keeps staged data;
- checkpoint storage: every ``chk-<id>`` directory belongs to a retained (COMPLETED) checkpoint,
  no temporary file of an atomic write is left, every retained checkpoint is restorable (its
  ``_metadata`` reads, its state files exist with their checksums, and the output parts that a
  restore would re-read exist);
- the coordinator: every stage CLOSED, no checkpoint left PENDING;
- table-format sinks (Iceberg, Delta): the table's history holds exactly one commit (snapshot /
  version) per transaction the coordinator committed with data, no commit of anyone else and no
  transaction twice; every Parquet file under the sink's staging directories is referenced by
  the table's current snapshot / version (any other is a leaked file).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    OUTPUT_PREFIX,
    CheckpointRecord,
    CheckpointState,
    StageLifecycle,
    StageStatus,
    TransactionState,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.atomic import TEMP_MARKER
from airflow_finalckpt.storage.paths import parse_checkpoint_dir_name

if TYPE_CHECKING:
    import pandas

#: Temporary files of the sinks' own atomic writes.
SINK_TEMP_MARKER = "_tmp-"
_EPOCH_SUFFIX = re.compile(r"\.e\d+$")
_TXN_ID = re.compile(r"^(?P<stage>[^.]+)\..*\.e(?P<epoch>\d+)$")

#: Defects the campaign found in code outside the fault harness, not fixed yet. A finding that
#: matches one is reported under its id instead of as a failure; the tests in
#: tests/integration/test_fault_campaign.py reproduce each one (strict xfail), so a fix shows.
#: FC-1 to FC-5 are fixed (see docs/guarantees.md): what they left behind (chk-<id> directories
#: of aborted or discarded checkpoints, staged transactions of stale attempts, temporary files of
#: atomic writes) now counts as leaked, and a zombie ending with anything but StaleEpochError as
#: unexpected.
KNOWN_ISSUES: dict[str, str] = {}


class ReadableSink(Protocol):
    sink_id: str

    def read_pandas(self) -> pandas.DataFrame: ...


@dataclass
class RowCheck:
    expected: int = 0
    found: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    unexpected: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.wrong or self.unexpected)


@dataclass
class Verdict:
    """Everything found wrong with one run (empty lists and zeros: nothing)."""

    rows: dict[str, RowCheck] = field(default_factory=dict)
    orphaned: list[str] = field(default_factory=list)
    double_committed: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    unclosed: list[str] = field(default_factory=list)
    #: Table-format sinks whose history does not hold one commit per committed transaction.
    miscounted: list[str] = field(default_factory=list)
    #: Table-format sinks: sink id -> {"meant": commits the coordinator committed with data,
    #: "table": commits in the table's history, "files": data files the table references}.
    table_commits: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Units garbage collection could still delete (informational: not a leak, GC's job).
    garbage_units: int | None = None
    #: Findings that match a KNOWN_ISSUES entry: issue id -> details (not counted as problems).
    known: dict[str, list[str]] = field(default_factory=dict)

    def note_known(self, issue: str, detail: str) -> None:
        assert issue in KNOWN_ISSUES, issue
        self.known.setdefault(issue, []).append(detail)

    @property
    def lost(self) -> int:
        return sum(r.lost for r in self.rows.values())

    @property
    def duplicated(self) -> int:
        return sum(r.duplicated for r in self.rows.values())

    @property
    def wrong(self) -> int:
        return sum(r.wrong + r.unexpected for r in self.rows.values())

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        found = []
        for sink_id, rows in sorted(self.rows.items()):
            if not rows.ok:
                found.append(
                    f"sink {sink_id}: {rows.lost} lost, {rows.duplicated} duplicated, "
                    f"{rows.wrong} wrong, {rows.unexpected} unexpected rows "
                    f"({'; '.join(rows.examples[:3])})"
                )
        found += [f"orphaned transaction: {x}" for x in self.orphaned]
        found += [f"double-committed: {x}" for x in self.double_committed]
        found += [f"leaked: {x}" for x in self.leaked]
        found += [f"checkpoint {x} left PENDING" for x in self.pending]
        found += [f"broken checkpoint: {x}" for x in self.broken]
        found += [f"stage {x} not CLOSED" for x in self.unclosed]
        found += [f"miscounted table commits: {x}" for x in self.miscounted]
        return found

    def for_sink(self, sink_id: str) -> dict[str, int]:
        """The figures of one sink: rows lost / duplicated / wrong, leaks, miscounts."""
        rows = self.rows.get(sink_id, RowCheck())
        prefix = f"{sink_id}:"
        return {
            "lost": rows.lost,
            "duplicated": rows.duplicated,
            "wrong": rows.wrong + rows.unexpected,
            "leaked": sum(1 for x in self.leaked if x.startswith(prefix)),
            "double_committed": sum(1 for x in self.double_committed if x.startswith(prefix)),
            "orphaned": sum(1 for x in self.orphaned if x.startswith(f"{sink_id}/")),
            "miscounted": sum(1 for x in self.miscounted if x.startswith(prefix)),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = self.problems()
        return data


# ------------------------------------------------------------------------------ rows


def _key_of(row: Any, key: Sequence[str]) -> tuple[Any, ...]:
    return tuple(_plain(row[k]) for k in key)


def _plain(value: Any) -> Any:
    """Numbers of any dtype as int/float, missing values as None: comparable across sinks."""
    import math

    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _same(left: Any, right: Any, approximate: bool, rtol: float) -> bool:
    a, b = _plain(left), _plain(right)
    if a is None or b is None:
        return a is None and b is None
    if approximate and isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) <= rtol * max(abs(a), abs(b))
    return bool(a == b)


def _example(check: RowCheck, text: str) -> None:
    """Keep the first five findings as examples: enough to see the pattern, short to print."""
    if len(check.examples) < 5:
        check.examples.append(text)


def _wrong_columns(
    got: Any,
    row: Any,
    columns: Sequence[str],
    key: Sequence[str],
    approximate: Sequence[str],
    rtol: float,
) -> list[str]:
    """The non-key columns in which ``got`` differs from the expected ``row``."""
    return [
        c for c in columns if c not in key and not _same(got[c], row[c], c in approximate, rtol)
    ]


def compare_rows(
    actual: pandas.DataFrame,
    expected: pandas.DataFrame,
    key: Sequence[str],
    *,
    approximate: Sequence[str] = (),
    rtol: float = 1e-9,
) -> RowCheck:
    """Count lost, duplicated, wrong and unexpected rows of ``actual`` against ``expected``
    (whose key is unique). Columns of ``expected`` missing from ``actual`` make every row wrong."""
    check = RowCheck(expected=len(expected), found=len(actual))
    wanted = {_key_of(row, key): row for _, row in expected.iterrows()}
    if len(actual) == 0:
        check.lost = len(wanted)
        if wanted:
            check.examples.append(f"no rows at all ({len(wanted)} expected)")
        return check
    missing_columns = [c for c in expected.columns if c not in actual.columns]
    counts: Counter[tuple[Any, ...]] = Counter()
    first: dict[tuple[Any, ...], Any] = {}
    for _, row in actual.iterrows():
        k = _key_of(row, key)
        counts[k] += 1
        first.setdefault(k, row)
    for k, row in wanted.items():
        n = counts.get(k, 0)
        if n == 0:
            check.lost += 1
            _example(check, f"lost {k}")
            continue
        if n > 1:
            check.duplicated += n - 1
            _example(check, f"{k} {n} times")
        bad = missing_columns or _wrong_columns(
            first[k], row, expected.columns, key, approximate, rtol
        )
        if bad:
            check.wrong += 1
            _example(check, f"{k} differs in {bad}")
    for k, n in counts.items():
        if k not in wanted:
            check.unexpected += n
            _example(check, f"unexpected {k}")
    return check


# ------------------------------------------------------------------------------ transactions


def _check_sink_commits(
    sink: TwoPhaseCommitSink,
    states: dict[tuple[str, str], str],
    verdict: Verdict,
) -> None:
    """The sink's commit records against the coordinator's: committed on one side only, or one
    batch committed under two transaction ids (two attempts)."""
    committed = sink.committed_txn_ids()
    for txn_id in sorted(committed):
        known = states.get((sink.sink_id, txn_id))
        if known != TransactionState.COMMITTED.value:
            verdict.orphaned.append(
                f"{sink.sink_id}/{txn_id} committed in the sink but "
                f"{known or 'unknown'} in the coordinator"
            )
    for (sink_id, txn_id), state in sorted(states.items()):
        if (
            sink_id == sink.sink_id
            and state == TransactionState.COMMITTED.value
            and txn_id not in committed
        ):
            verdict.orphaned.append(
                f"{sink_id}/{txn_id} COMMITTED in the coordinator but not in the sink"
            )
    batches = Counter(_EPOCH_SUFFIX.sub("", t) for t in committed)
    for batch, n in sorted(batches.items()):
        if n > 1:
            verdict.double_committed.append(
                f"{sink.sink_id}: batch {batch} committed by {n} attempts: "
                f"{sorted(t for t in committed if _EPOCH_SUFFIX.sub('', t) == batch)}"
            )


def _check_staged(
    sink: TwoPhaseCommitSink,
    states: dict[tuple[str, str], str],
    epochs: dict[str, int],
    verdict: Verdict,
) -> None:
    """Staged data left in the sink is a leak; say when a stale attempt sealed it."""
    for txn_id in sorted(sink.staged_txn_ids()):
        known = states.get((sink.sink_id, txn_id))
        detail = (
            f"{sink.sink_id}: staged transaction {txn_id} ({known or 'unknown to the coordinator'})"
        )
        match = _TXN_ID.match(txn_id)
        if (
            known is None
            and match is not None
            and match["stage"] in epochs
            and int(match["epoch"]) < epochs[match["stage"]]
        ):
            detail += f", sealed by a stale attempt (epoch {match['epoch']})"
        verdict.leaked.append(detail)


def check_transactions(
    coordinator: Coordinator, sinks: Sequence[TwoPhaseCommitSink], verdict: Verdict
) -> None:
    states = {(t.sink_id, t.txn_id): state for t, state in coordinator.transactions()}
    epochs = {sid: view.epoch for sid, view in coordinator.stages().items()}
    for (sink_id, txn_id), state in sorted(states.items()):
        if state == TransactionState.PRECOMMITTED.value:
            verdict.orphaned.append(f"{sink_id}/{txn_id} still PRECOMMITTED in the coordinator")
    for sink in sinks:
        _check_sink_commits(sink, states, verdict)
        _check_staged(sink, states, epochs, verdict)


def check_table_sinks(
    coordinator: Coordinator, sinks: Sequence[TwoPhaseCommitSink], verdict: Verdict
) -> None:
    """Table-format sinks: one table commit per committed transaction with data, and no data
    file in the staging directories that the table does not reference."""
    from airflow_finalckpt.sinks.staged import StagedTableSink

    committed = [
        txn
        for txn, state in coordinator.transactions()
        if state == TransactionState.COMMITTED.value
    ]
    for sink in sinks:
        if not isinstance(sink, StagedTableSink):
            continue
        meant = sorted(
            txn.txn_id
            for txn in committed
            if txn.sink_id == sink.sink_id and (txn.payload or {}).get("files")
        )
        commits = sink.table_commits()
        mine = [txn_id for txn_id in commits if txn_id is not None]
        referenced = sink.table_files()
        verdict.table_commits[sink.sink_id] = {
            "meant": len(meant),
            "table": len(commits),
            "files": len(referenced),
        }
        prefix = f"{sink.sink_id}:"
        if len(commits) != len(meant):
            verdict.miscounted.append(
                f"{prefix} the table holds {len(commits)} commits, {len(meant)} were meant"
            )
        if foreign := len(commits) - len(mine):
            verdict.miscounted.append(f"{prefix} {foreign} table commits of no transaction")
        twice = sorted(t for t, n in Counter(mine).items() if n > 1)
        if twice:
            verdict.double_committed.append(f"{prefix} committed twice to the table: {twice}")
        if missing := sorted(set(meant) - set(mine)):
            verdict.miscounted.append(
                f"{prefix} committed transactions not in the table: {missing}"
            )
        if unknown := sorted(set(mine) - set(meant)):
            verdict.miscounted.append(
                f"{prefix} table commits the coordinator did not make: {unknown}"
            )
        for path in sorted(sink.staged_files() - referenced):
            verdict.leaked.append(f"{prefix} data file the table does not reference: {path}")
        if gone := sorted(referenced - sink.staged_files()):
            verdict.broken.append(f"{prefix} the table references missing files: {gone[:3]}")


# ------------------------------------------------------------------------------ storage


def _files_under(storage: CheckpointStorage, fs_dir: str) -> list[str]:
    try:
        return sorted(str(p) for p in storage.fs.find(fs_dir))
    except FileNotFoundError:
        return []


def _check_state_data(
    storage: CheckpointStorage, key: str, raw: bytes, name: str, where: str, verdict: Verdict
) -> None:
    """A JSON state whose ``path`` names a data directory: that directory must exist."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return
    data_dir = doc.get("path") if isinstance(doc, dict) else None
    if isinstance(data_dir, str) and not storage.fs.exists(
        storage.fs._strip_protocol(storage.resolve_handle(key, data_dir))
    ):
        verdict.broken.append(f"{where}: state {name!r} data {data_dir} is missing")


def _check_states(
    storage: CheckpointStorage, key: str, label: str, record: CheckpointRecord, verdict: Verdict
) -> None:
    """Every state file of every stage reads (with its checksum), and what it points at exists."""
    for sid, rec in sorted(record.stages.items()):
        for handle in rec.state:
            try:
                raw = storage.read_state(key, handle)
            except FinalCheckpointError as exc:
                verdict.broken.append(f"{label}, stage {sid}: {exc}")
                continue
            if not handle.name.startswith(OUTPUT_PREFIX):
                _check_state_data(storage, key, raw, handle.name, f"{label}, stage {sid}", verdict)


def _check_reread_parts(
    storage: CheckpointStorage,
    key: str,
    label: str,
    record: CheckpointRecord,
    graph: StageGraph,
    verdict: Verdict,
) -> None:
    """The upstream output parts a restore of an unfinished stage re-reads must exist."""
    for sid, rec in sorted(record.stages.items()):
        if rec.status is StageStatus.FULLY_FINISHED or sid not in graph:
            continue
        for up in graph.upstream(sid):
            up_rec = record.stages.get(up)
            if up_rec is None or up_rec.end_of_data is None:
                continue
            for part in up_rec.end_of_data.manifest:
                fs_path = storage.fs._strip_protocol(storage.resolve_handle(key, part))
                if not storage.fs.exists(fs_path):
                    verdict.broken.append(
                        f"{label}: output part {part} of {up}, which a restore of {sid} "
                        f"({rec.status}) re-reads, is missing"
                    )


def _restorable(
    storage: CheckpointStorage, key: str, cid: int, path: str, verdict: Verdict
) -> None:
    label = f"checkpoint {cid} ({path})"
    try:
        record = storage.read_checkpoint(path)
    except FinalCheckpointError as exc:
        verdict.broken.append(f"{label}: {exc}")
        return
    _check_states(storage, key, label, record, verdict)
    try:
        graph = StageGraph.from_dict(record.graph)
    except FinalCheckpointError as exc:
        verdict.broken.append(f"{label}: unreadable graph: {exc}")
        return
    _check_reread_parts(storage, key, label, record, graph, verdict)


def _checkpoint_dirs(storage: CheckpointStorage, pipeline_dir: str) -> list[tuple[str, int]]:
    """The ``chk-<id>`` directories in the pipeline's directory, as (name, checkpoint id)."""
    try:
        entries = storage.fs.ls(pipeline_dir, detail=False)
    except FileNotFoundError:
        entries = []
    found = []
    for entry in entries:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        cid = parse_checkpoint_dir_name(name)
        if cid is not None:
            found.append((name, cid))
    return found


def _check_temp_files(
    storage: CheckpointStorage, pipeline_dir: str, sink_roots: Sequence[str], verdict: Verdict
) -> None:
    """No temporary file of an atomic write, in checkpoint storage or under a sink, is left."""
    for path in _files_under(storage, pipeline_dir):
        if TEMP_MARKER in path.rsplit("/", 1)[-1]:
            verdict.leaked.append(f"temporary file {path[len(pipeline_dir) + 1 :]}")
    for root in sink_roots:
        for path in _files_under(storage, root):
            if SINK_TEMP_MARKER in path.rsplit("/", 1)[-1]:
                verdict.leaked.append(f"sink temporary file {path}")


def check_storage(
    coordinator: Coordinator,
    storage: CheckpointStorage,
    verdict: Verdict,
    *,
    sink_roots: Sequence[str] = (),
) -> None:
    key = coordinator.pipeline_key
    infos = {c.checkpoint_id: c for c in coordinator.checkpoints()}
    retained = {
        cid: info
        for cid, info in infos.items()
        if info.state is CheckpointState.COMPLETED and info.metadata_path
    }
    pipeline_dir = str(storage.fs._strip_protocol(storage.pipeline_dir(key))).rstrip("/")
    seen: set[int] = set()
    for name, cid in _checkpoint_dirs(storage, pipeline_dir):
        seen.add(cid)
        if cid not in retained:
            info = infos.get(cid)
            what = f"of a {info.state.value} checkpoint" if info else "(unknown to the coordinator)"
            files = [p.rsplit("/", 1)[-1] for p in _files_under(storage, f"{pipeline_dir}/{name}")]
            verdict.leaked.append(f"{name} {what} is still in storage: {files}")
    for cid, info in sorted(retained.items()):
        if cid not in seen:
            verdict.broken.append(f"checkpoint {cid}: COMPLETED but its directory is gone")
            continue
        assert info.metadata_path is not None
        _restorable(storage, key, cid, info.metadata_path, verdict)
    _check_temp_files(storage, pipeline_dir, sink_roots, verdict)


def garbage_units(coordinator: Coordinator, storage: CheckpointStorage) -> int | None:
    """How many units garbage collection (grace 0) could still delete; None without GC."""
    try:
        from airflow_finalckpt.runtime.gc import collect_garbage
    except ImportError:
        return None
    try:
        return len(collect_garbage(coordinator, storage, dry_run=True, grace_s=0).deleted)
    except FinalCheckpointError:
        return None


# ------------------------------------------------------------------------------ a whole run


def verify_run(
    coordinator: Coordinator,
    storage: CheckpointStorage,
    sinks: Sequence[Any],
    expected: pandas.DataFrame,
    key: Sequence[str],
    *,
    approximate: Sequence[str] = (),
    sink_roots: Sequence[str] = (),
) -> Verdict:
    """Check a run after its recovery ended (see the module docstring)."""
    verdict = Verdict()
    for sink in sinks:
        verdict.rows[sink.sink_id] = compare_rows(
            sink.read_pandas(), expected, key, approximate=approximate
        )
    check_transactions(coordinator, sinks, verdict)
    check_table_sinks(coordinator, sinks, verdict)
    check_storage(coordinator, storage, verdict, sink_roots=sink_roots)
    verdict.pending = [
        c.checkpoint_id for c in coordinator.checkpoints() if c.state is CheckpointState.PENDING
    ]
    verdict.unclosed = [
        sid for sid, v in coordinator.stages().items() if v.lifecycle is not StageLifecycle.CLOSED
    ]
    verdict.garbage_units = garbage_units(coordinator, storage)
    return verdict
