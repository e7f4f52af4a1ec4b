"""StageGraph.topological_order with a heap: the same order as the re-sorted ready list it
replaced (the smallest ready id first), on random graphs."""

from __future__ import annotations

import random

from airflow_finalckpt.core.graph import StageGraph


def reference_order(graph: StageGraph) -> list[str]:
    """The former implementation: re-sort the ready list after every stage."""
    indegree = {sid: len(graph.upstream(sid)) for sid in graph.stage_ids}
    ready = sorted(sid for sid, d in indegree.items() if d == 0)
    order: list[str] = []
    while ready:
        sid = ready.pop(0)
        order.append(sid)
        for down in graph.downstream(sid):
            indegree[down] -= 1
            if indegree[down] == 0:
                ready.append(down)
        ready.sort()
    return order


def test_heap_order_equals_the_resorted_list_order() -> None:
    rng = random.Random(16)
    for _ in range(200):
        n = rng.randint(1, 40)
        ids = [f"s{rng.randrange(10_000):05d}-{k}" for k in range(n)]
        rank = {sid: k for k, sid in enumerate(ids)}  # edges go from a lower to a higher rank
        edges = [(a, b) for a in ids for b in ids if rank[a] < rank[b] and rng.random() < 0.1]
        graph = StageGraph.from_edges(ids, edges)
        assert graph.topological_order() == reference_order(graph)
