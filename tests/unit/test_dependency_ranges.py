"""pyproject.toml's ranges and the two constraint files of CI's lanes agree (docs/compatibility.md).

The newest lane installs constraints/newest.txt, the floors lane constraints/floors.txt, the
driver-side lane constraints/spark35.txt: each pin must lie in its range, the floors files must
pin exactly each declared floor (pyspark's: the driver-side lane's, with no Airflow), and
pyspark and pyspark-client (one `pyspark` package, two distributions) must be one version
wherever both are installed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
# the product's own third-party requirements whose floor CI's floors lane installs
FLOORED = (
    "apache-airflow",
    "apache-airflow-providers-apache-spark",
    "pyspark-client",
    "pyiceberg",
    "deltalake",
    "apache-airflow-providers-openlineage",
)


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines.extend(extra)
    return {canonicalize_name(r.name): r for r in map(Requirement, lines)}


def _pins(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "constraints" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{name}: {line!r} is not an exact pin"
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def _floor(requirement: Requirement) -> Version:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert len(floors) == 1, f"{requirement} declares no single '>=' floor"
    return floors[0]


@pytest.mark.parametrize("constraints", ["newest.txt", "floors.txt", "spark35.txt"])
def test_every_pin_lies_in_its_range(constraints: str) -> None:
    requirements = _requirements()
    for name, version in _pins(constraints).items():
        if name in requirements:
            assert requirements[name].specifier.contains(version, prereleases=True), (
                f"constraints/{constraints} pins {name}=={version} outside {requirements[name]}"
            )


def test_floors_file_pins_each_declared_floor() -> None:
    requirements, floors = _requirements(), _pins("floors.txt")
    for name in FLOORED:
        assert floors.get(name) == _floor(requirements[name]), (
            f"constraints/floors.txt pins {name}=={floors.get(name)}, pyproject.toml's floor is "
            f"{_floor(requirements[name])}"
        )


def test_the_driver_side_lane_pins_pyspark_at_its_floor_without_airflow() -> None:
    pins = _pins("spark35.txt")
    assert pins["pyspark"] == _floor(_requirements()["pyspark"])
    assert "pyspark-client" not in pins  # the lane installs no Airflow, no Spark provider


@pytest.mark.parametrize("constraints", ["newest.txt", "floors.txt"])
def test_pyspark_and_pyspark_client_are_one_version(constraints: str) -> None:
    pins = _pins(constraints)
    assert pins["pyspark"] == pins["pyspark-client"], (constraints, pins["pyspark"])


def test_newest_pins_everything_the_lane_installs() -> None:
    newest = _pins("newest.txt")
    # every product requirement (not only the floored ones) is resolved in the newest lane
    assert set(_requirements()) - {"airflow-finalckpt"} <= set(newest), sorted(
        set(_requirements()) - set(newest)
    )


def test_test_only_packages_stay_out_of_the_user_facing_extras() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra, lines in project["optional-dependencies"].items():
        names = {canonicalize_name(Requirement(line).name) for line in lines}
        if extra != "dev":
            assert not names & {"duckdb", "pytest", "hypothesis"}, (extra, names)


def test_no_exact_pins_in_what_users_install() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, extra_lines in project["optional-dependencies"].items():
        if extra not in ("dev", "examples"):
            lines.extend(extra_lines)
    pinned = [line for line in lines if "==" in line]
    assert not pinned, pinned
