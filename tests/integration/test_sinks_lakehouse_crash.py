"""Iceberg and Delta sinks under SIGKILL: a child process dies before / after pre-commit, between
the table commit and its acknowledgement, or in the middle of an abort; a second child restores.
Afterwards the table holds every row once, one snapshot / version per batch, and no staged file
is left that the table does not reference.

``FINALCKPT_LAKEHOUSE_CRASH_RUNS`` (default 10) sets the seeded runs per sink; the acceptance
campaign runs 100.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lakehouse_crash_child import BATCHES, POINTS, ROWS
from lakehouse_helpers import KINDS, commit_count, make_sink, read_ids, staged_data_files
from lakehouse_helpers import table_files as referenced_files

CHILD = Path(__file__).with_name("lakehouse_crash_child.py")
RUNS = int(os.environ.get("FINALCKPT_LAKEHOUSE_CRASH_RUNS", "10"))

pytestmark = pytest.mark.slow


def run_child(kind: str, root: Path, point: str, batch: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), kind, str(root), point, str(batch)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(CHILD.parent)},
    )


@pytest.mark.parametrize("kind", KINDS)
def test_crashes_lose_nothing_duplicate_nothing_and_leak_no_file(tmp_path: Path, kind: str) -> None:
    outcomes: dict[str, int] = {}
    for seed in range(RUNS):
        point = POINTS[seed % len(POINTS)]
        batch = random.Random(seed).randrange(BATCHES)
        root = tmp_path / f"run{seed}"
        root.mkdir()
        crashed = run_child(kind, root, point, batch)
        assert crashed.returncode == -signal.SIGKILL, (point, crashed.stderr[-3000:])
        recovered = run_child(kind, root, "none", 0)
        assert recovered.returncode == 0 and "done" in recovered.stdout, recovered.stderr[-3000:]

        sink = make_sink(kind, root)
        where = f"seed {seed}: {point} at batch {batch}"
        assert read_ids(sink) == list(range(BATCHES * ROWS)), where  # none lost, none twice
        assert commit_count(sink) == BATCHES, where  # one snapshot / version per batch
        assert sink.committed_txn_ids() == {f"b{k}" for k in range(BATCHES)}, where
        assert sink.staged_txn_ids() == set(), where
        assert staged_data_files(sink) == referenced_files(sink), where  # no leaked file
        outcomes[point] = outcomes.get(point, 0) + 1
    assert set(outcomes) == set(POINTS[: min(RUNS, len(POINTS))])
