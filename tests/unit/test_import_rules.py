"""The import rules (``[tool.importlinter]`` in pyproject.toml, ``lint-imports`` in CI) hold on the
sources and fail on a planted violation: each case copies the package and the fault harness,
adds one module that breaks one contract and runs ``lint-imports`` with the project's contracts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

ACYCLIC = "no import cycles between sibling modules or packages of the product"
#: cases that also close a cycle: the store imports core, the example DAG the operator
ALSO_A_CYCLE = frozenset({"core-imports-store", "product-imports-examples"})

#: (file to add in the copy, or to append to if it exists; its source; the contract it breaks)
PLANTED = {
    "core-imports-sqlalchemy": (
        "airflow_finalckpt/core/planted.py",
        "import sqlalchemy\n",
        "core is the protocol",
    ),
    "core-imports-airflow": (
        "airflow_finalckpt/core/planted.py",
        "from airflow.sdk import DAG\n",
        "core is the protocol",
    ),
    "core-imports-store": (
        "airflow_finalckpt/core/planted.py",
        "from airflow_finalckpt.store import engine\n",
        "core is the protocol",
    ),
    "product-imports-harness": (
        "airflow_finalckpt/runtime/planted.py",
        "from faults.points import POINTS\n",
        "the product imports neither the fault harness",
    ),
    "product-imports-tests": (
        "airflow_finalckpt/sinks/planted.py",
        "import tests.coordinator_workload\n",
        "the product imports neither the fault harness",
    ),
    "product-imports-examples": (
        "airflow_finalckpt/operators/planted.py",
        "from airflow_finalckpt.examples.nycflights13 import data\n",
        "only the examples themselves and the fault harness import the examples",
    ),
    "harness-cycle": (
        "faults/planted.py",
        "import faults.campaign\n",
        "the fault harness has no import cycles",
    ),
    # the plugin imports the operator side (plugins.links -> operators): the way back closes one
    "product-cycle": (
        "airflow_finalckpt/operators/planted.py",
        "from airflow_finalckpt.plugins.finalckpt_plugin import FinalCheckpointPlugin\n",
        ACYCLIC,
    ),
    # one level down: storage.checkpoint_storage imports storage.savepoint_files, so an import
    # of checkpoint_storage there (even inside a function) closes one
    "nested-product-cycle": (
        "airflow_finalckpt/storage/savepoint_files.py",
        "\n\ndef planted() -> None:\n    import airflow_finalckpt.storage.checkpoint_storage\n",
        ACYCLIC,
    ),
    # type hints count too: the two cycles of issue 45 were type-only imports back
    "type-hint-only-cycle": (
        "airflow_finalckpt/sinks/staged_replace.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from airflow_finalckpt.sinks.staged import StagedTableSink\n",
        ACYCLIC,
    ),
}


def _importlinter_config() -> str:
    """The ``[tool.importlinter]`` tables of the project's pyproject.toml, as they are."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    kept: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("["):
            inside = line.strip("[] ").startswith("tool.importlinter")
        if inside:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _lint(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package, the harness and the import rules (copied again per case)."""
    root = tmp_path_factory.mktemp("import-rules")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("airflow_finalckpt", "faults"):
        shutil.copytree(ROOT / package, root / package, ignore=ignore)
    (root / "pyproject.toml").write_text(_importlinter_config())
    # a planted `import faults.campaign` must close a cycle: the campaign imports the planted
    # module (empty until a case plants something in it)
    (root / "faults" / "planted.py").write_text("")
    campaign = root / "faults" / "campaign.py"
    campaign.write_text(campaign.read_text() + "\nimport faults.planted  # noqa\n")
    return root


def test_sources_keep_the_contracts(template: Path) -> None:
    result = _lint(template)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_planted_violation_fails(case: str, template: Path, tmp_path: Path) -> None:
    relpath, source, contract = PLANTED[case]
    copy = tmp_path / "src"
    shutil.copytree(template, copy)
    target = copy / relpath
    target.write_text((target.read_text() if target.exists() else "") + source)
    result = _lint(copy)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert len(broken) == 1 + (case in ALSO_A_CYCLE), result.stdout
    assert broken[0].startswith(contract), result.stdout
    if case in ALSO_A_CYCLE:
        assert broken[1].startswith(ACYCLIC), result.stdout
