"""Bad input at the stage level: a pipeline attempt (real runtime, coordinator, storage; one
child process per attempt, as Airflow runs task attempts) publishes to an Iceberg or Delta table
whose catalog is unreachable, which has another schema, or whose directory it may not write.

Each time the attempt fails with ONE line naming the sink and the cause, nothing reaches the
table (no snapshot / version of ours), the publishing stage is left open (not CLOSED, no
transaction COMMITTED) and, once the cause is fixed, the next attempt (the Airflow retry)
completes: every row exactly once, one table commit per committed transaction, no leaked file.
test_sinks_lakehouse.py has the same cases at the sink level, with Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lakehouse_attempt_child import make_table_sink

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle, TransactionState
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from faults.fake import KEY_COLUMNS, FakeData, reference_windows
from faults.runs import Environment, RunPlan
from faults.verify import verify_run

CHILD = Path(__file__).with_name("lakehouse_attempt_child.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _unprivileged() -> list[str]:
    """Root ignores file modes; the attempt runs without the capabilities that let it."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def _config(tmp_path: Path, kind: str, **extra: Any) -> dict[str, Any]:
    env = Environment(tmp_path / "env")
    env.prepare(spark=False)
    setup = env.setup(RunPlan.single(0))
    root = tmp_path / "tables"
    root.mkdir()
    return {
        "kind": kind,
        "root": str(root),
        "store_url": setup.store_url,
        "storage_root": setup.storage_root,
        "pipeline_key": setup.pipeline_key,
        **extra,
    }


def _attempt(config: dict[str, Any], prefix: list[str] | None = None) -> str:
    path = Path(config["root"]).parent / "attempt.json"
    path.write_text(json.dumps(config))
    child = subprocess.run(
        [*(prefix or []), sys.executable, str(CHILD), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        # the child imports the fault harness (faults/ at the repository root) and its helpers
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(CHILD.parent)])},
    )
    lines = [line for line in child.stdout.splitlines() if line.strip()]
    assert child.returncode == 0 and lines, child.stdout + child.stderr[-3000:]
    return lines[-1]


def _our_commits(config: dict[str, Any]) -> list[str | None]:
    return [t for t in make_table_sink(config).table_commits() if t is not None]


def _check_failed(config: dict[str, Any], line: str, *fragments: str, table: bool = True) -> None:
    """The attempt failed with one line; nothing committed (``table``: the table is readable
    now, so check it holds nothing of ours)."""
    assert line.startswith("failed SinkError: sink 'windows': "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    if table:
        assert _our_commits(config) == []  # nothing reached the table
    engine = make_engine(config["store_url"])
    try:
        coordinator = Coordinator(engine, config["pipeline_key"])
        stages = coordinator.stages()
        assert stages["agg"].lifecycle is StageLifecycle.CLOSED
        assert stages["publish"].lifecycle is not StageLifecycle.CLOSED  # left to the retry
        committed = [
            txn
            for txn, state in coordinator.transactions()
            if state == TransactionState.COMMITTED.value
        ]
        assert committed == []
    finally:
        engine.dispose()


def _check_retry(config: dict[str, Any]) -> None:
    assert _attempt(config) == "completed"
    engine = make_engine(config["store_url"])
    sink = make_table_sink(config)
    try:
        verdict = verify_run(
            Coordinator(engine, config["pipeline_key"]),
            CheckpointStorage(config["storage_root"]),
            [sink],
            __import__("pandas").DataFrame(reference_windows(FakeData(splits=4))),
            KEY_COLUMNS,
        )
    finally:
        engine.dispose()
    assert verdict.problems() == [], verdict.problems()
    counts = verdict.table_commits["windows"]
    assert counts["meant"] == counts["table"] > 0, counts


def test_an_unreachable_iceberg_catalog_fails_the_attempt_and_the_retry_completes(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "catalog-volume"  # not mounted yet: SQLite cannot open its file
    config = _config(tmp_path, "iceberg", catalog=f"sqlite:///{volume}/catalog.db")
    line = _attempt(config)
    _check_failed(config, line, "Iceberg sql catalog", "retry when fixed", table=False)
    volume.mkdir()  # the catalog is back
    assert _our_commits(config) == []
    _check_retry(config)


def _iceberg_catalog(config: dict[str, Any]) -> Any:
    from pyiceberg.catalog import load_catalog

    warehouse = f"{config['root']}/warehouse"
    Path(warehouse).mkdir(exist_ok=True)
    return load_catalog(
        "finalckpt", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=warehouse
    )


OTHER_SCHEMA = pa.schema([("key", pa.string()), ("window_start", pa.string())])


def _iceberg_other_schema(config: dict[str, Any]) -> Callable[[], None]:
    catalog = _iceberg_catalog(config)
    catalog.create_namespace_if_not_exists("faults")
    catalog.create_table("faults.windows", schema=OTHER_SCHEMA)
    return lambda: catalog.drop_table("faults.windows")


def _delta_other_schema(config: dict[str, Any]) -> Callable[[], None]:
    from deltalake import write_deltalake

    path = f"{config['root']}/delta/windows"
    write_deltalake(path, pa.table({"key": ["x"], "window_start": ["y"]}))
    return lambda: shutil.rmtree(path)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_table_with_another_schema_fails_the_attempt_and_the_retry_completes(
    tmp_path: Path, kind: str
) -> None:
    config = _config(tmp_path, kind)
    fix = (_iceberg_other_schema if kind == "iceberg" else _delta_other_schema)(config)
    before = make_table_sink(config).table_commits()
    _check_failed(config, _attempt(config), "has another schema", "window_start")
    assert make_table_sink(config).table_commits() == before  # not even a foreign commit
    fix()  # the operator drops the table that was in the way
    _check_retry(config)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_directory_without_permission_fails_the_attempt_and_the_retry_completes(
    tmp_path: Path, kind: str
) -> None:
    config = _config(tmp_path, kind)
    if kind == "iceberg":  # the table's data directory (pyiceberg's SQL catalog layout)
        locked = Path(config["root"]) / "warehouse" / "faults" / "windows" / "data"
    else:
        locked = Path(config["root"]) / "delta" / "windows"
    locked.mkdir(parents=True)
    locked.chmod(0)
    try:
        line = _attempt(config, _unprivileged())
    finally:
        locked.chmod(0o755)
    _check_failed(config, line)
    assert "ermission" in line or "denied" in line.lower(), line
    _check_retry(config)
