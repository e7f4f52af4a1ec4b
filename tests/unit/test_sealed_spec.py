"""The sealed job spec and the deployment's signing key (issue 37): what the driver accepts
of a spec (its seal, its split fingerprint, the references it declares, where it was written)
and where the signing key comes from when ``[finalckpt] code_signing_key`` is unset (a random
key kept in the coordination store, never one derived from the store URL)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from airflow_finalckpt.runtime.assembly import StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark.job import DriverJob
from airflow_finalckpt.spark.launch.submit import deployment_signing_key
from airflow_finalckpt.spark.sealed_spec import (
    check_location,
    declared_reference,
    open_spec,
    seal_spec,
)
from airflow_finalckpt.spark.secrets import (
    MissingSigningKeyError,
    SigningKey,
    UntrustedCodeError,
    code_key,
    open_code,
    seal_code,
    spec_key,
)
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, stored_secret
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "a-deployment-signing-key"
WHERE = "sealed/drivers/ingest/s1/spec.json"


def job(**code: str | None) -> DriverJob:
    spec = StageSpec(pipeline_key="sealed", stage_id="ingest", splits=("a", "b"), batch_size=1)
    return DriverJob.for_stage(
        StageJob(spec),
        submission_id="s1",
        storage_uri="/ckpt",
        store_url_masked="sqlite:///store.db",
        code={"transform": "ref:json:dumps", **code},
        spark_conf={},
    )


def refusal(data: bytes, key: str = KEY) -> str:
    with pytest.raises(UntrustedCodeError) as refused:
        open_spec(data, key, WHERE)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"job spec {WHERE} is not sealed")
    assert message.endswith("refused before anything is imported")
    return message


def test_a_sealed_spec_opens_with_its_key_only() -> None:
    sealed = seal_spec(job(), b"code", KEY)
    opened = open_spec(sealed, KEY, WHERE)
    assert opened.job == job() and opened.code_sha256 == hashlib.sha256(b"code").hexdigest()
    assert b"json:dumps" not in sealed and b"ingest" not in sealed  # encrypted, not just signed
    refusal(sealed, "another-deployment")
    refusal(job().to_json())  # the plain job, as a watcher would write it
    refusal(b"not json at all")
    refusal(json.dumps({"format": 3, "sealed": 42}).encode())


def test_a_spec_whose_split_list_is_not_its_fingerprint_is_refused() -> None:
    payload = {"job": json.loads(job().to_json()), "splits_sha256": "0" * 64, "code_sha256": None}
    token = Fernet(spec_key(KEY)).encrypt(json.dumps(payload).encode()).decode()
    sealed = json.dumps({"format": 3, "sealed": token}).encode()
    assert "its split list is not the one it was sealed with" in refusal(sealed)


def test_references_are_resolved_only_where_a_task_declares_them() -> None:
    # a reference where only pickled code goes (sinks), or a value no task writes: refused
    assert "its sinks is 'ref:os:system'" in refusal(
        seal_spec(job(sinks="ref:os:system"), None, KEY)
    )
    assert "which no task declares" in refusal(seal_spec(job(on_finish="os:system"), None, KEY))
    # a declared slot naming an object not defined under that name (os.system is posix.system)
    with pytest.raises(UntrustedCodeError, match="names no function defined there"):
        declared_reference("ref:os:system", "split_bytes", WHERE)
    assert declared_reference("ref:json:dumps", "transform", WHERE) is json.dumps


def test_a_spec_read_from_another_directory_is_refused() -> None:
    check_location(
        "/ckpt/sealed/drivers/ingest/s1/spec.json", "/ckpt/sealed/drivers/ingest/s1/spec.json"
    )
    with pytest.raises(UntrustedCodeError, match=r"it was sealed for /ckpt/a/spec\.json"):
        check_location("/ckpt/a/spec.json", "/ckpt/b/spec.json")


def old_derived_key(store_url: str) -> bytes:
    digest = hashlib.sha256(b"airflow-finalckpt code.pkl v1\0" + f"store:{store_url}".encode())
    return base64.urlsafe_b64encode(digest.digest())


def test_without_a_configured_key_the_deployment_generates_one_in_its_store(
    tmp_path: Path,
) -> None:
    urls = [f"sqlite:///{tmp_path}/{name}.db" for name in ("one", "two")]
    for url in urls:
        ensure_schema(make_engine(url))
    first = deployment_signing_key(None, urls[0])
    assert not first.configured and len(first.value) >= 43  # 256 random bits
    assert deployment_signing_key(None, urls[0]) == first  # once per deployment
    assert deployment_signing_key(None, urls[1]).value != first.value
    assert stored_secret(make_engine(urls[0]), CODE_SIGNING_KEY) == first.value
    assert deployment_signing_key("configured", urls[1]) == SigningKey("configured", True)
    # code sealed with the key derivable from the store URL opens no more
    forged = Fernet(old_derived_key(urls[0])).encrypt(b"payload")
    with pytest.raises(UntrustedCodeError, match="refused before unpickling"):
        open_code(forged, code_key(first.value), "code.pkl")
    assert open_code(seal_code(b"payload", code_key(first.value)), code_key(first.value), "x")


def test_no_key_is_a_clear_refusal_never_a_derived_key(tmp_path: Path) -> None:
    with pytest.raises(MissingSigningKeyError):
        code_key("")
    with pytest.raises(MissingSigningKeyError, match=r"codeSigningKey\.existingSecret"):
        SigningKey("", configured=True)
    assert "value=***" in repr(SigningKey("secret-value", configured=False))
    assert "secret-value" not in repr(SigningKey("secret-value", configured=False))
    url = f"sqlite:///{tmp_path}/empty.db"
    engine = make_engine(url)
    ensure_schema(engine)
    with pytest.raises(MissingSigningKeyError, match="none in the coordination store") as missing:
        driver.signing_key({}, engine)
    assert "\n" not in str(missing.value)
    assert driver.signing_key({"code_signing_key": "from-the-secrets-file"}, engine) == (
        "from-the-secrets-file"
    )
