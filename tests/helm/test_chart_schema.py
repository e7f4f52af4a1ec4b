"""values.schema.json: bad values fail at render time with a message that names the key; lint."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml
from chart_helpers import CHART_DIR, helm, render_error
from test_chart_render import SCENARIOS

SCHEMA_PREFIX = "values don't meet the specifications of the schema(s)"

#: name -> (values, JSON pointer of the offending key, expected message fragment)
BAD_VALUES: dict[str, tuple[dict[str, Any], str, str]] = {
    "storage missing": ({"checkpointStorage": None}, "''", "missing property 'checkpointStorage'"),
    "storage choice missing": (
        {"checkpointStorage": {"mode": None}},
        "'/checkpointStorage'",
        "missing property 'mode'",
    ),
    "storage choice unknown": (
        {"checkpointStorage": {"mode": "nfs"}},
        "'/checkpointStorage/mode'",
        "value must be one of 'pvc', 'objectStore'",
    ),
    "object store without uri": (
        {"checkpointStorage": {"mode": "objectStore"}},
        "'/checkpointStorage/objectStore/uri'",
        "minLength: got 0, want 1",
    ),
    "object store uri malformed": (
        {"checkpointStorage": {"mode": "objectStore", "objectStore": {"uri": "bucket/prefix"}}},
        "'/checkpointStorage/objectStore/uri'",
        "'bucket/prefix' does not match pattern",
    ),
    "object store local path": (
        {"checkpointStorage": {"mode": "objectStore", "objectStore": {"uri": "file:///tmp/x"}}},
        "'/checkpointStorage/objectStore/uri'",
        "'file:///tmp/x' does not match pattern",
    ),
    "object store credentials without secret": (
        {
            "checkpointStorage": {
                "mode": "objectStore",
                "objectStore": {
                    "uri": "s3://bucket/prefix",
                    "credentials": {"env": {"AWS_ACCESS_KEY_ID": "access-key-id"}},
                },
            }
        },
        "'/checkpointStorage/objectStore/credentials/existingSecret'",
        "minLength: got 0, want 1",
    ),
    "pvc size malformed": (
        {"checkpointStorage": {"pvc": {"size": "lots"}}},
        "'/checkpointStorage/pvc/size'",
        "'lots' does not match pattern",
    ),
    "pvc access mode unknown": (
        {"checkpointStorage": {"pvc": {"accessModes": ["ReadWriteAll"]}}},
        "'/checkpointStorage/pvc/accessModes/0'",
        "value must be one of",
    ),
    "standalone master malformed": (
        {"spark": {"mode": "standalone", "master": "spark-master:7077"}},
        "'/spark/master'",
        "'spark-master:7077' does not match pattern '^spark://",
    ),
    "kubernetes master malformed": (
        {
            "spark": {
                "mode": "kubernetes",
                "master": "https://kubernetes.default.svc",
                "kubernetes": {"containerImage": "spark:4"},
            }
        },
        "'/spark/master'",
        "does not match pattern '^k8s://https?://",
    ),
    "kubernetes without executor image": (
        {"spark": {"mode": "kubernetes", "master": "k8s://https://kubernetes.default.svc:443"}},
        "'/spark/kubernetes/containerImage'",
        "minLength: got 0, want 1",
    ),
    "spark connect url malformed": (
        {"spark": {"mode": "connect", "master": "http://spark-connect:15002"}},
        "'/spark/master'",
        "'http://spark-connect:15002' does not match pattern '^sc://",
    ),
    "spark connect url with path": (
        {"spark": {"mode": "connect", "master": "sc://spark-connect:15002/;token=x"}},
        "'/spark/master'",
        "does not match pattern '^sc://",
    ),
    "local mode with a master": (
        {"spark": {"mode": "local", "master": "spark://spark-master:7077"}},
        "'/spark/master'",
        "does not match pattern",
    ),
    "spark mode unknown": (
        {"spark": {"mode": "mesos"}},
        "'/spark/mode'",
        "value must be one of 'local', 'standalone', 'kubernetes', 'yarn', 'connect'",
    ),
    "deploy mode unknown": (
        {"spark": {"deployMode": "remote"}},
        "'/spark/deployMode'",
        "value must be one of 'client', 'cluster'",
    ),
    "external db without secret": (
        {"coordinationDb": {"mode": "external"}},
        "'/coordinationDb/external/existingSecret/name'",
        "minLength: got 0, want 1",
    ),
    "external db url as a value": (
        {"coordinationDb": {"mode": "external", "external": {"url": "postgresql://u:p@h/db"}}},
        "'/coordinationDb/external'",
        "additional properties 'url' not allowed",
    ),
    "store password as a value": (
        {"coordinationDb": {"airflowPostgres": {"password": "postgres"}}},
        "'/coordinationDb/airflowPostgres'",
        "additional properties 'password' not allowed",
    ),
    "store password in the settings configmap": (
        {"settings": {"extra": {"store_password": "postgres"}}},
        "'/settings/extra/store_password'",
        "false schema",
    ),
    "db mode unknown": (
        {"coordinationDb": {"mode": "sqlite"}},
        "'/coordinationDb/mode'",
        "value must be one of 'airflowPostgres', 'external'",
    ),
    "misspelt key": (
        {"chekpointStorage": {"mode": "pvc"}},
        "''",
        "additional properties 'chekpointStorage' not allowed",
    ),
    "negative retention": (
        {"settings": {"retentionDays": -1}},
        "'/settings/retentionDays'",
        "minimum: got -1",
    ),
    "gc pipeline key unsafe": (
        {"gc": {"enabled": True, "pipelines": ["a; rm -rf /"]}},
        "'/gc/pipelines/0'",
        "does not match pattern",
    ),
    "gc schedule malformed": (
        {"gc": {"enabled": True, "pipelines": ["p"], "schedule": "hourly"}},
        "'/gc/schedule'",
        "'hourly' does not match pattern",
    ),
    "retain zero checkpoints": (
        {"settings": {"retainCheckpoints": 0}},
        "'/settings/retainCheckpoints'",
        "minimum: got 0, want 1",
    ),
    "zero target batch duration": (
        {"settings": {"targetBatchS": 0}},
        "'/settings/targetBatchS'",
        "exclusiveMinimum",
    ),
    "interval not a number": (
        {"settings": {"checkpointIntervalS": "1m"}},
        "'/settings/checkpointIntervalS'",
        "got string, want number",
    ),
    "cli api url without scheme": (
        {"airflow": {"api": {"url": "airflow-api-server:8080"}}},
        "'/airflow/api/url'",
        "'airflow-api-server:8080' does not match pattern",
    ),
    "cli api token key without secret": (
        {"airflow": {"api": {"tokenKey": "token"}}},
        "'/airflow/api/existingSecret'",
        "minLength: got 0, want 1",
    ),
    "cli api secret name invalid": (
        {"airflow": {"api": {"existingSecret": "Airflow_Login"}}},
        "'/airflow/api/existingSecret'",
        "'Airflow_Login' does not match pattern",
    ),
    "cli api password key empty": (
        {"airflow": {"api": {"existingSecret": "airflow-login", "passwordKey": ""}}},
        "'/airflow/api/passwordKey'",
        "'' does not match pattern",
    ),
    "cli api password as a value": (
        {"airflow": {"api": {"existingSecret": "airflow-login", "password": "admin"}}},
        "'/airflow/api'",
        "additional properties 'password' not allowed",
    ),
    "cli api password in the settings configmap": (
        {"settings": {"extra": {"api_password": "admin"}}},
        "'/settings/extra/api_password'",
        "false schema",
    ),
    "store url in the settings configmap": (
        {"settings": {"extra": {"store_url": "postgresql://u:p@h/db"}}},
        "'/settings/extra/store_url'",
        "false schema",
    ),
    "api server url malformed": (
        {"airflow": {"apiServerUrl": "airflow.example.com"}},
        "'/airflow/apiServerUrl'",
        "does not match pattern",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_at_render_with_a_clear_message(chart: Any, case: str) -> None:
    values, pointer, fragment = BAD_VALUES[case]
    message = render_error(chart, values)
    assert SCHEMA_PREFIX in message, message
    assert f"at {pointer}: " in message, message
    assert fragment in message, message


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_helm_and_jsonschema_agree_on_bad_values(chart: Any, case: str) -> None:
    """The schema means the same to Python's jsonschema (Draft 7) as to Helm's validator."""
    merged = chart.merge_values(BAD_VALUES[case][0])
    errors = list(_validator().iter_errors(merged))
    assert errors, f"jsonschema accepts values Helm rejects: {case}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_documented_options_pass_the_schema(chart: Any, scenario: str) -> None:
    merged = chart.merge_values(SCENARIOS[scenario])
    chart.validate_schema(merged)  # Helm's validator, raises HelmValuesError
    errors = [e.message for e in _validator().iter_errors(merged)]
    assert errors == []


def test_schema_is_a_valid_draft7_schema(chart: Any) -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    assert chart.schema == schema  # what Helm loaded is the file in the repository


def test_every_default_value_is_declared_in_the_schema() -> None:
    """additionalProperties is false everywhere values.yaml has keys: typos are caught."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        props = node.get("properties", {})
        for key, value in values.items():
            assert key in props, f"{path}{key} is not declared in values.schema.json"
            node_extra = props[key].get("additionalProperties")
            if isinstance(node_extra, dict):  # a typed map (settings.extra): open on purpose
                continue
            if isinstance(value, dict) and "properties" in props[key]:
                assert node_extra is False, f"{path}{key}"
                walk(value, props[key], f"{path}{key}.")

    assert schema["additionalProperties"] is False
    walk(defaults, schema, "")


def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    return jsonschema.Draft7Validator(schema)


# --------------------------------------------------------------------------- lint


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_is_clean(scenario: str) -> None:
    report = helm.lint(CHART_DIR, SCENARIOS[scenario], strict=True, kube_version="v1.30.0")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # severity 0 unknown, 1 info, 2 warning, 3 error; "icon is recommended" is info
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_bad_values() -> None:
    report = helm.lint(CHART_DIR, {"checkpointStorage": {"mode": "nfs"}}, strict=True)
    assert any("'/checkpointStorage/mode'" in error for error in report["errors"]), report


def test_gc_checking_dag_runs_needs_the_cli_login(chart: Any) -> None:
    message = render_error(chart, {"gc": {"enabled": True, "checkDagRuns": True}})
    assert "gc.checkDagRuns asks Airflow's REST API" in message
    assert "airflow.api.existingSecret" in message
