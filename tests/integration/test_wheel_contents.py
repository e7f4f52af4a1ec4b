"""The wheel ships the product only: a wheel built from a copy of the sources holds
``airflow_finalckpt`` and none of the fault harness (``faults/``, once
``airflow_finalckpt/faults``), the benchmarks or the tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Top-level folders a wheel must never hold (the old in-package harness path too).
FORBIDDEN = ("faults/", "benchmarks/", "tests/", "airflow_finalckpt/faults/")
BUNDLE = "airflow_finalckpt/plugins/api/static/ui/finalckpt-ui.js"


def _copy_sources(dest: Path) -> None:
    """What the build reads, plus the folders it must leave out (a stub ``tests`` package)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("airflow_finalckpt", "faults", "benchmarks"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    (dest / "tests").mkdir()
    (dest / "tests" / "__init__.py").write_text("")
    bundle = dest / BUNDLE
    if not bundle.is_file():  # a checkout nobody ran scripts/build_ui.sh in
        bundle.parent.mkdir(parents=True, exist_ok=True)
        bundle.write_text("/* stand-in for the built bundle */\n")
    (bundle.parent / ".build-stamp").write_text("0\n")


def _record(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        [record] = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        lines = archive.read(record).decode().splitlines()
    return [line.split(",", 1)[0] for line in lines if line]


def test_wheel_leaves_out_the_fault_harness(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    _copy_sources(src)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*build, "--no-index", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = out.glob("airflow_finalckpt-*.whl")
    files = _record(wheel)
    assert "airflow_finalckpt/__init__.py" in files
    assert "airflow_finalckpt/runtime/runner.py" in files
    leaked = [f for f in files if f.startswith(FORBIDDEN)]
    assert leaked == [], f"the wheel ships test or harness files: {leaked[:10]}"
    # the React bundle ships (the copy holds one: the checkout's build, or a stand-in), the
    # build's stamp does not
    assert BUNDLE in files
    assert not [f for f in files if f.endswith(".build-stamp")]
