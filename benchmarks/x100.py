"""The example at 100x the data (issue 29 item 3): the steady state and one resume.

``--only overhead_x100`` (``steady_state_overhead_x100``): the full year with every flight a
hundred times (33.7 M flights), generated the way x10 is (``pipelines.prepare_inputs``) and
kept in the cache directory (``pipelines.cached_inputs``: ``$FINALCKPT_BENCH_CACHE`` or
~/.cache/airflow-finalckpt/bench-data; never in git), so it is generated once per machine.
The steady-state comparison of ``steady_state.run`` with two repetitions (ABBA: two samples a
side) and no cold samples (the first run of ours seeds the hints and is reported, not judged);
memory peaks per side from ``process_stats``.

``--only resume_x100`` (``resume_savings_x100``): one crash of enrich at 50 %, one repetition
(``resume.run_resume``), enrich at the runtime's default target batch duration (30 s: about
four batches of this size). Run in the same process after ``overhead_x100`` it reuses that
run's hints (the DAG's earlier runs) and its plain median as the rerun baseline; alone it
seeds its own hints first (one more full run).

Opt-in only (``run.OPT_IN``): both took 11 min on the quiet 2-core machine of 2026-11-28
(estimated at ~23 min from the slower x1 / x10 runs of the day before).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import resume, steady_state
from benchmarks.common import Result
from benchmarks.pipelines import cached_inputs

NAME = "steady_state_overhead_x100"
NAME_RESUME = "resume_savings_x100"
DAYS = 365
SCALE = 100
REPETITIONS = 2
CRASH_POINTS = (0.5,)
ENRICH_TARGET_BATCH_S = 30.0
#: Quick mode (smoke only): 2 days at x100.
QUICK_DAYS = 2

#: What the steady-state run leaves for the resume run of the same process.
_SHARED: dict[str, Any] = {}


def _days(quick: bool) -> int:
    return QUICK_DAYS if quick else DAYS


def _hints_root() -> Path:
    """A directory for the hints shared by both benchmarks of this process (removed at exit)."""
    if "hints_root" not in _SHARED:
        root = Path(tempfile.mkdtemp(prefix="finalckpt-bench-x100-hints-"))
        atexit.register(shutil.rmtree, root, True)
        _SHARED["hints_root"] = root
    return Path(_SHARED["hints_root"])


def run(quick: bool = False) -> Result:
    days = _days(quick)
    result = steady_state.run(
        quick,
        datasets=[(days, SCALE)],
        name=NAME,
        repetitions=1 if quick else REPETITIONS,
        cold_samples=False,
        cached=True,
        hints_root=_hints_root(),
    )
    label = f"{days}dx{SCALE}"
    _SHARED["hints"] = (days, _hints_root() / f"hints-{label}")
    if f"plain_s/{label}" in result.medians:
        _SHARED["plain_s"] = (days, result.medians[f"plain_s/{label}"])
    return result


def resume_plan(quick: bool) -> dict[str, Any]:
    days = _days(quick)
    return {
        "days": days,
        "row_scale": SCALE,
        "target_batch_s": {"enrich": ENRICH_TARGET_BATCH_S},
        "ingest_batch_size": -(-days // resume.ENRICH_SPLITS),
    }


def run_resume(quick: bool = False) -> Result:
    cfg = resume_plan(quick)
    days = cfg["days"]
    hints = _SHARED.get("hints")
    plain = _SHARED.get("plain_s")
    return resume.run_resume(
        cfg,
        CRASH_POINTS,
        1,
        NAME_RESUME,
        inputs=cached_inputs(days, SCALE),
        hints_root=hints[1] if hints and hints[0] == days else None,
        rerun_s=plain[1] if plain and plain[0] == days else None,
    )
