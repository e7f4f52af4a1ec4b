"""The fault-injection harness itself: points, injector, proxies, verifier, plans.

The verifier tests break a correct run on purpose (delete, duplicate, alter committed data,
leave staging, pending checkpoints, missing state) and require it to notice: a campaign that
reports zeros is only worth something if these fail.
"""

from __future__ import annotations

import errno
import inspect
import multiprocessing
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import text, update

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import StorageError
from airflow_finalckpt.runtime import closer as closer_module
from airflow_finalckpt.runtime import runner as runner_module
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage import atomic as atomic_module
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from faults import runs as runs_module
from faults.campaign import CampaignResult, plan_campaign
from faults.fake import FakeData, reference_windows
from faults.injector import (
    FaultInjector,
    FaultSpec,
    InjectedFault,
    read_events,
)
from faults.points import POINTS, RUNTIME_POINTS, Action, Layer
from faults.proxies import FaultyStorage, rename_hook
from faults.runs import Environment, RunPlan, RunReport, execute_run, stale_commits
from faults.verify import KNOWN_ISSUES, compare_rows
from faults.worker import InProcessWorker, dispose_sinks, make_sinks

# ------------------------------------------------------------------------------ points


def test_runtime_points_are_exactly_the_runners_fault_calls() -> None:
    source = inspect.getsource(runner_module) + inspect.getsource(closer_module)
    called = set(re.findall(r'self\.fault\("([a-z-]+)"\)', source))
    assert called == set(RUNTIME_POINTS), "the runtime's fault points changed: update points.py"


def test_every_point_is_described_and_has_actions() -> None:
    for name, point in POINTS.items():
        assert point.name == name and point.description and point.actions, name
        if point.layer is Layer.STORAGE and name.startswith("metadata-"):
            # inside the coordinator's transition: a zombie there would wait on its own lock
            assert Action.ZOMBIE not in point.actions, name


def test_a_spec_refuses_an_action_the_point_does_not_allow() -> None:
    with pytest.raises(ValueError, match="not possible at fault point 'after-close'"):
        FaultSpec("after-close", Action.ENOSPC)
    with pytest.raises(ValueError, match="unknown fault point 'nowhere'"):
        FaultSpec("nowhere", Action.CRASH)
    with pytest.raises(ValueError, match="nth must be >= 1"):
        FaultSpec("before-batch", Action.CRASH, nth=0)
    spec = FaultSpec("before-batch", Action.DELAY, stage="agg", nth=2, delay_s=0.5)
    assert FaultSpec.from_dict(spec.to_dict()) == spec
    assert spec.describe() == "delay 0.50s at before-batch@agg (hit 2)"


# ------------------------------------------------------------------------------ injector


def test_injector_fires_once_on_the_nth_hit_in_its_stage(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    injector = FaultInjector(
        (FaultSpec("before-batch", Action.RAISE, stage="agg", nth=2),),
        events_path=str(events),
        label="x.a1",
    )
    injector.hit("before-batch", "gen")
    injector.hit("before-batch", "gen")
    injector.hit("before-batch", "agg")
    with pytest.raises(InjectedFault, match="before-batch in stage agg"):
        injector.hit("before-batch", "agg")
    injector.hit("before-batch", "agg")  # fired once only
    assert injector.hits["before-batch"] == 5
    assert injector.unfired() == []
    [event] = read_events(events)
    assert (event["point"], event["in_stage"], event["label"]) == ("before-batch", "agg", "x.a1")


def test_injector_without_a_stage_counts_every_hit() -> None:
    injector = FaultInjector((FaultSpec("metadata-mid-write", Action.EIO, nth=2),))
    injector.stage = "gen"
    injector.hit("metadata-mid-write")
    injector.stage = "agg"
    with pytest.raises(OSError) as err:
        injector.hit("metadata-mid-write")
    assert err.value.errno == errno.EIO
    assert injector.fired[0]["in_stage"] == "agg"


def test_disk_full_is_enospc() -> None:
    injector = FaultInjector((FaultSpec("state-mid-write", Action.ENOSPC),))
    with pytest.raises(OSError) as err:
        injector.hit("state-mid-write", "gen")
    assert err.value.errno == errno.ENOSPC and "injected at state-mid-write" in str(err.value)


def test_a_hold_waits_until_the_stages_it_names_got_there() -> None:
    spec = FaultSpec(
        "before-batch", Action.DELAY, stage="b", delay_s=5.0, until=("a:finished", "c:started")
    )
    assert FaultSpec.from_dict(spec.to_dict()) == spec
    assert spec.describe() == "delay 5.00s until a:finished, c:started at before-batch@b (hit 1)"
    states = iter(
        [
            {"a": "RUNNING", "c": "NOT_STARTED"},
            {"a": "FINISHED", "c": "NOT_STARTED"},
            {"a": "FINISHED", "c": "SUSPENDED"},
        ]
    )
    reads: list[dict[str, str]] = []

    def lifecycles() -> dict[str, str]:
        reads.append(next(states))
        return reads[-1]

    injector = FaultInjector((spec,), lifecycles=lifecycles)
    injector.hit("before-batch", "b")
    assert len(reads) == 3  # it went on at the first read where both held


def test_a_hold_gives_up_after_its_delay() -> None:
    spec = FaultSpec("before-batch", Action.DELAY, delay_s=0.1, until=("a:finished",))
    reads: list[int] = []
    injector = FaultInjector((spec,), lifecycles=lambda: reads.append(1) or {"a": "RUNNING"})
    injector.hit("before-batch", "b")
    assert len(reads) >= 3  # it kept reading until the cap, then went on
    with pytest.raises(InjectedFault, match="cannot read stage lifecycles"):
        FaultInjector((spec,)).hit("before-batch", "b")


def test_a_hold_refuses_a_bad_condition() -> None:
    with pytest.raises(ValueError, match="'until' needs action 'delay', got 'crash'"):
        FaultSpec("before-batch", Action.CRASH, until=("a:finished",))
    for bad in ("a", "a:closed", ":finished"):
        with pytest.raises(ValueError, match="is not '<stage>:<state>'"):
            FaultSpec("before-batch", Action.DELAY, until=(bad,))
    assert "until" not in FaultSpec("before-batch", Action.DELAY).to_dict()


def test_zombie_fault_runs_the_newer_attempt_in_the_fault_point() -> None:
    started: list[str] = []
    injector = FaultInjector((FaultSpec("before-close", Action.ZOMBIE),))
    injector.zombie = started.append
    injector.hit("before-close", "publish")
    assert started == ["publish"]


def _crash_at(events_path: str) -> None:
    FaultInjector((FaultSpec("mid-batch", Action.CRASH),), events_path=events_path).hit(
        "mid-batch", "gen"
    )


def test_crash_is_a_sigkill_and_is_recorded_first(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    process = multiprocessing.get_context("spawn").Process(target=_crash_at, args=(str(events),))
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL
    assert [e["point"] for e in read_events(events)] == ["mid-batch"]


# ------------------------------------------------------------------------------ proxies


def test_rename_hook_is_undone_even_when_the_hook_raises(tmp_path: Path) -> None:
    import os

    storage = CheckpointStorage(str(tmp_path))

    def fail(_dst: str) -> None:
        raise OSError(errno.EIO, "boom")

    with pytest.raises(StorageError, match="boom"), rename_hook(fail):
        storage.write_state("k", "state/a.json", b"{}")
    assert atomic_module.__dict__["os"] is os
    assert not list(tmp_path.rglob("*.tmp-*")), "the temporary file must be removed"


@pytest.mark.parametrize("action", [Action.EIO, Action.ENOSPC])
def test_failed_metadata_write_leaves_no_metadata(tmp_path: Path, action: Action) -> None:
    from airflow_finalckpt.core.model import CheckpointKind, CheckpointRecord, TriggerReason

    injector = FaultInjector((FaultSpec("metadata-mid-write", action),))
    storage = FaultyStorage(str(tmp_path), injector)
    record = CheckpointRecord(
        pipeline_key="k",
        checkpoint_id=1,
        kind=CheckpointKind.CHECKPOINT,
        reason=TriggerReason.MANUAL,
        graph={"stages": []},
        graph_fingerprint="f",
        triggered_at=1.0,
        completed_at=2.0,
        stages={},
    )
    with pytest.raises(StorageError, match="cannot write checkpoint metadata"):
        storage.write_checkpoint(record)
    assert not list(tmp_path.rglob("_metadata")) and not list(tmp_path.rglob("*.tmp-*"))
    storage.write_checkpoint(record)  # the fault fired once; the next write works
    assert storage.list_checkpoints("k") == [(1, storage.metadata_path("k", 1))]


# ------------------------------------------------------------------------------ rows


def _frame(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["key", "w", "v"])


def test_compare_rows_counts_each_kind_of_difference() -> None:
    expected = _frame([("a", 1, 1.0), ("b", 2, 2.0), ("c", 3, float("nan")), ("d", 4, 4.0)])
    actual = _frame(
        [("a", 1, 1.0), ("a", 1, 1.0), ("c", 3, float("nan")), ("d", 4, 4.5), ("z", 9, 0.0)]
    )
    check = compare_rows(actual, expected, ["key", "w"])
    assert (check.lost, check.duplicated, check.wrong, check.unexpected) == (1, 1, 1, 1)
    assert not check.ok
    assert compare_rows(expected.iloc[::-1], expected, ["key", "w"]).ok  # order is irrelevant
    close = _frame([("a", 1, 1.0 + 1e-12), ("b", 2, 2.0), ("c", 3, None), ("d", 4, 4.0)])
    assert compare_rows(close, expected, ["key", "w"], approximate=["v"]).ok  # type: ignore[arg-type]
    assert compare_rows(_frame([]), expected, ["key", "w"]).lost == 4


def test_reference_windows_cover_every_generated_row() -> None:
    data = FakeData(splits=5)
    windows = reference_windows(data)
    assert sum(w["events"] for w in windows) == 5 * data.rows_per_split
    assert len({(w["key"], w["window_start"]) for w in windows}) == len(windows)


# ------------------------------------------------------------------------------ the verifier


def _clean_run(tmp_path: Path, **config: Any) -> tuple[Environment, RunPlan, RunReport]:
    """A fault-free fake run, executed in this process and verified clean."""
    env = Environment(tmp_path / "campaign")
    env.prepare(spark=False)
    plan = RunPlan.single(0, checkpoint_interval_s=0.0, **config)
    report = execute_run(env, plan, InProcessWorker())
    assert report.completed and report.verdict is not None
    assert report.problems() == [] and report.known_issues() == {}
    return env, plan, report


@pytest.fixture
def clean_run(tmp_path: Path) -> tuple[Environment, RunPlan, RunReport]:
    return _clean_run(tmp_path, retain_checkpoints=2)


def _verify(env: Environment, plan: RunPlan) -> Any:
    return runs_module.verify_setup(env, plan, env.setup(plan))


def _coordinator(env: Environment, plan: RunPlan) -> Coordinator:
    setup = env.setup(plan)
    return Coordinator(make_engine(setup.store_url), setup.pipeline_key)


def test_a_fault_free_run_reaches_every_runtime_and_coordinator_point(
    clean_run: tuple[Environment, RunPlan, RunReport],
) -> None:
    _, _, report = clean_run
    hits = report.attempts[0].hits or {}
    expected = {n for n, p in POINTS.items() if p.layer in (Layer.RUNTIME, Layer.COORDINATOR)} | {
        "metadata-before-write",
        "metadata-mid-write",
        "metadata-after-write",
    }
    assert expected <= set(hits), sorted(expected - set(hits))
    assert report.verdict is not None and report.verdict.rows
    assert all(r.found == r.expected > 0 for r in report.verdict.rows.values())


def test_verifier_sees_lost_rows_and_a_commit_missing_in_the_sink(
    clean_run: tuple[Environment, RunPlan, RunReport],
) -> None:
    env, plan, _ = clean_run
    parquet_dir = Path(env.setup(plan).parquet_dir)
    published = sorted(parquet_dir.glob("txn-publish.p*"))
    shutil.rmtree(published[0])
    verdict = _verify(env, plan)
    assert verdict.lost > 0
    assert any("COMMITTED in the coordinator but not in the sink" in o for o in verdict.orphaned)


def test_verifier_sees_duplicated_rows_and_a_batch_committed_twice(
    clean_run: tuple[Environment, RunPlan, RunReport],
) -> None:
    env, plan, _ = clean_run
    parquet_dir = Path(env.setup(plan).parquet_dir)
    source = sorted(parquet_dir.glob("txn-publish.p*"))[0]
    twin = source.with_name(re.sub(r"\.e\d+$", ".e9", source.name))
    shutil.copytree(source, twin)
    verdict = _verify(env, plan)
    assert verdict.duplicated > 0
    assert verdict.double_committed and "committed by 2 attempts" in verdict.double_committed[0]
    assert any("unknown in the coordinator" in o for o in verdict.orphaned)


def test_verifier_sees_wrong_values(clean_run: tuple[Environment, RunPlan, RunReport]) -> None:
    env, plan, _ = clean_run
    setup = env.setup(plan)
    engine = make_engine(setup.sql_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {setup.sql_table} SET total = total + 1 WHERE key = 'k0'"))
    engine.dispose()
    verdict = _verify(env, plan)
    assert verdict.rows[setup.sink_ids[1]].wrong > 0 and verdict.lost == 0


def test_verifier_sees_staged_leftovers_and_pending_checkpoints(
    clean_run: tuple[Environment, RunPlan, RunReport],
) -> None:
    env, plan, _ = clean_run
    setup = env.setup(plan)
    sinks = make_sinks(setup)
    try:
        for sink in sinks:
            sink.write_pandas("publish.extra.e1", pd.DataFrame(reference_windows(FakeData())))
            sink.precommit("publish.extra.e1", 0)
    finally:
        dispose_sinks(sinks)
    coordinator = _coordinator(env, plan)
    latest = coordinator.latest_completed()
    assert latest is not None
    with coordinator.engine.begin() as conn:
        conn.execute(
            update(t.checkpoints)
            .where(t.checkpoints.c.checkpoint_id == latest.checkpoint_id)
            .values(state="PENDING")
        )
    coordinator.engine.dispose()
    verdict = _verify(env, plan)
    assert verdict.pending == [latest.checkpoint_id]
    assert sum("staged transaction publish.extra.e1" in x for x in verdict.leaked) == 2
    assert any(f"chk-{latest.checkpoint_id} of a PENDING" in x for x in verdict.leaked)
    assert verdict.lost == verdict.duplicated == 0


def test_verifier_sees_a_retained_checkpoint_that_cannot_be_restored(tmp_path: Path) -> None:
    env, plan, _ = _clean_run(tmp_path, retain_checkpoints=100)  # mid-run ones hold state
    setup = env.setup(plan)
    coordinator = _coordinator(env, plan)
    storage = CheckpointStorage(setup.storage_root)
    retained = [c for c in coordinator.checkpoints() if c.state.value == "COMPLETED"]
    assert retained
    removed = None
    for info in retained:
        assert info.metadata_path is not None
        record = storage.read_checkpoint(info.metadata_path)
        handles = [h for r in record.stages.values() for h in r.state]
        if handles:
            removed = handles[0]
            Path(storage.resolve_handle(setup.pipeline_key, removed)).unlink()
            break
    assert removed is not None, "no retained checkpoint holds state"
    corrupt = storage.metadata_path(setup.pipeline_key, retained[0].checkpoint_id)
    Path(corrupt).write_bytes(b"{}")
    coordinator.engine.dispose()
    verdict = _verify(env, plan)
    assert any("is missing" in b for b in verdict.broken), verdict.broken
    assert any(f"checkpoint {retained[0].checkpoint_id} (" in b for b in verdict.broken)


def test_verifier_counts_what_fixed_known_issues_left_behind_as_leaks(
    clean_run: tuple[Environment, RunPlan, RunReport],
) -> None:
    """FC-1, FC-2, FC-3 and FC-5 are fixed: their leftovers are leaks, not known issues."""
    env, plan, _ = clean_run
    setup = env.setup(plan)
    coordinator = _coordinator(env, plan)
    discarded = [c.checkpoint_id for c in coordinator.checkpoints() if c.state.value == "DISCARDED"]
    coordinator.engine.dispose()
    assert discarded, "retention discarded nothing in the clean run"
    pipeline_dir = Path(setup.storage_root) / setup.pipeline_key
    (pipeline_dir / "chk-999").mkdir()  # FC-1: unknown to the coordinator
    (pipeline_dir / f"chk-{discarded[0]}").mkdir()  # FC-2: an interrupted discard
    (pipeline_dir / "data" / "x.json.tmp-0123").write_bytes(b"partial")  # FC-5
    (Path(setup.parquet_dir) / "_tmp-0123-x.json").write_bytes(b"partial")
    sinks = make_sinks(setup)
    try:  # FC-3: sealed by a stale attempt (epoch 0), never recorded
        sinks[0].write_pandas("publish.zombie.e0", pd.DataFrame(reference_windows(FakeData())))
        sinks[0].precommit("publish.zombie.e0", 0)
    finally:
        dispose_sinks(sinks)
    verdict = _verify(env, plan)
    assert verdict.known == {}
    leaked = "\n".join(verdict.leaked)
    assert "chk-999 (unknown to the coordinator) is still in storage" in leaked
    assert f"chk-{discarded[0]} of a DISCARDED checkpoint" in leaked
    assert "temporary file data/x.json.tmp-0123" in leaked
    assert f"sink temporary file {setup.parquet_dir}/_tmp-0123-x.json" in leaked
    assert "staged transaction publish.zombie.e0" in leaked and "stale attempt (epoch 0)" in leaked
    assert len(verdict.leaked) == 5, verdict.leaked


# ------------------------------------------------------------------------------ campaign


def test_plans_are_deterministic_and_cover_every_point() -> None:
    plans = plan_campaign(40, seed=11, spark_runs=5)
    assert [p.to_dict() for p in plans] == [p.to_dict() for p in plan_campaign(40, 11, 5)]
    assert sum(p.kind == "spark" for p in plans) == 5
    coverage = {p.purpose.removeprefix("coverage of ") for p in plans if p.purpose != "random"}
    assert set(POINTS) <= coverage
    for plan in plans:
        if plan.kind == "spark":
            assert all(s.action is not Action.ZOMBIE for a in plan.attempts for s in a)
        if plan.purpose == "coverage of sink-before-abort":
            assert plan.attempts[0][0].action is Action.CRASH  # leaves orphans to abort
    assert plan_campaign(40, seed=12, spark_runs=5) != plans


def test_stale_commits_are_commits_of_the_stalled_stage_after_the_takeover() -> None:
    def commit(label: str, txn: str, new: bool, at: float) -> dict[str, Any]:
        return {
            "event": "sink-commit",
            "label": label,
            "txn": txn,
            "sink": "s",
            "new": new,
            "t": at,
        }

    events = [
        {"event": "successor-start", "label": "r.a1", "stage": "publish", "t": 10.0},
        commit("r.a1", "publish.b.e1", True, 5.0),  # before the takeover
        commit("r.a1", "publish.c.e1", False, 11.0),  # a no-op commit
        commit("r.a2", "publish.d.e2", True, 12.0),  # the newer attempt
        commit("r.a1", "other.e.e1", True, 13.0),  # another stage
        commit("r.a1", "publish.f.e1", True, 14.0),
    ]
    assert stale_commits(events) == [
        "r.a1 committed s/publish.f.e1 after a newer attempt of stage publish took over"
    ]


def test_summary_line_and_ok(clean_run: tuple[Environment, RunPlan, RunReport]) -> None:
    _, _, report = clean_run
    result = CampaignResult(7, [report], 1.0, "2026-01-01T00:00:00+00:00", "sqlite")
    assert result.ok
    line = result.summary()
    for figure in ("lost 0", "duplicated 0", "orphaned 0", "leaked 0", "pending 0", "seed=7"):
        assert figure in line
    assert "known issues: none" in line
    report.unexpected.append("boom")
    assert not CampaignResult(7, [report], 1.0, "x", "sqlite").ok


def test_known_issues_are_described() -> None:
    assert not {"FC-1", "FC-2", "FC-3", "FC-4", "FC-5"} & set(KNOWN_ISSUES)  # fixed
    assert all(len(d) > 40 for d in KNOWN_ISSUES.values())


def test_the_guarantees_page_lists_every_point_and_known_issue() -> None:
    page = (Path(__file__).parents[2] / "docs" / "guarantees.md").read_text()
    missing = [name for name in POINTS if f"`{name}`" not in page]
    assert not missing, f"docs/guarantees.md does not describe fault points {missing}"
    assert all(f"| {issue} |" in page for issue in KNOWN_ISSUES)


def test_random_kill_runs_are_not_counted_as_external_fault_scenarios() -> None:
    """The summary's "N external" counts the --external scenarios only; planned runs that get
    a SIGKILL from outside at a random moment are "random kill" runs."""
    plans = plan_campaign(60, seed=5)
    kills = [p for p in plans if any(k is not None for k in p.kills)]
    assert kills and {p.purpose for p in kills} == {"random kill"}
    assert not [p for p in plans if p.purpose.startswith("external")]
