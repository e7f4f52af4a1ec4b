"""The job spec a submitted Spark driver runs, sealed by the Airflow task (issue 37).

``spec.json`` decides what code the driver runs (its ``ref:module:qualname`` references, its
splits), and it lives in the checkpoint storage, which others may be able to write (a shared
bucket). So it is sealed like ``code.pkl``: a JSON envelope ``{"format": 3, "sealed": <Fernet
token>}`` whose token holds the job, the split list's fingerprint and the digest of the sealed
``code.pkl`` written with it. The driver opens it with the deployment's signing key before it
imports or unpickles anything; a rewritten, unsigned or foreign spec, a spec copied from
another submission's directory, or a ``code.pkl`` swapped for another one is refused with one
line. A reference is resolved only if the sealed spec declares it for one of the stage's
functions and it names an object defined under that name (what the task checked when it
chose a reference over pickling).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from airflow_finalckpt.core.split_list import split_list_fingerprint
from airflow_finalckpt.spark.job import JOB_FORMAT, DriverJob, resolve_reference
from airflow_finalckpt.spark.secrets import UntrustedCodeError, spec_key

#: The stage functions a spec may name by ``ref:module:qualname`` (sinks are always pickled).
REFERENCE_SLOTS = ("transform", "on_finish", "split_bytes")
REF_PREFIX = "ref:"


def code_digest(blob: bytes | None) -> str | None:
    """The sha256 of a sealed ``code.pkl`` (None without one)."""
    return None if blob is None else hashlib.sha256(blob).hexdigest()


def seal_spec(job: DriverJob, code: bytes | None, signing_key: str) -> bytes:
    """``spec.json``'s bytes: the job, its split fingerprint and its code's digest, sealed."""
    from cryptography.fernet import Fernet

    payload = {
        "job": json.loads(job.to_json()),
        "splits_sha256": split_list_fingerprint(job.splits),
        "code_sha256": code_digest(code),
    }
    token = Fernet(spec_key(signing_key)).encrypt(json.dumps(payload, sort_keys=True).encode())
    return json.dumps({"format": JOB_FORMAT, "sealed": token.decode("ascii")}).encode()


@dataclass(frozen=True)
class OpenedSpec:
    """A verified job spec and the digest of the ``code.pkl`` sealed with it."""

    job: DriverJob
    code_sha256: str | None


def _refused(where: str, why: str = "") -> UntrustedCodeError:
    reason = why or ("tampered, unsigned, or written with another [finalckpt] code_signing_key")
    return UntrustedCodeError(
        f"job spec {where} is not sealed with this deployment's code signing key ({reason}): "
        "refused before anything is imported"
    )


def _token(data: bytes, where: str) -> bytes:
    try:
        doc = json.loads(data)
        token = doc["sealed"] if isinstance(doc, dict) else None
    except (ValueError, KeyError):
        token = None
    if not isinstance(token, str):
        raise _refused(where)
    return token.encode("ascii", errors="replace")


def open_spec(data: bytes, signing_key: str, where: str) -> OpenedSpec:
    """The job of a sealed ``spec.json``; ``UntrustedCodeError`` (one line) unless its seal,
    its split list and its code references verify.
    """
    from cryptography.fernet import Fernet, InvalidToken

    try:
        payload = json.loads(Fernet(spec_key(signing_key)).decrypt(_token(data, where)))
    except (InvalidToken, ValueError, TypeError):
        raise _refused(where) from None
    job = DriverJob.from_json(json.dumps(payload["job"]).encode())
    if split_list_fingerprint(job.splits) != payload.get("splits_sha256"):
        raise _refused(where, "its split list is not the one it was sealed with")
    for slot, how in job.code.items():
        if how is None or how == "pickle":
            continue
        if slot not in REFERENCE_SLOTS or not how.startswith(REF_PREFIX):
            raise _refused(where, f"its {slot} is {how!r}, which no task declares")
    return OpenedSpec(job=job, code_sha256=payload.get("code_sha256"))


def check_location(expected: str, where: str) -> None:
    """Refuse a sealed spec found in another submission's directory (copied, not written there):
    ``expected`` is where its own job says it was written, ``where`` where the driver read it.
    """
    if expected.rstrip("/") != where.rstrip("/"):
        raise _refused(where, f"it was sealed for {expected}")


def check_code(blob: bytes, opened: OpenedSpec, where: str) -> None:
    """Refuse a ``code.pkl`` that is not the one sealed with the spec (swapped for another)."""
    if code_digest(blob) != opened.code_sha256:
        raise UntrustedCodeError(
            f"code file {where} is not the one its job spec was sealed with (replaced): "
            "refused before unpickling"
        )


def declared_reference(how: str, slot: str, where: str) -> Any:
    """The object a sealed spec's ``ref:module:qualname`` names, if it is defined under that
    name (``os:system`` is ``posix.system``: refused, as the task would never have named it).
    """
    ref = how[len(REF_PREFIX) :]
    module, _, qualname = ref.partition(":")
    obj = resolve_reference(ref)
    if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != qualname:
        raise _refused(where, f"its {slot} {ref!r} names no function defined there")
    return obj
