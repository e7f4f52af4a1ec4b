"""``[finalckpt] store_password``: the password of a PostgreSQL store URL that has none (the Helm
chart's ConfigMap URL + its Secret), joined wherever the store URL is resolved, and masked."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from airflow_finalckpt import config
from airflow_finalckpt.store_password import STORE_PASSWORD_ENV, with_store_password

URL = "postgresql+psycopg://finalckpt@pg.example:5432/coord?sslmode=require"
PASSWORD = "p@ss word/1+x"


@pytest.fixture(autouse=True)
def _isolated(isolated_settings_env: Path) -> Path:
    return isolated_settings_env


def test_the_password_joins_a_url_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", URL)
    monkeypatch.setenv(STORE_PASSWORD_ENV, PASSWORD)
    settings = config.load_settings()
    url = make_url(settings.store_url)
    assert (url.username, url.password, url.host) == ("finalckpt", PASSWORD, "pg.example")
    assert dict(url.query) == {"sslmode": "require"}
    assert PASSWORD not in settings.describe() and PASSWORD not in repr(settings)
    assert settings.masked_store_url() == (
        "postgresql+psycopg://finalckpt:***@pg.example:5432/coord?sslmode=require"
    )


def test_a_url_password_sqlite_and_no_setting_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert with_store_password(URL) == URL  # nothing configured
    monkeypatch.setenv(STORE_PASSWORD_ENV, PASSWORD)
    own = "postgresql+psycopg://finalckpt:own@pg.example:5432/coord"
    assert with_store_password(own) == own
    assert with_store_password("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_airflow_config_is_read_when_the_env_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"store_password": "from-airflow-cfg"}
    monkeypatch.setattr(config, "_read_airflow_cfg", cfg.get)
    value, _source = config.resolve_setting("store_url", {"store_url": URL})
    assert make_url(value).password == "from-airflow-cfg"
