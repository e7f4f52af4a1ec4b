"""Exactly-once of the Iceberg and Delta sinks under the fault campaign.

- ``test_lakehouse_ci_campaign``: a seeded campaign whose pipeline publishes to an Iceberg table
  (pyiceberg, SQLite catalog) and a Delta table (deltalake) only, so every commit-point fault
  lands in one of them and every sink-layer point (before pre-commit, after pre-commit, inside
  the commit between the table commit and the sink's marker, before and inside an abort) fires
  in each of the two sinks. After each run's recovery and ``finalckpt gc``: no row lost or
  duplicated, no leaked staged file, one table commit (snapshot / version) per transaction the
  coordinator committed. The same as ``python -m faults.campaign --runs 32
  --seed 20261124 --sinks iceberg,delta``; docs/guarantees.md has the >= 100-run figures.
- the verifier itself: a transaction published twice to the table, and a Parquet file left in
  the staging directory, must be reported (so a green campaign means something).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
from airflow_finalckpt.sinks.staged import COMMITTED_NAME, STAGING_DIR, StagedTableSink
from faults.campaign import CampaignResult, run_campaign
from faults.injector import FaultInjector, FaultSpec
from faults.points import POINTS, Action, Layer
from faults.proxies import FaultySink
from faults.runs import Environment, RunPlan, execute_run, verify_setup
from faults.worker import InProcessWorker, dispose_sinks, make_sinks

CI_SEED = 20261124
CI_RUNS = 32
TABLES = ("iceberg", "delta")
SINK_POINTS = {name for name, p in POINTS.items() if p.layer is Layer.SINK}


@pytest.mark.slow
def test_lakehouse_ci_campaign(tmp_path: Path) -> None:
    start = time.monotonic()
    result: CampaignResult = run_campaign(
        CI_RUNS, CI_SEED, workdir=tmp_path / "campaign", sinks=TABLES
    )
    figures = result.figures()
    print(f"\n{result.summary()}\n({time.monotonic() - start:.0f} s)")
    problems = [f"{r.plan.run_id}: {p}" for r in result.reports for p in r.problems()]
    assert not problems, "\n".join(problems)
    for name in CampaignResult.ZERO_FIGURES:
        assert figures[name] == 0, (name, figures)
    fired = result.points_fired()
    assert set(fired) == set(POINTS), f"never fired: {sorted(set(POINTS) - set(fired))}"
    assert result.ok
    for kind in TABLES:
        sink = figures["sinks"][kind]
        assert sink["runs"] == CI_RUNS, sink
        assert set(sink["faults_by_point"]) == SINK_POINTS, (kind, sink)
        assert sink["table_commits"] == sink["table_commits_meant"] > CI_RUNS, (kind, sink)
        for name in ("lost", "duplicated", "wrong", "leaked", "double_committed", "miscounted"):
            assert sink[name] == 0, (kind, name, sink)
    commit_faults = [f for r in result.reports for f in r.fired if f["point"] == "mid-commit"]
    assert commit_faults, "no fault between a table commit and its acknowledgement"


def test_faults_can_target_one_sink(tmp_path: Path) -> None:
    """A sink-layer fault with ``sink`` fires in that sink only, counting its own hits."""
    env = Environment(tmp_path / "target", sinks=TABLES)
    env.prepare(spark=False)
    setup = env.setup(RunPlan.single(0))
    spec = FaultSpec("sink-after-precommit", Action.RAISE, nth=2, sink="delta")
    injector = FaultInjector((spec,))
    sinks = make_sinks(setup)
    try:
        iceberg, delta = (FaultySink(s, injector) for s in sinks)
        import pandas as pd

        frame = pd.DataFrame({"key": ["k0"], "window_start": [0]})
        for n in range(3):
            iceberg.write_pandas(f"publish.b{n}.e1", frame)
            iceberg.precommit(f"publish.b{n}.e1", n + 1)  # never fires: not the delta sink
        delta.write_pandas("publish.b0.e1", frame)
        delta.precommit("publish.b0.e1", 1)
        delta.write_pandas("publish.b1.e1", frame)
        with pytest.raises(Exception, match="injected fault at sink-after-precommit"):
            delta.precommit("publish.b1.e1", 2)
    finally:
        dispose_sinks(sinks)
    assert injector.sink_hits == {
        "sink-mid-write@iceberg": 3,
        "sink-after-precommit@iceberg": 3,
        "sink-mid-write@delta": 2,
        "sink-after-precommit@delta": 2,
    }
    assert [e["in_sink"] for e in injector.fired] == ["delta"]


def _clean_run(tmp_path: Path) -> tuple[Environment, RunPlan]:
    env = Environment(tmp_path / "verifier", sinks=TABLES)
    env.prepare(spark=False)
    plan = RunPlan.single(0)
    report = execute_run(env, plan, InProcessWorker())
    assert report.completed and report.problems() == [], report.problems()
    assert report.verdict is not None
    counts = report.verdict.table_commits
    assert counts and all(c["meant"] == c["table"] > 0 for c in counts.values()), counts
    return env, plan


def _committed_txn(sink: StagedTableSink) -> tuple[str, dict[str, object]]:
    import json

    root = sink._data_root()
    assert root is not None
    marker = sorted((Path(root) / STAGING_DIR / sink.sink_id).glob(f"*/{COMMITTED_NAME}"))[0]
    return marker.parent.name, json.loads(marker.read_text())


@pytest.mark.parametrize("kind", TABLES)
def test_the_verifier_sees_a_double_table_commit(tmp_path: Path, kind: str) -> None:
    env, plan = _clean_run(tmp_path)
    setup = env.setup(plan)
    sinks = make_sinks(setup)
    try:
        (sink,) = (s for s in sinks if s.sink_id == f"{kind}_r0000")
        assert isinstance(sink, IcebergTableSink | DeltaTableSink)
        txn_id, manifest = _committed_txn(sink)
        # publish the same transaction again, as a commit that forgot its replay check would
        sink._table_committed = lambda candidates: set()  # type: ignore[method-assign]
        if isinstance(sink, IcebergTableSink):
            sink._summary_txn_ids = lambda table: set()  # type: ignore[method-assign]
        else:
            manifest.pop("delta_version_before_commit", None)
            sink._save_manifest = lambda txn_id, manifest: None  # type: ignore[method-assign]
        assert sink._publish(txn_id, manifest) is True
    finally:
        dispose_sinks(sinks)
    verdict = verify_setup(env, plan, setup)
    assert any(f"{kind}_r0000: committed twice to the table" in x for x in verdict.double_committed)
    assert any("table holds" in x for x in verdict.miscounted), verdict.miscounted
    if kind == "iceberg":  # Delta's log replay keeps one add per path: only the count shows
        assert verdict.rows[f"{kind}_r0000"].duplicated > 0
    assert verdict.for_sink(f"{kind}_r0000")["miscounted"] >= 1


@pytest.mark.parametrize("kind", TABLES)
def test_the_verifier_sees_a_leaked_staged_file(tmp_path: Path, kind: str) -> None:
    env, plan = _clean_run(tmp_path)
    setup = env.setup(plan)
    sinks = make_sinks(setup)
    try:
        (sink,) = (s for s in sinks if s.sink_id == f"{kind}_r0000")
        assert isinstance(sink, StagedTableSink)
        txn_id, _ = _committed_txn(sink)
        source = sorted(Path(sink.staging_location(txn_id)).glob("*.parquet"))[0]
        stray = source.with_name("part-stray.parquet")  # in a committed transaction's dir
        shutil.copyfile(source, stray)
    finally:
        dispose_sinks(sinks)
    verdict = verify_setup(env, plan, setup)
    assert verdict.leaked == [f"{kind}_r0000: data file the table does not reference: {stray}"], (
        verdict.leaked
    )
    assert verdict.for_sink(f"{kind}_r0000")["leaked"] == 1
