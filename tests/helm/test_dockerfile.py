"""The Dockerfile cannot be built here (no Docker engine): check what can be read from it."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from chart_helpers import CHART_DIR, REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    # Docker drops comment lines first, also inside a continued instruction, then joins lines.
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.strip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        keyword, _, rest = stripped.partition(" ")
        result.append((keyword.upper(), " ".join(rest.split())))
    return result


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _airflow_pin() -> str:
    """The Airflow version CI's newest lane tests (constraints/newest.txt)."""
    for line in (REPO / "constraints" / "newest.txt").read_text().splitlines():
        match = re.fullmatch(r"apache-airflow==([0-9.]+)", line.strip())
        if match:
            return match.group(1)
    raise AssertionError("constraints/newest.txt pins no apache-airflow version")


def test_from_pins_the_airflow_version_and_python_of_pyproject() -> None:
    froms = [args for keyword, args in _instructions() if keyword == "FROM"]
    assert len(froms) == 1, froms
    match = re.fullmatch(r"apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)", froms[0])
    assert match, f"FROM must be apache/airflow:<version>-python<x.y>, got {froms[0]!r}"
    assert match.group(1) == _airflow_pin()
    requires = _pyproject()["project"]["requires-python"]  # ">=3.11"
    assert f">={match.group(2)}" in requires
    # and it is a Python CI tests (the classifiers name those)
    assert (
        f"Programming Language :: Python :: {match.group(2)}"
        in _pyproject()["project"]["classifiers"]
    )


def test_pins_pyspark_and_pyspark_client_to_the_tested_version() -> None:
    """Unpinned, pip would pair the newest pyspark with an older pyspark-client (one package)."""
    newest = (REPO / "constraints" / "newest.txt").read_text()
    tested = re.search(r"^pyspark==([0-9.]+)$", newest, re.M)
    assert tested
    assert f"ARG PYSPARK_VERSION={tested.group(1)}" in DOCKERFILE.read_text()
    pip = " ".join(a for k, a in _instructions() if k == "RUN" and "pip install" in a)
    assert '"pyspark==${PYSPARK_VERSION}" "pyspark-client==${PYSPARK_VERSION}"' in pip


def test_no_floating_tags() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r":latest\b", text)
    assert "apache/airflow:3" in text


def test_installs_java_as_root_then_switches_back_to_airflow() -> None:
    steps = _instructions()
    users = [(i, args) for i, (keyword, args) in enumerate(steps) if keyword == "USER"]
    assert [u for _, u in users] == ["root", "airflow"], users
    root_at, airflow_at = users[0][0], users[1][0]
    apt = [i for i, (k, a) in enumerate(steps) if k == "RUN" and "apt-get install" in a]
    assert apt and all(root_at < i < airflow_at for i in apt)
    assert "openjdk-17-jre-headless" in steps[apt[0]][1]
    assert "rm -rf /var/lib/apt/lists/*" in steps[apt[0]][1]
    pip = [i for i, (k, a) in enumerate(steps) if k == "RUN" and "pip install" in a]
    assert pip and all(i > airflow_at for i in pip), "pip must run as the airflow user"
    assert any(k == "ENV" and a.startswith("JAVA_HOME=") for k, a in steps)


def test_installs_the_package_with_its_extras_without_moving_airflow() -> None:
    pip = " ".join(a for k, a in _instructions() if k == "RUN" and "pip install" in a)
    extras = re.search(r"/opt/finalckpt/src\[([a-z,]+)\]", pip)
    assert extras, pip
    assert {"spark", "postgres", "airflow"} <= set(extras.group(1).split(","))
    assert set(extras.group(1).split(",")) <= set(_pyproject()["project"]["optional-dependencies"])
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in pip
    assert "--no-cache-dir" in pip
    copies = [a for k, a in _instructions() if k == "COPY"]
    copied = {src for a in copies for src in a.split()[1:-1]}
    assert {"pyproject.toml", "airflow_finalckpt"} <= copied
    for src in copied:
        assert (REPO / src).exists(), f"COPY source {src} does not exist"


def test_dockerignore_keeps_the_copied_sources() -> None:
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git"} <= ignored
    assert not {"airflow_finalckpt", "pyproject.toml", "README.md"} & ignored


def test_a_regular_install_ships_every_file_of_the_package() -> None:
    """The image installs the package non-editable: every sub-package needs an __init__.py
    (packages.find is not namespace-aware) and every data file a package-data pattern."""
    package = REPO / "airflow_finalckpt"
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["airflow_finalckpt"]
    missing_init, unshipped = [], []
    for path in _tracked_files(package):
        if "__pycache__" in path.parts:
            continue
        if path.suffix == ".py":
            if not (path.parent / "__init__.py").exists():
                missing_init.append(str(path.parent.relative_to(REPO)))
        elif path.suffix != ".pyc":
            relative = path.relative_to(package)
            if not any(relative.match(p) for p in patterns):
                unshipped.append(str(relative))
    assert sorted(set(missing_init)) == []
    assert sorted(unshipped) == []


def _tracked_files(directory: Path) -> list[Path]:
    """Files git tracks under ``directory`` (what a build from a checkout copies)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", str(directory)],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return [p for p in directory.rglob("*") if p.is_file()]
    return [REPO / name for name in listed.split("\0") if name]


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == _pyproject()["project"]["version"]
