"""Whether a stage's transform may run per split batch, from the shape of its logical plan.

A stage runs its transform once per batch of splits and keeps the union of the batches'
outputs. That union equals the plain job over the whole input only when the plan is *linear*
in the batch's input: every output row comes from rows of one batch (project, filter, explode,
record-wise UDFs, joins against inputs that are the same for every batch). Operators that
combine rows of different splits (aggregates, windows, dedup, global sorts, limits, joins of two
batch inputs, grouped pandas UDFs) give a different answer per batch, unless the splits
partition the data by their keys (``split_keys``), like Spark's checker refuses what a
streaming query cannot do incrementally.

A transform can also hide a combination from the plan: it runs a Spark action on its batch
while it is called (``collect()`` or ``toPandas()`` of the batch, then ``createDataFrame`` of
what the driver computed; a ``count()`` used in a later filter). The returned frame is then a
local relation built from one batch, so its plan says nothing; ``spark.driver_actions`` reports
such actions and the rule ``driver-action-on-batch`` treats them like an operator that needs the
whole input.

The rules are here as pure functions over an immutable tree of plain values; the Spark adapters
(``spark.plans``) translate classic and Spark Connect plans into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from airflow_finalckpt.core.errors import StageDefinitionError


class Op(StrEnum):
    """What kind of operator a plan node is (the classification's vocabulary)."""

    #: A leaf: this batch's input, an input the same for every batch, or keyed state.
    LEAF = "leaf"
    #: Row by row: project, filter, explode, record-wise UDFs, repartition, hints, aliases.
    LOCAL = "local"
    AGGREGATE = "aggregate"
    WINDOW = "window"
    #: distinct / dropDuplicates (keys: the dedup columns).
    DISTINCT = "distinct"
    #: Grouped pandas UDFs (applyInPandas, grouped map/agg): keys are the grouping columns.
    GROUPED_UDF = "grouped-udf"
    #: A cogrouped pandas UDF: two inputs grouped by keys.
    COGROUP = "cogroup"
    #: A global sort (orderBy); a sort within partitions is LOCAL.
    SORT = "sort"
    LIMIT = "limit"
    JOIN = "join"
    UNION = "union"
    #: An operator the adapter does not know: split-local only over constant inputs.
    UNKNOWN = "unknown"


class Input(StrEnum):
    """What a leaf reads."""

    #: Changes with the batch: this batch's parts or splits (the default of unknown leaves).
    BATCH = "batch"
    #: The same for every batch: attempt_value, broadcast_table, a whole upstream, global state.
    CONSTANT = "constant"
    #: Keyed state (get_state): the author's incremental logic.
    STATE = "state"


class Verdict(StrEnum):
    """What the plan allows."""

    #: Linear in the batch input: any batching gives the plain job's rows.
    SPLIT_LOCAL = "split-local"
    #: Grouped by keys that include the split keys: batchable while no split-key value
    #: appears in two batches (checked at run time).
    SPLIT_KEYED = "split-keyed"
    #: Uses keyed state: the author's incremental logic, trusted.
    KEYED_STATE = "keyed-state"
    #: Needs the whole input at once: one batch per attempt.
    WHOLE_INPUT = "whole-input"


#: Join types whose output keeps every row of the left input once per batch it is read in,
#: i.e. that stay linear when the left input is the batch and the right one is constant.
_LEFT_LINEAR_JOINS = frozenset({"inner", "cross", "left", "leftsemi", "leftanti", "existence"})
#: ... and the ones linear when the right input is the batch and the left one is constant.
_RIGHT_LINEAR_JOINS = frozenset({"inner", "cross", "right"})


@dataclass(frozen=True)
class PlanNode:
    """One operator of a logical plan, as plain values.

    ``name``: Spark's name of the operator (for messages); ``keys``: the column names an
    aggregate/window/dedup/grouped UDF groups by (lower case); ``join``: the join type
    (``inner``, ``left``, ``right``, ``full``, ``leftsemi``, ``leftanti``, ``cross``);
    ``input``: what a leaf reads; ``subqueries``: plans used inside expressions.
    """

    op: Op
    name: str
    children: tuple[PlanNode, ...] = ()
    keys: tuple[str, ...] = ()
    join: str = ""
    input: Input | None = None
    subqueries: tuple[PlanNode, ...] = ()


#: The rule that sees Spark actions a transform ran on its batch on the driver.
DRIVER_ACTION_RULE = "driver-action-on-batch"


@dataclass(frozen=True)
class PlanCheck:
    """The verdict on a transform's plan, with the operator that caused it and why; ``rule``:
    the named rule behind a verdict that does not come from the plan's operators.
    """

    verdict: Verdict
    operator: str = ""
    reason: str = ""
    rule: str = ""

    @property
    def whole_input(self) -> bool:
        """Whether the stage must run its pending splits as one batch."""
        return self.verdict is Verdict.WHOLE_INPUT

    def describe(self) -> str:
        """The verdict in words, for logs, ``finalckpt progress`` and the UI."""
        if self.verdict is Verdict.WHOLE_INPUT:
            return f"one batch per attempt: {self.operator} {self.reason}"
        if self.verdict is Verdict.SPLIT_KEYED:
            return f"batched by split keys: {self.operator} {self.reason}"
        if self.verdict is Verdict.KEYED_STATE:
            return "batched: keyed state (the transform's own incremental logic)"
        return "batched: split-local"


class BatchingRefusedError(StageDefinitionError):
    """A fixed ``batch_size`` on a stage whose plan needs the whole input at once."""


class SplitKeyRepeatedError(StageDefinitionError):
    """A split-key value appeared in two batches: the splits do not partition the data."""


class _WholeInput(Exception):
    def __init__(self, node: PlanNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


@dataclass
class _Walk:
    split_keys: frozenset[str]
    keyed_by: PlanNode | None = None
    keyed_state: bool = False


def check_plan(
    root: PlanNode,
    split_keys: Sequence[str] = (),
    *,
    uses_keyed_state: bool = False,
    driver_actions: Sequence[str] = (),
) -> PlanCheck:
    """The verdict on the plan of the frame a transform returned for one batch;
    ``uses_keyed_state``: the transform read or wrote keyed state in this batch;
    ``driver_actions``: the DataFrame actions it ran over this batch's input while called.
    """
    if driver_actions and not uses_keyed_state:
        return driver_action_check(driver_actions)
    walk = _Walk(frozenset(k.lower() for k in split_keys), keyed_state=uses_keyed_state)
    try:
        batch = _flow(root, walk)
        if walk.keyed_state:
            return PlanCheck(Verdict.KEYED_STATE)
        if not batch:
            raise _WholeInput(
                root,
                "reads no input that changes with the batch: its rows would be written once "
                "per batch",
            )
    except _WholeInput as whole:
        if walk.keyed_state:
            return PlanCheck(Verdict.KEYED_STATE)
        return PlanCheck(Verdict.WHOLE_INPUT, whole.node.name, whole.reason)
    keyed = walk.keyed_by
    if keyed is not None:
        keys = ", ".join(sorted(walk.split_keys))
        return PlanCheck(Verdict.SPLIT_KEYED, keyed.name, f"groups by the split keys ({keys})")
    return PlanCheck(Verdict.SPLIT_LOCAL)


def driver_action_check(actions: Sequence[str]) -> PlanCheck:
    """The verdict on a transform that ran Spark ``actions`` over its batch's input on the
    driver: whatever it built from their results (a local relation, a filter on a count) is
    a per-batch answer the returned frame's plan cannot show, so it needs the whole input.
    Split keys do not help: what the driver did with the rows is not a grouping to check.
    """
    names = ", ".join(f"{name}()" for name in dict.fromkeys(actions))
    return PlanCheck(
        Verdict.WHOLE_INPUT,
        names,
        "ran over this batch's input on the driver while the transform was called (rule "
        f"{DRIVER_ACTION_RULE}): what the transform built from it is a per-batch result",
        rule=DRIVER_ACTION_RULE,
    )


def reads_batch(node: PlanNode) -> bool:
    """Whether any leaf of the plan (subqueries included) reads input that changes with the
    batch (the frame an action runs on: an action over constant inputs or keyed state only
    gives the same answer for any batching).
    """
    if node.op is Op.LEAF:
        return node.input is Input.BATCH
    return any(reads_batch(child) for child in (*node.children, *node.subqueries))


def _flow(node: PlanNode, walk: _Walk) -> bool:
    """Whether ``node``'s rows change with the batch (else they are the same every batch);
    raises _WholeInput where the batch input meets an operator that is not split-local.
    """
    if node.op is Op.LEAF:
        if node.input is Input.STATE:
            walk.keyed_state = True
        return node.input is Input.BATCH
    for sub in node.subqueries:
        if _flow(sub, walk):
            raise _WholeInput(node, "uses a subquery over the batch's input")
    flows = [_flow(child, walk) for child in node.children]
    if not any(flows):
        return False
    if node.op is Op.LOCAL and len(flows) == 1:
        return True
    if node.op in (Op.AGGREGATE, Op.WINDOW, Op.DISTINCT, Op.GROUPED_UDF, Op.COGROUP):
        return _grouped(node, walk)
    return _combined(node, flows)


def _combined(node: PlanNode, flows: list[bool]) -> bool:
    """The other operators over at least one input that changes with the batch."""
    op = node.op
    if op is Op.UNION or (op is Op.LOCAL and len(flows) > 1):
        if all(flows):
            return True
        raise _WholeInput(
            node,
            "combines an input that changes with the batch with one that does not: the "
            "constant rows would be written once per batch",
        )
    if op is Op.JOIN:
        return _join(node, flows)
    if op is Op.SORT:
        raise _WholeInput(node, "sorts the whole input (a global orderBy)")
    if op is Op.LIMIT:
        raise _WholeInput(node, "keeps a number of rows of the whole input (limit)")
    raise _WholeInput(node, "is not known to be split-local")


def _grouped(node: PlanNode, walk: _Walk) -> bool:
    """A grouping operator over the batch input: batchable when its keys hold the split keys."""
    keys = frozenset(k.lower() for k in node.keys)
    if walk.split_keys and walk.split_keys <= keys:
        walk.keyed_by = walk.keyed_by or node
        return True
    grouped = f"by ({', '.join(node.keys)})" if node.keys else "over all rows"
    if not walk.split_keys:
        raise _WholeInput(node, f"combines rows of different splits {grouped}")
    missing = ", ".join(sorted(walk.split_keys - keys))
    raise _WholeInput(node, f"combines rows {grouped}, without the split keys ({missing})")


def _join(node: PlanNode, flows: list[bool]) -> bool:
    """A join is linear when exactly one side is the batch and it keeps that side's rows."""
    left, right = flows[0], flows[-1]
    kind = node.join.lower().replace("_", "").replace("outer", "")
    if left and right:
        raise _WholeInput(node, "joins two inputs that both change with the batch")
    if (left and kind in _LEFT_LINEAR_JOINS) or (right and kind in _RIGHT_LINEAR_JOINS):
        return True
    raise _WholeInput(
        node,
        f"({node.join or 'join'}) keeps unmatched rows of an input that does not change with "
        "the batch: they would be written once per batch",
    )


def refuse_fixed_batches(stage_id: str, batch_size: int, check: PlanCheck) -> str:
    """The one-line refusal of ``batch_size=N`` on a stage whose plan needs the whole input,
    with the ways out that fit its cause.
    """
    if check.rule == DRIVER_ACTION_RULE:
        way_out = (
            "compute it in Spark on the frame the transform returns (a groupBy the check sees)"
        )
    else:
        way_out = (
            "split_keys=(...) naming the columns the splits partition the data by (if the "
            "operator groups by them)"
        )
    return (
        f"stage {stage_id!r}: batch_size={batch_size} is refused: {check.operator} "
        f"{check.reason}, so its result over {batch_size}-split batches "
        "would differ from the plain job over the whole input. "
        f"Ways out: {way_out}, batch_size='auto' (the stage then runs as one batch per "
        "attempt), or an incremental aggregation (airflow_finalckpt.spark.aggregate)"
    )


def repeated_split_key(
    seen: dict[str, str], values: Sequence[str], batch: str
) -> tuple[str, str] | None:
    """The first of a batch's split-key ``values`` that an earlier batch had, with that
    batch (``seen``: value -> batch key); None if all are new.
    """
    for value in values:
        earlier = seen.get(value)
        if earlier is not None and earlier != batch:
            return value, earlier
    return None
