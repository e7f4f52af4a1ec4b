"""The pure batching rule (``core.plan_check``): which operator over which input may run per
split batch, and what the verdict names when it may not."""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.plan_check import (
    DRIVER_ACTION_RULE,
    Input,
    Op,
    PlanCheck,
    PlanNode,
    Verdict,
    check_plan,
    driver_action_check,
    reads_batch,
    refuse_fixed_batches,
    repeated_split_key,
)

BATCH = PlanNode(Op.LEAF, "LogicalRelation", input=Input.BATCH)
CONST = PlanNode(Op.LEAF, "LocalRelation", input=Input.CONSTANT)
STATE = PlanNode(Op.LEAF, "LogicalRelation", input=Input.STATE)


def node(op: Op, *children: PlanNode, name: str = "", **kw: object) -> PlanNode:
    return PlanNode(op, name or op.value.title(), tuple(children), **kw)  # type: ignore[arg-type]


def local(child: PlanNode) -> PlanNode:
    return node(Op.LOCAL, child, name="Project")


def verdict(root: PlanNode, split_keys: tuple[str, ...] = ()) -> Verdict:
    return check_plan(root, split_keys).verdict


@pytest.mark.parametrize(
    "root",
    [
        BATCH,
        local(local(BATCH)),
        node(Op.LOCAL, BATCH, name="Filter"),
        node(Op.LOCAL, BATCH, name="Generate"),
        node(Op.UNION, BATCH, local(BATCH)),
        node(Op.JOIN, BATCH, CONST, join="inner"),
        node(Op.JOIN, BATCH, CONST, join="left"),
        node(Op.JOIN, BATCH, CONST, join="leftsemi"),
        node(Op.JOIN, BATCH, CONST, join="leftanti"),
        node(Op.JOIN, CONST, BATCH, join="right"),
        node(Op.JOIN, CONST, BATCH, join="inner"),
        # operators over constant inputs only, joined with the batch
        node(Op.JOIN, BATCH, node(Op.AGGREGATE, CONST, keys=("k",)), join="inner"),
        node(Op.JOIN, BATCH, node(Op.SORT, node(Op.LIMIT, CONST)), join="cross"),
        node(Op.LOCAL, BATCH, subqueries=(node(Op.AGGREGATE, CONST),)),
    ],
)
def test_split_local_plans_batch_freely(root: PlanNode) -> None:
    assert check_plan(root) == PlanCheck(Verdict.SPLIT_LOCAL)


@pytest.mark.parametrize(
    ("root", "operator", "why"),
    [
        (node(Op.AGGREGATE, BATCH, keys=("key",)), "Aggregate", "different splits by (key)"),
        (node(Op.AGGREGATE, BATCH), "Aggregate", "over all rows"),
        (node(Op.WINDOW, local(BATCH), keys=("k",)), "Window", "by (k)"),
        (node(Op.DISTINCT, BATCH, keys=("a", "b")), "Distinct", "by (a, b)"),
        (node(Op.GROUPED_UDF, BATCH, keys=("k",), name="FlatMapGroupsInPandas"), "FlatMap", ""),
        (node(Op.COGROUP, BATCH, CONST, keys=("k",)), "Cogroup", "by (k)"),
        (node(Op.SORT, BATCH), "Sort", "global orderBy"),
        (node(Op.LIMIT, BATCH, name="GlobalLimit"), "GlobalLimit", "limit"),
        (node(Op.LIMIT, node(Op.SORT, BATCH)), "Sort", "global orderBy"),
        (node(Op.JOIN, BATCH, local(BATCH), join="inner"), "Join", "both change"),
        (node(Op.JOIN, BATCH, CONST, join="full"), "Join", "unmatched rows"),
        (node(Op.JOIN, BATCH, CONST, join="right"), "Join", "unmatched rows"),
        (node(Op.JOIN, CONST, BATCH, join="left"), "Join", "unmatched rows"),
        (node(Op.JOIN, CONST, BATCH, join="leftanti"), "Join", "unmatched rows"),
        (node(Op.UNION, BATCH, CONST), "Union", "constant rows"),
        (node(Op.UNKNOWN, BATCH, name="Intersect"), "Intersect", "not known"),
        (local(CONST), "Project", "no input that changes with the batch"),
        (node(Op.LOCAL, BATCH, subqueries=(local(BATCH),)), "Local", "subquery"),
        (node(Op.LOCAL, BATCH, subqueries=(node(Op.AGGREGATE, BATCH),)), "Aggregate", "over all"),
    ],
)
def test_plans_that_need_the_whole_input_name_the_operator(
    root: PlanNode, operator: str, why: str
) -> None:
    check = check_plan(root)
    assert check.verdict is Verdict.WHOLE_INPUT and check.whole_input
    assert check.operator.startswith(operator) and why in check.reason
    assert check.describe().startswith(f"one batch per attempt: {check.operator} ")


@pytest.mark.parametrize("op", [Op.AGGREGATE, Op.WINDOW, Op.DISTINCT, Op.GROUPED_UDF, Op.COGROUP])
def test_grouping_by_all_split_keys_is_batchable(op: Op) -> None:
    root = local(node(op, local(BATCH), keys=("Event_Date", "key")))
    check = check_plan(root, ("event_date",))
    assert check.verdict is Verdict.SPLIT_KEYED and check.operator == op.value.title()
    assert "split keys (event_date)" in check.describe()
    assert verdict(root, ("event_date", "key")) is Verdict.SPLIT_KEYED


@pytest.mark.parametrize(
    ("keys", "split_keys", "missing"),
    [
        (("key",), ("event_date",), "event_date"),
        (("day",), ("day", "hour"), "hour"),
        ((), ("d",), "d"),
    ],
)
def test_grouping_without_every_split_key_needs_the_whole_input(
    keys: tuple[str, ...], split_keys: tuple[str, ...], missing: str
) -> None:
    check = check_plan(node(Op.AGGREGATE, BATCH, keys=keys), split_keys)
    assert check.verdict is Verdict.WHOLE_INPUT
    assert f"without the split keys ({missing})" in check.reason


def test_split_keys_do_not_make_sorts_limits_or_batch_joins_batchable() -> None:
    for root in (
        node(Op.SORT, BATCH),
        node(Op.LIMIT, BATCH),
        node(Op.JOIN, BATCH, BATCH, join="inner"),
    ):
        assert verdict(root, ("event_date",)) is Verdict.WHOLE_INPUT


def test_a_grouping_over_constant_input_does_not_need_split_keys() -> None:
    dims = node(Op.DISTINCT, node(Op.AGGREGATE, CONST, keys=("k",)), keys=("k",))
    assert verdict(node(Op.JOIN, BATCH, dims, join="left")) is Verdict.SPLIT_LOCAL


def test_keyed_state_is_the_authors_incremental_logic() -> None:
    windows = node(Op.AGGREGATE, node(Op.UNION, BATCH, STATE), keys=("origin",))
    assert verdict(windows) is Verdict.KEYED_STATE
    # the first batch has no state yet: the transform's use of it says so
    first = node(Op.AGGREGATE, BATCH, keys=("origin",))
    assert check_plan(first, uses_keyed_state=True).verdict is Verdict.KEYED_STATE
    assert check_plan(first).verdict is Verdict.WHOLE_INPUT


def test_the_refusal_of_a_fixed_batch_size_names_the_ways_out() -> None:
    check = check_plan(node(Op.AGGREGATE, BATCH, keys=("key",)))
    message = refuse_fixed_batches("daily", 5, check)
    for part in ("'daily'", "batch_size=5", "Aggregate", "split_keys=", "'auto'", "incremental"):
        assert part in message


def test_a_split_key_value_repeated_in_another_batch_is_found() -> None:
    seen = {'["2024-03-01"]': "b1"}
    assert repeated_split_key(seen, ['["2024-03-02"]'], "b2") is None
    assert repeated_split_key(seen, ['["2024-03-02"]', '["2024-03-01"]'], "b2") == (
        '["2024-03-01"]',
        "b1",
    )
    # a redone batch (same key) is not a repeat
    assert repeated_split_key(seen, ['["2024-03-01"]'], "b1") is None


# -- driver-side actions (rule driver-action-on-batch) -----------------------------------------


def test_a_driver_action_on_the_batch_needs_the_whole_input_whatever_the_plan() -> None:
    """A local relation built on the driver from collected rows looks split-local."""
    built_on_driver = local(BATCH)
    assert check_plan(built_on_driver).verdict is Verdict.SPLIT_LOCAL
    check = check_plan(built_on_driver, driver_actions=["collect", "count", "collect"])
    assert check.verdict is Verdict.WHOLE_INPUT and check.whole_input
    assert check.rule == DRIVER_ACTION_RULE and check.operator == "collect(), count()"
    assert DRIVER_ACTION_RULE in check.describe()
    # split keys do not make it batchable: what the driver did is no grouping to check
    keyed = check_plan(node(Op.AGGREGATE, BATCH, keys=("day",)), ("day",), driver_actions=["count"])
    assert keyed.verdict is Verdict.WHOLE_INPUT and keyed.rule == DRIVER_ACTION_RULE


def test_keyed_state_stays_trusted_with_driver_actions() -> None:
    """The windows' watermark statistics are a driver action on the batch (docs/aggregation.md)."""
    check = check_plan(local(BATCH), uses_keyed_state=True, driver_actions=["first"])
    assert check.verdict is Verdict.KEYED_STATE


def test_the_refusal_of_a_driver_action_names_the_rule_and_the_ways_out() -> None:
    message = refuse_fixed_batches("counts", 1, driver_action_check(["toPandas"]))
    for part in ("'counts'", "batch_size=1", "toPandas()", DRIVER_ACTION_RULE, "'auto'"):
        assert part in message
    assert "split_keys" not in message  # not a way out of this rule
    assert "\n" not in message


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        (BATCH, True),
        (CONST, False),
        (STATE, False),
        (node(Op.JOIN, CONST, STATE, join="inner"), False),
        (node(Op.JOIN, CONST, local(BATCH), join="inner"), True),
        (node(Op.LOCAL, CONST, subqueries=(local(BATCH),)), True),
    ],
)
def test_an_action_is_on_the_batch_when_its_frame_reads_the_batch(
    root: PlanNode, expected: bool
) -> None:
    assert reads_batch(root) is expected
