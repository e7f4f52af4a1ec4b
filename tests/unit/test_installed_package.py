"""The lanes' guard (tests/installed_package.py): a run whose ``airflow_finalckpt`` is not the
installed one is named, here with the checkout's editable package and a stand-in site-packages."""

from __future__ import annotations

from pathlib import Path

import airflow_finalckpt
from tests.installed_package import installed_package_error


def test_the_package_outside_the_lanes_site_packages_is_an_error(tmp_path: Path) -> None:
    error = installed_package_error(str(tmp_path))
    assert error is not None
    assert str(Path(airflow_finalckpt.__file__).resolve()) in error
    assert str(tmp_path) in error


def test_the_package_under_the_given_directory_passes() -> None:
    where = Path(airflow_finalckpt.__file__).resolve().parents[1]
    assert installed_package_error(str(where)) is None
