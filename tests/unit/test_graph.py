"""StageGraph: validation, order, fingerprint and (de)serialization."""

from __future__ import annotations

import json

import pytest

from airflow_finalckpt.core.errors import InvalidGraphError
from airflow_finalckpt.core.graph import Stage, StageGraph


def diamond() -> StageGraph:
    """ingest -> (clean, enrich) -> publish."""
    return StageGraph.from_edges(
        ["ingest", "clean", "enrich", "publish"],
        [("ingest", "clean"), ("ingest", "enrich"), ("clean", "publish"), ("enrich", "publish")],
    )


# -- build and validation ---------------------------------------------------------------------


def test_build_records_upstream_and_downstream() -> None:
    graph = diamond()
    assert set(graph.stage_ids) == {"ingest", "clean", "enrich", "publish"}
    assert set(graph.upstream("publish")) == {"clean", "enrich"}
    assert graph.downstream("ingest") == ("clean", "enrich")
    assert graph.downstream("publish") == ()
    assert graph.sources() == ["ingest"]
    assert graph.ancestors("publish") == {"ingest", "clean", "enrich"}
    assert "clean" in graph and "nope" not in graph
    assert len(graph) == 4


def test_cycle_error_names_the_cycle() -> None:
    with pytest.raises(InvalidGraphError, match="cycle") as info:
        StageGraph.from_edges(
            ["src", "a", "b", "c"], [("src", "a"), ("a", "b"), ("b", "c"), ("c", "a")]
        )
    message = str(info.value)
    for sid in ("a", "b", "c"):
        assert repr(sid)[1:-1] in message
    # The path printed is the cycle itself, closed on its first stage, without the source.
    cycle = message.split(": ", 1)[1].split(" -> ")
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"a", "b", "c"}
    assert "src" not in cycle


def test_self_loop_is_a_cycle() -> None:
    with pytest.raises(InvalidGraphError, match=r"cycle between stages: a -> a"):
        StageGraph.build([Stage("a", ("a",))])


def test_duplicate_stage_id_is_refused() -> None:
    with pytest.raises(InvalidGraphError, match="duplicate stage id 'x'"):
        StageGraph.build([Stage("x"), Stage("y"), Stage("x")])


def test_duplicate_upstream_is_refused() -> None:
    with pytest.raises(InvalidGraphError, match="'b' lists an upstream stage twice"):
        StageGraph.build([Stage("a"), Stage("b", ("a", "a"))])


def test_unknown_upstream_is_refused_and_named() -> None:
    with pytest.raises(InvalidGraphError, match="'b' depends on unknown stage 'ghost'"):
        StageGraph.build([Stage("a"), Stage("b", ("a", "ghost"))])


def test_edge_to_unknown_stage_is_refused() -> None:
    with pytest.raises(InvalidGraphError, match="unknown stage 'ghost'"):
        StageGraph.from_edges(["a"], [("a", "ghost")])


@pytest.mark.parametrize(
    "bad_id",
    [
        "",
        "..",
        ".hidden",
        "-dash",
        "a/b",
        "../etc",
        "a\\b",
        "with space",
        "ünïcode",
        "stage\u200b",
        "x" * 251,
        "trailing\n",
        "tab\tid",
    ],
)
def test_bad_stage_ids_are_refused_with_the_id_named(bad_id: str) -> None:
    with pytest.raises(InvalidGraphError, match="invalid stage id") as info:
        StageGraph.build([Stage(bad_id)])
    assert repr(bad_id) in str(info.value)


@pytest.mark.parametrize("good_id", ["a", "_x", "ingest.v2", "a-b_c.d", "0", "x" * 250])
def test_good_stage_ids_are_accepted(good_id: str) -> None:
    assert StageGraph.build([Stage(good_id)]).stage_ids == [good_id]


def test_non_string_stage_id_is_refused() -> None:
    with pytest.raises(InvalidGraphError, match="invalid stage id 7"):
        StageGraph.build([Stage(7)])  # type: ignore[arg-type]


def test_two_stages_on_one_task_id_are_refused() -> None:
    with pytest.raises(InvalidGraphError, match="'a' and 'b' both run as task 'shared'"):
        StageGraph.build([Stage("a", task_id="shared"), Stage("b", task_id="shared")])


def test_explicit_task_id_may_not_collide_with_a_default_one() -> None:
    with pytest.raises(InvalidGraphError, match="both run as task 'a'"):
        StageGraph.build([Stage("a"), Stage("b", task_id="a")])


@pytest.mark.parametrize("bad_task_id", ["", "a/b", "ünï", "t\n"])
def test_bad_task_ids_are_refused(bad_task_id: str) -> None:
    with pytest.raises(InvalidGraphError, match="invalid task id"):
        StageGraph.build([Stage("a", task_id=bad_task_id)])


def test_airflow_task_id_defaults_to_stage_id() -> None:
    assert Stage("a").airflow_task_id == "a"
    assert Stage("a", task_id="run_a").airflow_task_id == "run_a"


# -- order ------------------------------------------------------------------------------------


def assert_topological(graph: StageGraph, order: list[str]) -> None:
    assert sorted(order) == sorted(graph.stage_ids)
    position = {sid: i for i, sid in enumerate(order)}
    for sid in graph.stage_ids:
        for up in graph.upstream(sid):
            assert position[up] < position[sid], f"{up} must come before {sid}"


def test_topological_order_puts_every_stage_after_its_upstreams() -> None:
    graph = StageGraph.from_edges(
        ["z_src", "a_sink", "m_mid", "b_src"],
        [("z_src", "m_mid"), ("b_src", "m_mid"), ("m_mid", "a_sink")],
    )
    order = graph.topological_order()
    assert_topological(graph, order)
    # Ties are broken by id, so the order is reproducible.
    assert order == ["b_src", "z_src", "m_mid", "a_sink"]


def test_topological_order_of_the_diamond() -> None:
    assert diamond().topological_order() == ["ingest", "clean", "enrich", "publish"]


# -- fingerprint ------------------------------------------------------------------------------


def test_fingerprint_is_stable_under_reordering() -> None:
    one = StageGraph.build([Stage("a"), Stage("b", ("a",)), Stage("c", ("a", "b"))])
    two = StageGraph.build([Stage("c", ("b", "a")), Stage("b", ("a",)), Stage("a")])
    assert one.fingerprint == two.fingerprint
    assert len(one.fingerprint) == 64


def test_fingerprint_changes_with_an_edge() -> None:
    without = StageGraph.from_edges(["a", "b", "c"], [("a", "b")])
    with_edge = StageGraph.from_edges(["a", "b", "c"], [("a", "b"), ("b", "c")])
    assert without.fingerprint != with_edge.fingerprint


def test_fingerprint_changes_with_a_stage_id() -> None:
    assert StageGraph.build([Stage("a")]).fingerprint != StageGraph.build([Stage("b")]).fingerprint


def test_task_id_is_not_part_of_the_fingerprint() -> None:
    plain = StageGraph.build([Stage("a"), Stage("b", ("a",))])
    renamed = StageGraph.build([Stage("a", task_id="load"), Stage("b", ("a",), task_id="x.b")])
    assert plain.fingerprint == renamed.fingerprint


# -- (de)serialization ------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_keeps_everything() -> None:
    graph = StageGraph.build(
        [Stage("ingest", task_id="load_files"), Stage("enrich", ("ingest",)), Stage("publish")]
    )
    data = json.loads(json.dumps(graph.to_dict()))  # must survive JSON
    again = StageGraph.from_dict(data)
    assert again == graph
    assert again.to_dict() == graph.to_dict()
    assert again.fingerprint == graph.fingerprint
    assert again.stages["ingest"].airflow_task_id == "load_files"
    assert again.downstream("ingest") == ("enrich",)


def test_round_trip_normalizes_upstream_order() -> None:
    graph = StageGraph.build([Stage("a"), Stage("b"), Stage("c", ("b", "a"))])
    again = StageGraph.from_dict(graph.to_dict())
    assert set(again.upstream("c")) == {"a", "b"}
    assert again.fingerprint == graph.fingerprint


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        [],
        "stages",
        {},
        {"stages": None},
        {"stages": [None]},
        {"stages": ["ingest"]},
        {"stages": [{"upstream": []}]},
        {"stages": [{"stage_id": None}]},
        {"stages": [{"stage_id": 3}]},
        {"stages": [{"stage_id": "a"}, {"stage_id": "bc", "upstream": "a"}]},
        {"stages": [{"stage_id": "a", "upstream": [1]}]},
        {"stages": [{"stage_id": "a", "task_id": 5}]},
        {"stages": [{"stage_id": "a/b"}]},
        {"stages": [{"stage_id": "a", "upstream": ["missing"]}]},
        {"stages": [{"stage_id": "a", "upstream": ["b"]}, {"stage_id": "b", "upstream": ["a"]}]},
    ],
)
def test_from_dict_of_garbage_raises_invalid_graph_error(garbage: object) -> None:
    with pytest.raises(InvalidGraphError):
        StageGraph.from_dict(garbage)  # type: ignore[arg-type]


def test_from_dict_error_names_the_bad_field() -> None:
    with pytest.raises(InvalidGraphError, match="upstream of 'bc' must be a list"):
        StageGraph.from_dict({"stages": [{"stage_id": "a"}, {"stage_id": "bc", "upstream": "a"}]})
