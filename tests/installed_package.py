"""Which ``airflow_finalckpt`` a test run imports: CI's compatibility lanes test the installed
wheel, not the checkout (scripts/lane.sh sets ``FINALCKPT_LANE_SITE_PACKAGES``, and
tests/conftest.py stops the run when this finds the package anywhere else)."""

from __future__ import annotations

from pathlib import Path


def installed_package_error(site_packages: str) -> str | None:
    """Why the imported ``airflow_finalckpt`` is not the one in ``site_packages``, or None when
    it is."""
    import airflow_finalckpt

    where = Path(airflow_finalckpt.__file__).resolve()
    if where.is_relative_to(Path(site_packages).resolve()):
        return None
    return (
        f"airflow_finalckpt imports from {where}, not from the lane's {site_packages}: the "
        "checkout stands in for the installed wheel (scripts/lane.sh)"
    )
