"""Settings resolution: order of sources, Airflow connection forms, bad values, masking."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from airflow_finalckpt import config
from airflow_finalckpt.config import (
    CONNECTION_ENV,
    FinalCkptSettings,
    load_settings,
    mask_url,
    resolve_setting,
    store_url_from_connection,
)
from airflow_finalckpt.core.errors import ConfigurationError

READ_AIRFLOW_CFG = config._read_airflow_cfg  # the real one, before fixtures replace it


@pytest.fixture(autouse=True)
def _isolated(isolated_settings_env: Path) -> Path:
    return isolated_settings_env


@pytest.fixture
def airflow_cfg(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fake ``[finalckpt]`` section of airflow.cfg: fill the dict in the test."""
    section: dict[str, str] = {}
    monkeypatch.setattr(config, "_read_airflow_cfg", section.get)
    return section


# --------------------------------------------------------------------------- defaults


def test_defaults_live_under_airflow_home(isolated_settings_env: Path) -> None:
    settings = load_settings()

    home = isolated_settings_env
    assert settings.store_url == f"sqlite:///{home}/finalckpt/coordination.db"
    assert settings.storage_uri == f"{home}/finalckpt/checkpoints"
    assert settings.storage_options == {}
    assert settings.checkpoint_interval_s == 60.0
    assert settings.checkpoint_timeout_s == 600.0
    assert settings.retain_checkpoints == 3
    assert set(settings.sources.values()) == {"default"}
    assert make_url(settings.store_url).database == f"{home}/finalckpt/coordination.db"


def test_default_airflow_home_is_home_airflow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AIRFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))

    settings = load_settings()

    assert settings.store_url == f"sqlite:///{tmp_path}/airflow/finalckpt/coordination.db"
    assert settings.storage_uri == f"{tmp_path}/airflow/finalckpt/checkpoints"


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.retain_checkpoints = 5  # type: ignore[misc]


# --------------------------------------------------------------------------- resolution order

# (setting, override, env, airflow.cfg, expected parsed values in that order, default)
ORDER_CASES = [
    (
        "storage_uri",
        ["s3a://over/ckpt", "gs://env/ckpt", "/cfg/ckpt"],
        ["s3a://over/ckpt", "gs://env/ckpt", "/cfg/ckpt"],
    ),
    ("checkpoint_interval_s", [5, "6.5", "7"], [5.0, 6.5, 7.0]),
    ("checkpoint_timeout_s", ["50", "60", "70"], [50.0, 60.0, 70.0]),
    ("retain_checkpoints", [1, "2", "4"], [1, 2, 4]),
    (
        "storage_options",
        [{"anon": True}, '{"anon": false}', '{"x": 1}'],
        [
            {"anon": True},
            {"anon": False},
            {"x": 1},
        ],
    ),
]


@pytest.mark.parametrize(("name", "raws", "expected"), ORDER_CASES, ids=lambda c: str(c)[:30])
def test_each_source_wins_over_the_next(
    name: str,
    raws: list[object],
    expected: list[object],
    monkeypatch: pytest.MonkeyPatch,
    airflow_cfg: dict[str, str],
) -> None:
    override, env, cfg = raws
    monkeypatch.setenv(f"AIRFLOW__FINALCKPT__{name.upper()}", str(env))
    airflow_cfg[name] = str(cfg)

    assert resolve_setting(name, {name: override}) == (expected[0], "override")
    assert resolve_setting(name) == (expected[1], f"env AIRFLOW__FINALCKPT__{name.upper()}")
    monkeypatch.delenv(f"AIRFLOW__FINALCKPT__{name.upper()}")
    assert resolve_setting(name) == (expected[2], f"airflow.cfg [finalckpt] {name}")
    del airflow_cfg[name]
    assert resolve_setting(name)[1] == "default"


def test_store_url_order_override_env_connection_cfg_default(
    monkeypatch: pytest.MonkeyPatch, airflow_cfg: dict[str, str]
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "postgresql://env@h/envdb")
    monkeypatch.setenv(CONNECTION_ENV, "postgres://conn@h/conndb")
    airflow_cfg["store_url"] = "sqlite:////cfg/coordination.db"
    overrides = {"store_url": "postgresql+psycopg://over@h/overdb"}

    assert load_settings(overrides).store_url == "postgresql+psycopg://over@h/overdb"
    settings = load_settings()
    assert settings.store_url == "postgresql+psycopg://env@h/envdb"
    assert settings.sources["store_url"] == "env AIRFLOW__FINALCKPT__STORE_URL"
    monkeypatch.delenv("AIRFLOW__FINALCKPT__STORE_URL")
    settings = load_settings()
    assert settings.store_url == "postgresql+psycopg://conn@h/conndb"
    assert settings.sources["store_url"] == (
        "connection finalckpt_default (env AIRFLOW_CONN_FINALCKPT_DEFAULT)"
    )
    monkeypatch.delenv(CONNECTION_ENV)
    assert load_settings().store_url == "sqlite:////cfg/coordination.db"
    del airflow_cfg["store_url"]
    assert load_settings().sources["store_url"] == "default"


def test_none_override_and_empty_env_count_as_unset(
    monkeypatch: pytest.MonkeyPatch, airflow_cfg: dict[str, str]
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS", "  ")
    airflow_cfg["retain_checkpoints"] = "9"

    assert resolve_setting("retain_checkpoints", {"retain_checkpoints": None}) == (
        9,
        "airflow.cfg [finalckpt] retain_checkpoints",
    )


def test_airflow_is_not_consulted_when_an_earlier_source_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def must_not_be_called(name: str) -> str:
        raise AssertionError(f"airflow.cfg consulted for {name}")

    monkeypatch.setattr(config, "_read_airflow_cfg", must_not_be_called)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "sqlite:////env/x.db")

    assert resolve_setting("store_url") == (
        "sqlite:////env/x.db",
        "env AIRFLOW__FINALCKPT__STORE_URL",
    )
    assert resolve_setting("retain_checkpoints", {"retain_checkpoints": 2})[0] == 2


def test_a_bad_value_shadowed_by_a_higher_source_does_not_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__CHECKPOINT_INTERVAL_S", "-3")

    settings = load_settings({"checkpoint_interval_s": 1.5})

    assert settings.checkpoint_interval_s == 1.5


def test_failure_to_import_airflow_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import airflow.configuration` raise ImportError.
    monkeypatch.setitem(sys.modules, "airflow", None)
    monkeypatch.setitem(sys.modules, "airflow.configuration", None)

    assert READ_AIRFLOW_CFG("store_url") is None


def test_airflow_cfg_section_is_read_through_real_airflow(tmp_path: Path) -> None:
    """Real Airflow, in a subprocess: its conf object is read once per process."""
    if importlib.util.find_spec("airflow") is None:
        pytest.fail("Airflow is part of the dev environment but is not installed")
    home = tmp_path / "home"
    home.mkdir()
    (home / "airflow.cfg").write_text(
        "[finalckpt]\nstore_url = sqlite:////cfg/coordination.db\nretain_checkpoints = 7\n"
    )
    script = textwrap.dedent(
        """
        import json
        from airflow_finalckpt.config import load_settings
        s = load_settings()
        print(json.dumps({"url": s.store_url, "retain": s.retain_checkpoints,
                          "sources": dict(s.sources)}))
        """
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "9",
    }

    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["url"] == "sqlite:////cfg/coordination.db"
    assert result["sources"]["store_url"] == "airflow.cfg [finalckpt] store_url"
    assert result["retain"] == 9
    assert result["sources"]["retain_checkpoints"] == "env AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS"


# --------------------------------------------------------------------------- driver rewrite


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
    ],
)
def test_store_url_pins_psycopg3(given: str, expected: str) -> None:
    assert load_settings({"store_url": given}).store_url == expected


# --------------------------------------------------------------------------- connection forms


def test_uri_connection_keeps_encoded_credentials() -> None:
    url = make_url(store_url_from_connection("postgresql://user:p%40ss%2Fw@db.example:6543/coord"))

    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "user",
        "p@ss/w",
        "db.example",
        6543,
        "coord",
    )


def test_uri_connection_keeps_libpq_extras_only() -> None:
    url = make_url(store_url_from_connection("postgres://u@h/db?sslmode=require&cursor=dictcursor"))
    assert dict(url.query) == {"sslmode": "require"}

    extra = json.dumps({"sslmode": "verify-full", "iam": True})
    url = make_url(store_url_from_connection(f"postgres://u@h/db?__extra__={extra}"))
    assert dict(url.query) == {"sslmode": "verify-full"}


def test_uri_connection_sqlite() -> None:
    assert store_url_from_connection("sqlite:////abs/path.db") == "sqlite:////abs/path.db"
    # What Airflow's Connection(conn_type="sqlite", host="/abs/path.db").get_uri() renders:
    assert store_url_from_connection("sqlite://%2Fabs%2Fpath.db") == "sqlite:////abs/path.db"


def test_json_connection_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        CONNECTION_ENV,
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "pg.internal",
                "login": "finalckpt",
                "password": "p@ss/w:rd",
                "port": "5433",
                "schema": "coord",
                "extra": {"sslmode": "require", "cursor": "dictcursor"},
            }
        ),
    )

    settings = load_settings()

    url = make_url(settings.store_url)
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "finalckpt",
        "p@ss/w:rd",
        "pg.internal",
        5433,
        "coord",
    )
    assert dict(url.query) == {"sslmode": "require"}
    assert "p@ss/w:rd" not in settings.describe()


def test_json_connection_sqlite_uses_host_as_path() -> None:
    conn = json.dumps({"conn_type": "sqlite", "host": "/data/coordination.db"})
    assert store_url_from_connection(conn) == "sqlite:////data/coordination.db"


@pytest.mark.parametrize(
    ("conn", "fragment"),
    [
        ('{"conn_type": "mysql", "host": "h"}', "connection type 'mysql'"),
        ('{"conn_type": "postgres", "host": "h", "port": "x"}', "port 'x' is not a number"),
        ('{"conn_type": "postgres", "host": "h"', "not valid JSON"),
        ('{"conn_type": "postgres", "host": "h"}', "names no database"),
        ('{"conn_type": "sqlite"}', "names no database file"),
        ("mysql://u@h/db", "connection type 'mysql'"),
        ("just-text", "neither a URI nor a JSON object"),
    ],
)
def test_bad_connection_names_setting_and_source(
    conn: str, fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONNECTION_ENV, conn)

    with pytest.raises(ConfigurationError) as info:
        load_settings()

    message = str(info.value)
    assert "store_url from connection finalckpt_default" in message
    assert fragment in message


# --------------------------------------------------------------------------- bad values

BAD_VALUES = [
    ("store_url", "not a url", "not a SQLAlchemy URL"),
    ("store_url", "mysql://u@h/db", "unsupported database"),
    ("store_url", "postgresql+psycopg2://u@h/db", "unsupported driver"),
    ("store_url", "sqlite+aiosqlite:////x.db", "unsupported driver"),
    ("store_url", "sqlite://", "in-memory"),
    ("store_url", "sqlite:///relative.db", "relative"),
    ("store_url", "postgresql://u@h", "names no database"),
    ("storage_uri", "relative/dir", "relative"),
    ("storage_uri", "nosuchproto://bucket/x", "unknown storage protocol 'nosuchproto'"),
    ("storage_options", "[1, 2]", "must be a JSON object"),
    ("storage_options", "{bad", "not valid JSON"),
    ("checkpoint_interval_s", "-5", "positive"),
    ("checkpoint_interval_s", "0", "positive"),
    ("checkpoint_interval_s", "soon", "number of seconds"),
    ("checkpoint_interval_s", "nan", "positive, finite"),
    ("checkpoint_timeout_s", "inf", "positive, finite"),
    ("checkpoint_timeout_s", "-1", "positive"),
    ("retain_checkpoints", "2.5", "integer"),
    ("retain_checkpoints", "many", "integer"),
    ("retain_checkpoints", "0", "integer >= 1"),
]


@pytest.mark.parametrize(("name", "raw", "fragment"), BAD_VALUES)
def test_bad_env_value_names_setting_and_source(
    name: str, raw: str, fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_name = f"AIRFLOW__FINALCKPT__{name.upper()}"
    monkeypatch.setenv(env_name, raw)

    with pytest.raises(ConfigurationError) as info:
        load_settings()

    message = str(info.value)
    assert f"invalid finalckpt setting {name} from env {env_name}" in message
    assert fragment in message


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"retain_checkpoints": 2.5}, "retain_checkpoints from override"),
        ({"retain_checkpoints": True}, "retain_checkpoints from override"),
        ({"checkpoint_interval_s": True}, "checkpoint_interval_s from override"),
        ({"checkpoint_interval_s": -0.1}, "checkpoint_interval_s from override"),
        ({"storage_options": 3}, "storage_options from override"),
        ({"retain": 3}, "unknown finalckpt setting(s) ['retain']"),
    ],
)
def test_bad_override(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_settings(overrides)
    assert fragment in str(info.value)


def test_bad_airflow_cfg_value_names_airflow_cfg(airflow_cfg: dict[str, str]) -> None:
    airflow_cfg["checkpoint_timeout_s"] = "later"

    with pytest.raises(ConfigurationError) as info:
        load_settings()

    assert "checkpoint_timeout_s from airflow.cfg [finalckpt] checkpoint_timeout_s" in str(
        info.value
    )


def test_error_about_a_url_does_not_leak_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "mysql://u:topsecret@h/db")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "topsecret" not in str(info.value)

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "postgresql+pg8000://u:topsecret@h/db")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "topsecret" not in str(info.value)


# --------------------------------------------------------------------------- masking


def test_describe_and_repr_mask_secrets() -> None:
    settings = load_settings(
        {
            "store_url": "postgresql://finalckpt:hunter2@pg:5432/coord",
            "storage_uri": "s3a://bucket/ckpt",
            "storage_options": {
                "key": "AKIAEXAMPLE",
                "secret": "s3cr3t",
                "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": "tok"},
            },
        }
    )

    for text in (settings.describe(), repr(settings), str(settings)):
        assert "hunter2" not in text
        assert "AKIAEXAMPLE" not in text
        assert "s3cr3t" not in text
        assert 'tok"' not in text
        assert "postgresql+psycopg://finalckpt:***@pg:5432/coord" in text
        assert "eu-west-1" in text
    assert settings.store_url == "postgresql+psycopg://finalckpt:hunter2@pg:5432/coord"
    assert settings.storage_options["secret"] == "s3cr3t"
    assert "store_url = postgresql+psycopg://finalckpt:***@pg:5432/coord (override)" in (
        settings.describe()
    )


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql+psycopg://u:pw@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
        ("webdav://alice:pw@dav.example/ckpt", "webdav://alice:***@dav.example/ckpt"),
        ("/local/path", "/local/path"),
        # issue 27: query-string passwords, Azure SAS tokens and connection strings
        (
            "postgresql+psycopg://u@h/db?password=hunter2&sslmode=require",
            "postgresql+psycopg://u@h/db?password=***&sslmode=require",
        ),
        (
            "abfs://c@acct.dfs.core.windows.net/x?sv=2022&sig=SASsecret%3D&se=2030",
            "abfs://c@acct.dfs.core.windows.net/x?sv=2022&sig=***&se=2030",
        ),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=KEYsecret==;"
            "EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;"
            "EndpointSuffix=core.windows.net",
        ),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_azure_storage_options_are_masked() -> None:
    from airflow_finalckpt.config import mask_storage_options

    options = {
        "account_name": "acct",
        "connection_string": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=K1==",
        "sas_token": "sv=2022&sig=S1",
        "sas": "sv=2022&sig=S2",
        "endpoint_url": "https://acct.blob.core.windows.net/?sv=1&sig=S3",
    }
    shown = repr(mask_storage_options(options))
    for secret in ("K1==", "S1", "S2", "S3"):
        assert secret not in shown, shown
    assert "'account_name': 'acct'" in shown


def test_settings_compare_by_value_not_by_source() -> None:
    a = load_settings({"retain_checkpoints": 4})
    b = FinalCkptSettings(
        store_url=a.store_url,
        storage_uri=a.storage_uri,
        storage_options={},
        retain_checkpoints=4,
    )
    assert a == b


def test_config_store_and_cli_work_without_airflow(tmp_path: Path) -> None:
    """Airflow is optional: blocked from importing, settings, migrations and the CLI still work."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["airflow"] = None  # any `import airflow...` now raises ImportError
        from click.testing import CliRunner
        from airflow_finalckpt.cli.main import main
        from airflow_finalckpt.config import load_settings
        from airflow_finalckpt.store.engine import make_engine
        from airflow_finalckpt.store.migrate import ensure_schema
        settings = load_settings()
        assert set(settings.sources.values()) == {"default"}, settings.sources
        assert ensure_schema(make_engine(settings.store_url)) is True
        result = CliRunner().invoke(main, ["db", "check"])
        assert result.exit_code == 0, result.output
        print("ok")
        """
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AIRFLOW_HOME": str(tmp_path / "h")}

    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_importing_the_package_modules_does_not_import_airflow() -> None:
    script = (
        "import sys, airflow_finalckpt.config, airflow_finalckpt.store.migrate, "
        "airflow_finalckpt.cli.main; "
        "from airflow_finalckpt.config import load_settings; "
        "load_settings({'store_url': 'sqlite:////x.db', 'storage_uri': '/c', "
        "'storage_options': {}, 'checkpoint_interval_s': 1, 'checkpoint_timeout_s': 2, "
        "'retain_checkpoints': 1, 'store_connect_retries': 0, 'store_connect_backoff_s': 1, "
        "'target_batch_s': 30, 'retention_days': 7, 'attempt_lease_s': 60, "
        "'storage_conn_id': ''}); "
        "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_cli_finds_the_api_server_and_its_login_through_airflow_config(
    tmp_path: Path,
) -> None:
    """``finalckpt restore``'s API client settings (cli/airflow_api.py), with real Airflow in a
    subprocess: [finalckpt] api_url, else [api] base_url, else the default; the password from a
    sensitive option's _CMD variant."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "airflow.cfg").write_text(
        "[api]\nbase_url = http://cfg.example:8081/\n[finalckpt]\napi_username = cfg-user\n"
    )
    script = textwrap.dedent(
        """
        import dataclasses, json, os
        from airflow_finalckpt.cli.airflow_api import api_settings
        out = [dataclasses.asdict(api_settings())]
        os.environ["AIRFLOW__FINALCKPT__API_URL"] = "https://env.example/airflow/"
        out.append(dataclasses.asdict(api_settings()))
        del os.environ["AIRFLOW__FINALCKPT__API_URL"]
        os.environ["AIRFLOW__API__BASE_URL"] = " "
        out.append(dataclasses.asdict(api_settings()))
        print(json.dumps(out))
        """
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__FINALCKPT__API_PASSWORD_CMD": "echo from-cmd",
    }

    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == 0, proc.stderr
    cfg, from_env, default = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cfg == {
        "url": "http://cfg.example:8081",
        "url_source": "Airflow's config [api] base_url",
        "token": None,
        "username": "cfg-user",
        "password": "from-cmd",
    }
    assert (from_env["url"], from_env["url_source"]) == (
        "https://env.example/airflow",
        "env AIRFLOW__FINALCKPT__API_URL",
    )
    assert (default["url"], default["url_source"]) == ("http://localhost:8080", "default")
