"""Translate the plan of the frame a transform returned into ``core.plan_check``'s tree.

Building a DataFrame runs no Spark job, and neither does this: a classic session's analyzed
plan comes back in one py4j call (``toJSON``), a Spark Connect frame's plan is client-side
(``df._plan``). Leaves are classified by the frames the ``BatchContext`` handed out
(``InputTags``): this batch's parts, inputs the same for every batch, keyed state; a leaf
nobody tagged is taken as batch input (the conservative side).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from airflow_finalckpt.core.plan_check import Input, Op, PlanNode

#: Classic operators that work row by row (or only move rows between partitions).
_CLASSIC_LOCAL = frozenset(
    {
        "Project",
        "Filter",
        "Generate",
        "SubqueryAlias",
        "View",
        "ResolvedHint",
        "UnresolvedHint",
        "Repartition",
        "RepartitionByExpression",
        "RebalancePartitions",
        "Sample",
        "MapInPandas",
        "MapInArrow",
        "PythonMapInArrow",
        "ArrowEvalPython",
        "BatchEvalPython",
        "MapPartitions",
        "MapPartitionsInR",
        "MapElements",
        "SerializeFromObject",
        "DeserializeToObject",
        "AppendColumns",
        "TypedFilter",
        "EventTimeWatermark",
        "CollectMetrics",
        "Expand",
        "WithMetadata",
        "Unpivot",
    }
)
_CLASSIC_GROUPED_UDF = frozenset(
    {
        "FlatMapGroupsInPandas",
        "FlatMapGroupsInArrow",
        "FlatMapGroupsInR",
        "MapGroups",
        "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState",
        "TransformWithState",
        "TransformWithStateInPySpark",
    }
)
_CLASSIC_COGROUP = frozenset({"FlatMapCoGroupsInPandas", "FlatMapCoGroupsInArrow", "CoGroup"})
_CLASSIC_LIMIT = frozenset({"Limit", "Tail", "Offset"})
#: Operators of a fixed kind (without keys) by their classic name.
_CLASSIC_PLAIN = {
    **dict.fromkeys(_CLASSIC_LIMIT, Op.LIMIT),
    "Sort": Op.SORT,  # global: a sort within partitions is local (checked first)
    "Union": Op.UNION,
    "Distinct": Op.DISTINCT,  # SQL DISTINCT: keys (all columns) unknown here
}
_JOIN_TYPES = {
    "inner": "inner",
    "cross": "cross",
    "leftouter": "left",
    "left": "left",
    "rightouter": "right",
    "right": "right",
    "fullouter": "full",
    "outer": "full",
    "full": "full",
    "leftsemi": "leftsemi",
    "semi": "leftsemi",
    "leftanti": "leftanti",
    "anti": "leftanti",
}


class InputTags:
    """The frames a ``BatchContext`` handed out, with what they read (held for one attempt:
    batch inputs are forgotten after each batch, constant ones stay).
    """

    def __init__(self) -> None:
        self._frames: dict[int, tuple[Any, Input]] = {}
        #: classic only: per tagged frame, its leaves' attribute ids and signatures (one py4j
        #: call per frame)
        self._leaves: dict[int, tuple[frozenset[int], frozenset[LeafSignature]]] = {}

    def tag(self, frame: Any, kind: Input) -> None:
        """Remember that ``frame`` (or the frames in a tuple/list/dict) reads ``kind``."""
        if isinstance(frame, dict):
            for value in frame.values():
                self.tag(value, kind)
        elif isinstance(frame, list | tuple):
            for value in frame:
                self.tag(value, kind)
        elif _is_frame(frame) and id(frame) not in self._frames:
            self._frames[id(frame)] = (frame, kind)

    def end_batch(self) -> None:
        """Forget the frames of the batch just run (a new batch reads new parts)."""
        for key, (_, kind) in list(self._frames.items()):
            if kind is not Input.CONSTANT:
                del self._frames[key]
                self._leaves.pop(key, None)

    def classic_leaves(self) -> ClassicLeaves:
        """What the tagged classic frames' leaves read: by attribute id, and by signature for
        the copies Spark makes of a relation used twice (a self join gets new attribute ids).
        """
        ids: dict[int, Input] = {}
        signatures: dict[LeafSignature, set[Input]] = {}
        for key, (frame, kind) in self._frames.items():
            if not hasattr(frame, "_jdf"):
                continue
            if key not in self._leaves:
                nodes = json.loads(frame._jdf.queryExecution().analyzed().toJSON())
                leaves = [node for node in nodes if node.get("num-children") == 0]
                self._leaves[key] = (
                    frozenset(i for node in leaves for i in _output_ids(node)),
                    frozenset(_signature(node) for node in leaves),
                )
            leaf_ids, leaf_signatures = self._leaves[key]
            for attr in leaf_ids:
                ids.setdefault(attr, kind)
            for signature in leaf_signatures:
                signatures.setdefault(signature, set()).add(kind)
        unique = {sig: kinds.pop() for sig, kinds in signatures.items() if len(kinds) == 1}
        return ClassicLeaves(ids, unique)

    def connect_ids(self) -> dict[int, Input]:
        """Plan id of a tagged Spark Connect frame -> what that frame reads."""
        return {
            frame._plan._plan_id: kind
            for frame, kind in self._frames.values()
            if getattr(frame, "_plan", None) is not None
        }


#: A leaf's operator and output columns (name, type): the same for copies of one relation.
LeafSignature = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class ClassicLeaves:
    """What tagged leaves read, by attribute id and (when unambiguous) by signature."""

    ids: dict[int, Input]
    signatures: dict[LeafSignature, Input]


def _signature(node: dict[str, Any]) -> LeafSignature:
    columns = tuple(
        (str(expr[0].get("name")), str(expr[0].get("dataType")))
        for expr in node.get("output") or []
        if expr
    )
    return _simple(node["class"]), columns


def _is_frame(obj: Any) -> bool:
    if isinstance(obj, DataFrame):
        return True
    return type(obj).__name__ == "DataFrame" and hasattr(obj, "_plan")


def plan_tree(frame: Any, tags: InputTags) -> PlanNode:
    """The tree of the frame's logical plan (classic: analyzed plan; Connect: client plan)."""
    if hasattr(frame, "_jdf"):
        nodes = json.loads(frame._jdf.queryExecution().analyzed().toJSON())
        return _ClassicReader(nodes, tags.classic_leaves()).node()
    return _connect_node(frame._plan, tags.connect_ids())


# ----------------------------------------------------------------------------- classic


def _simple(cls: str) -> str:
    return cls.rsplit(".", 1)[-1].rstrip("$")


def _output_ids(node: dict[str, Any]) -> Iterator[int]:
    for expr in node.get("output") or []:
        if expr and "exprId" in expr[0]:
            yield int(expr[0]["exprId"]["id"])


def _attribute_names(exprs: Sequence[Any] | None) -> tuple[list[str], set[int]]:
    """Names (and ids) of the bare columns among flattened expressions (others are skipped)."""
    names, ids = [], set()
    for expr in exprs or []:
        root = expr[0] if isinstance(expr, list) and expr else expr
        if isinstance(root, dict) and _simple(root.get("class", "")) == "AttributeReference":
            names.append(str(root["name"]))
            ids.add(int(root["exprId"]["id"]))
    return names, ids


def _subplans(value: Any) -> Iterator[list[dict[str, Any]]]:
    """Plans of subquery expressions found anywhere inside a node's fields."""
    if isinstance(value, dict):
        plan = value.get("plan")
        if isinstance(plan, list) and plan and isinstance(plan[0], dict) and "class" in plan[0]:
            yield plan
        for key, inner in value.items():
            if key != "plan":
                yield from _subplans(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _subplans(inner)


class _ClassicReader:
    """Reads the pre-order node list of ``LogicalPlan.toJSON`` back into a tree."""

    def __init__(self, nodes: list[dict[str, Any]], tagged: ClassicLeaves) -> None:
        self.nodes = nodes
        self.tagged = tagged
        self.at = 0

    def node(self) -> PlanNode:
        raw = self.nodes[self.at]
        self.at += 1
        children = tuple(self.node() for _ in range(int(raw.get("num-children", 0))))
        name = _simple(raw["class"])
        if name in ("GlobalLimit", "LocalLimit"):
            name = "Limit"  # df.limit(n) is both: name it once, as the user wrote it
        subqueries = tuple(
            _ClassicReader(plan, self.tagged).node()
            for key, value in raw.items()
            if key not in ("class", "num-children", "child", "left", "right", "children")
            for plan in _subplans(value)
        )
        if not children:
            return PlanNode(Op.LEAF, name, input=self._leaf_input(raw))
        op, keys, join = self._classify(name, raw, children)
        return PlanNode(op, name, children, keys=keys, join=join, subqueries=subqueries)

    def _leaf_input(self, raw: dict[str, Any]) -> Input:
        ids = list(_output_ids(raw))
        if not ids:
            return Input.CONSTANT  # OneRowRelation and the like: no rows of any input
        kinds = {self.tagged.ids.get(i) for i in ids}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop() or Input.BATCH
        # a copy of a tagged relation (used twice: new attribute ids), else unknown: batch
        return self.tagged.signatures.get(_signature(raw), Input.BATCH)

    def _classify(
        self, name: str, raw: dict[str, Any], children: tuple[PlanNode, ...]
    ) -> tuple[Op, tuple[str, ...], str]:
        if name in _CLASSIC_LOCAL or (name == "Sort" and not raw.get("global")):
            return Op.LOCAL, (), ""
        if name == "Aggregate":
            return Op.AGGREGATE, self._aggregate_keys(raw, children), ""
        if name == "Window":
            return Op.WINDOW, tuple(_attribute_names(raw.get("partitionSpec"))[0]), ""
        if name in ("Deduplicate", "DeduplicateWithinWatermark"):
            return Op.DISTINCT, tuple(_attribute_names(raw.get("keys"))[0]), ""
        if name in _CLASSIC_GROUPED_UDF:
            keys = raw.get("groupingAttributes") or raw.get("groupingAttributes", [])
            return Op.GROUPED_UDF, tuple(_attribute_names(keys)[0]), ""
        if name in _CLASSIC_COGROUP:
            keys = raw.get("leftGroup") or raw.get("leftGroupingAttributes") or []
            return Op.COGROUP, tuple(_attribute_names(keys)[0]), ""
        if name in _CLASSIC_PLAIN:
            return _CLASSIC_PLAIN[name], (), ""
        if name == "Join":
            kind = raw.get("joinType") or {}
            label = _simple(str(kind.get("object") or kind.get("product-class") or "")).lower()
            if label.startswith("existence"):
                return Op.JOIN, (), "existence"
            return Op.JOIN, (), _JOIN_TYPES.get(label, label)
        return Op.UNKNOWN, (), ""

    @staticmethod
    def _aggregate_keys(raw: dict[str, Any], children: tuple[PlanNode, ...]) -> tuple[str, ...]:
        """Grouping columns and their aliases in the output; none over grouping sets (rollup,
        cube: one of the sets may leave the split keys out).
        """
        if children and children[0].name == "Expand":
            return ()
        names, ids = _attribute_names(raw.get("groupingExpressions"))
        for expr in raw.get("aggregateExpressions") or []:
            if (
                len(expr) == 2
                and _simple(expr[0].get("class", "")) == "Alias"
                and _simple(expr[1].get("class", "")) == "AttributeReference"
                and int(expr[1]["exprId"]["id"]) in ids
            ):
                names.append(str(expr[0]["name"]))
        return tuple(names)


# ----------------------------------------------------------------------------- Connect

_CONNECT_LOCAL = frozenset(
    {
        "Project",
        "WithColumns",
        "WithColumnsRenamed",
        "WithWatermark",
        "Hint",
        "Filter",
        "Drop",
        "Sample",
        "Repartition",
        "RepartitionByExpression",
        "SubqueryAlias",
        "ToSchema",
        "ToDF",
        "NAFill",
        "NADrop",
        "NAReplace",
        "MapPartitions",
        "CollectMetrics",
        "Unpivot",
    }
)


#: Client plans that stand for a plan only the server knows.
_CONNECT_OPAQUE = frozenset({"SQL", "CachedRelation", "CachedRemoteRelation"})
_CONNECT_PLAIN = {"Sort": Op.SORT, "Limit": Op.LIMIT, "Tail": Op.LIMIT, "Offset": Op.LIMIT}


def _connect_node(plan: Any, tagged: dict[int, Input]) -> PlanNode:
    name = type(plan).__name__
    kind = tagged.get(plan._plan_id)
    if kind is not None:
        return PlanNode(Op.LEAF, name, input=kind)
    # Join and SetOperation keep their first input as ``_child`` too
    inputs = [plan._child] if getattr(plan, "_child", None) is not None else []
    for other in ("right", "other", "_other"):
        value = getattr(plan, other, None)
        if value is not None and hasattr(value, "_plan_id"):
            inputs.append(value)
    children = tuple(_connect_node(p, tagged) for p in inputs)
    subqueries = tuple(_connect_node(r, tagged) for r in getattr(plan, "_references", []) or [])
    if name in _CONNECT_OPAQUE:
        # spark.sql(...) is analysed on the server (the client holds a CachedRelation of its
        # result): its operators (a GROUP BY over a temp view of this batch) are not visible
        # here, so it is taken as not split-local
        return PlanNode(Op.UNKNOWN, name, (PlanNode(Op.LEAF, name, input=Input.BATCH),))
    if not children:
        # a leaf nobody tagged (a read, a local relation): conservative
        return PlanNode(Op.LEAF, name, input=Input.BATCH)
    op, keys, join = _connect_kind(name, plan)
    if op is Op.LOCAL:
        window = _connect_window_keys(plan)
        if window is not None:
            return PlanNode(Op.WINDOW, "Window", children, keys=window, subqueries=subqueries)
    return PlanNode(op, name, children, keys=keys, join=join, subqueries=subqueries)


def _connect_kind(name: str, plan: Any) -> tuple[Op, tuple[str, ...], str]:
    if name in _CONNECT_LOCAL or (name == "Sort" and not plan.is_global):
        return Op.LOCAL, (), ""
    if name == "Aggregate":
        if plan._group_type != "groupby":
            return Op.AGGREGATE, (), ""  # rollup, cube, pivot, grouping sets
        return Op.AGGREGATE, tuple(_connect_names(plan._grouping_cols)), ""
    if name == "Deduplicate":
        keys = () if plan.all_columns_as_keys else tuple(plan.column_names or ())
        return Op.DISTINCT, keys, ""
    if name in ("GroupMap", "ApplyInPandasWithState"):
        return Op.GROUPED_UDF, tuple(_connect_names(plan._grouping_cols)), ""
    if name == "CoGroupMap":
        return Op.COGROUP, tuple(_connect_names(plan._input_grouping_cols)), ""
    if name in _CONNECT_PLAIN:
        return _CONNECT_PLAIN[name], (), ""
    if name == "Join":
        return Op.JOIN, (), _connect_join_type(plan.how)
    if name == "SetOperation":
        return (Op.UNION if plan.set_op == "union" else Op.UNKNOWN), (), ""
    return Op.UNKNOWN, (), ""


def _connect_join_type(how: Any) -> str:
    """``JOIN_TYPE_LEFT_OUTER`` (the proto enum value) -> ``left``."""
    from pyspark.sql.connect.proto import Join as JoinProto

    label = JoinProto.JoinType.Name(how).removeprefix("JOIN_TYPE_").replace("_", "").lower()
    return str(_JOIN_TYPES.get(label, label))


def _connect_names(columns: Sequence[Any]) -> Iterator[str]:
    """Names of plain column references (and of aliases of one) among Connect columns."""
    from pyspark.sql.connect.expressions import ColumnAlias, ColumnReference

    for column in columns:
        expr = getattr(column, "_expr", column)
        if isinstance(expr, ColumnAlias):
            yield from expr._alias
            expr = expr._child
        if isinstance(expr, ColumnReference):
            yield expr.name().rsplit(".", 1)[-1]


def _connect_window_keys(plan: Any) -> tuple[str, ...] | None:
    """The partition columns of window functions in a projection (None: no window); with
    several windows, the columns every one of them partitions by.
    """
    from pyspark.sql.connect.expressions import WindowExpression

    columns = list(getattr(plan, "_columns", None) or [])
    found: list[set[str]] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, WindowExpression):
            found.append(set(_connect_names(expr._windowSpec._partitionSpec)))

    for column in columns:
        getattr(column, "_expr", column).foreach(visit)
    if not found:
        return None
    return tuple(sorted(set.intersection(*found)))
