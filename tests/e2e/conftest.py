"""Fixtures for end-to-end tests against a real Airflow 3 cluster (see docs/testing.md).

``airflow_cluster`` is a session-scoped factory::

    def test_x(airflow_cluster):
        cluster = airflow_cluster([DAGS], extra_env={"AIRFLOW__FINALCKPT__STORE_URL": url},
                                  expect_dags=["my_dag"])

Calls with the same arguments share one running cluster; a call with different arguments stops
the previous cluster first (one cluster at a time: they are heavy on 2 cores). Every cluster is
stopped at the end of the session; when a test using it failed, its logs are printed and its
AIRFLOW_HOME is kept. Without PostgreSQL the tests skip, unless FINALCKPT_REQUIRE_POSTGRES=1.
Every test under tests/e2e is marked ``slow`` and gets a 1500 s hang guard (pytest-timeout).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from .airflow_cluster import AirflowCluster, postgres_reachable, reap_stale
from .ui_cluster import ui_cluster

E2E_DIR = Path(__file__).parent
SMOKE_DAGS = E2E_DIR / "dags"

_LIVE: list[AirflowCluster] = []
E2E_TIMEOUT_S = 1500


def _stop_live() -> None:
    while _LIVE:
        _LIVE.pop().stop()


atexit.register(_stop_live)  # last resort (e.g. an exception outside fixtures)


def _cluster_group(item: pytest.Item) -> str:
    """Modules on the stop tests' cluster (``ui_cluster``) form one group; any other module
    is its own group, unless it names one in ``E2E_CLUSTER_GROUP``."""
    module = getattr(item, "module", None)
    if module is not None and getattr(module, "ui_cluster", None) is ui_cluster:
        return "ui_cluster"
    return str(getattr(module, "E2E_CLUSTER_GROUP", "") or item.path)


def _group_by_cluster(items: list[pytest.Item]) -> None:
    """Run the modules of one cluster one after the other (first-seen order, stable inside a
    group): the factory keeps one cluster at a time, so interleaving them would start the same
    cluster twice (~1 min each under load)."""
    slots = [i for i, item in enumerate(items) if E2E_DIR in Path(str(item.path)).parents]
    e2e = [items[i] for i in slots]
    first: dict[str, int] = {}
    for n, item in enumerate(e2e):
        first.setdefault(_cluster_group(item), n)
    ordered = sorted(e2e, key=lambda item: first[_cluster_group(item)])
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _group_by_cluster(items)
    for item in items:
        if E2E_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                # A hang guard, not a timing assertion: a stop/resume test runs a whole pipeline
                # several times and takes 4-7 min next to the rest of the suite on 2 cores.
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and E2E_DIR in Path(str(item.path)).parents:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _e2e_failure_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """When an e2e test fails: print the cluster's log tails and keep its home at the end."""
    yield
    if request.node.stash.get(_FAILED, False):
        for cluster in _LIVE:
            cluster.failed = True
            print(cluster.log_tails(), file=sys.stderr)


def _key(*parts: Any) -> str:
    return repr(parts)


@pytest.fixture(scope="session")
def airflow_cluster() -> Iterator[Callable[..., AirflowCluster]]:
    clusters: dict[str, AirflowCluster] = {}
    reaped = False

    def factory(
        dag_paths: Sequence[str | os.PathLike[str]] = (SMOKE_DAGS,),
        *,
        extra_env: Mapping[str, str] | None = None,
        expect_dags: Iterable[str] = (),
        **kwargs: Any,
    ) -> AirflowCluster:
        nonlocal reaped
        expect = sorted(expect_dags)
        database = kwargs.get("database", "postgres")
        if database == "postgres":
            ok, why = postgres_reachable()
            if not ok:
                if os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
                    pytest.fail(f"{why} but FINALCKPT_REQUIRE_POSTGRES=1", pytrace=False)
                pytest.skip(why)
        if not reaped:
            reaped = True
            for what in reap_stale():
                print(f"[airflow-e2e] reaped stale {what}", file=sys.stderr)
        key = _key(
            [str(Path(p).resolve()) for p in dag_paths],
            sorted((extra_env or {}).items()),
            expect,
            sorted(kwargs.items()),
        )
        cluster = clusters.get(key)
        if cluster is not None and cluster in _LIVE:
            return cluster
        for other in list(_LIVE):  # one cluster at a time
            _LIVE.remove(other)
            other.stop()
        cluster = AirflowCluster(dag_paths, extra_env=extra_env, expect_dags=expect, **kwargs)
        _LIVE.append(cluster)
        cluster.start()
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in cluster.startup_phases.items())
        if cluster.spark_cds_seconds > 1:
            phases += (
                f"; before it, the Spark CDS archive built in {cluster.spark_cds_seconds:.1f}s"
            )
        print(
            f"\n[airflow-e2e] cluster {cluster.cluster_id} up in {cluster.startup_seconds:.1f}s "
            f"(cumulative: {phases}) at {cluster.base_url} (home {cluster.home})",
            file=sys.stderr,
        )
        clusters[key] = cluster
        return cluster

    try:
        yield factory
    finally:
        _stop_live()
