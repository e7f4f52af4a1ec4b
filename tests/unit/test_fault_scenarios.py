"""Plans and checks of the fault campaign's scenarios (``faults.scenarios``, issue 25): a branch
failing on every try while its sibling waits, two DAG runs on one pipeline key. The runs
themselves are in ``tests/integration/test_fault_campaign.py`` (the CI campaign) and
``tests/integration/test_concurrent_faults.py``."""

from __future__ import annotations

import pytest

from faults.campaign import main
from faults.concurrent import publication_problems
from faults.points import Action
from faults.scenarios import (
    CRASH_LEASE_S,
    FAILING_BRANCH,
    TRIES,
    TWO_RUNS,
    expand,
    plan_scenarios,
)


def test_all_plans_four_failing_branch_runs_and_two_second_runs() -> None:
    plans = plan_scenarios(["all"], seed=3, first_index=10)
    assert [p.run_id for p in plans] == [f"r{i:04d}" for i in range(10, 16)]
    assert plan_scenarios(["all"], seed=3, first_index=10) == plans  # deterministic per seed
    failing = [p for p in plans if p.scenario == FAILING_BRANCH]
    assert sorted((p.doomed, p.attempt_lease_s) for p in failing) == [
        (("carrier_daily",), CRASH_LEASE_S),
        (("carrier_daily",), 60.0),
        (("delay_windows",), CRASH_LEASE_S),
        (("delay_windows",), 60.0),
    ]
    for plan in failing:
        [doomed] = plan.doomed
        assert len(plan.attempts) == TRIES
        for attempt in plan.attempts:
            # every try: hold until the sibling finished, then fail before the first batch
            mine = [s for s in attempt if s.stage == doomed]
            assert mine[0].action is Action.DELAY and mine[0].until
            assert mine[-1].action in (Action.RAISE, Action.CRASH) and mine[-1].nth == 1
        # the sibling's first batch waits until the failing stage runs: its final checkpoint
        # must wait for that stage
        [sibling_hold] = [s for s in plan.attempts[0] if s.stage != doomed]
        assert sibling_hold.until == (f"{doomed}:started",)
    two = [p for p in plans if p.scenario == TWO_RUNS]
    assert [p.second_run for p in two] == ["refused", "take-over"]
    assert all(p.attempts[0][0].until == ("@second-run-ended:finished",) for p in two)


def test_unknown_scenarios_are_refused_with_the_known_ones() -> None:
    assert expand(["two-runs", "all"]) == ["two-runs", "failing-branch"]
    with pytest.raises(ValueError, match=r"unknown scenarios \['nope'\]; known: failing-branch"):
        expand(["nope"])


def test_the_command_line_refuses_an_unknown_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--runs", "0", "--seed", "1", "--scenarios", "two-runs,nope"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--scenarios: unknown scenarios ['nope']; known: failing-branch, two-runs, all" in err


def test_one_publication_per_commit() -> None:
    def published(stage: str, run: str) -> dict[str, str]:
        return {"event": "publication", "stage": stage, "dag_run": run}

    events = [published("a", "run-1"), published("b", "run-1"), published("b", "run-2")]
    assert publication_problems(events, {"a", "b", "c"}) == [
        "stage b closed once, announced 2 times (by ['run-1', 'run-2'])",
        "stage c closed once, announced 0 times (by [])",
    ]
    assert publication_problems(events[:1], {"a"}) == []
    assert publication_problems(events[:1], set()) == [
        "stage a is not CLOSED but was announced by ['run-1']"
    ]
