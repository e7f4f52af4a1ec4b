"""The Spark Connect adapter (``spark.plans``) on a real local Connect server: the client-side
plans of the shapes of docs/protocol.md's table give the same verdicts as classic plans, and
the rule driver-action-on-batch sees the client's actions on the batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("connect_plans_child.py")
ROOT = Path(__file__).resolve().parents[2]


def test_connect_plans_are_classified_like_classic_ones() -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdicts.pop("driver actions") == [
        ["collect", True],
        ["toPandas", True],
        ["count", False],  # a constant input's
        ["head", True],  # head -> take -> collect: once
        ["count", True],
    ]
    assert verdicts == {
        "filter": ["split-local", ""],
        "left join with a constant": ["split-local", ""],
        "right join keeps the constant": ["whole-input", "Join"],
        "self join": ["whole-input", "Join"],
        "groupBy": ["whole-input", "Aggregate"],
        "groupBy with the split key": ["split-keyed", "Aggregate"],
        "window with the split key": ["split-keyed", "Window"],
        "window": ["whole-input", "Window"],
        "dropDuplicates": ["whole-input", "Deduplicate"],
        "orderBy+limit": ["whole-input", "Sort"],
        "union with a constant": ["whole-input", "SetOperation"],
        "applyInPandas": ["whole-input", "GroupMap"],
        "spark.sql": ["whole-input", "CachedRelation"],
    }
