"""How a submitted Spark driver gets its credentials and trusts its code (issue 27).

Both sides use this module: the Airflow task (``spark.launch.submit``) and the driver
(``spark.driver``), so it never imports Airflow.

- **Credentials** (the store URL, credential storage options, the code key) travel in a
  *secrets file* readable only by the job: a JSON file of mode 0600 in a private (0700)
  temporary directory of the machine that runs spark-submit, named by its path in the
  driver's arguments (``--secrets``: a path is no secret). A client-mode driver reads it
  there; a YARN cluster-mode driver gets it through ``--files`` (YARN's private staging
  directory); a Kubernetes cluster-mode driver takes them from Kubernetes Secrets instead
  (``spark.kubernetes.driver.secretKeyRef.<ENV>``, see docs/spark-cluster.md). Never on a
  command line, in a pod spec or in the checkpoint storage.
- **Code and job spec** (``code.pkl``, ``spec.json``) are sealed: encrypted and authenticated
  (Fernet: AES-CBC + HMAC-SHA256) with keys derived from the deployment's *signing key*:
  ``[finalckpt] code_signing_key`` when set, else a random key the deployment generated once
  and keeps in its coordination store (``store.deployment_secrets``; never derived from
  anything guessable). A tampered, unsigned or foreign file is refused before anything is
  unpickled or imported; sink URLs inside them are not readable in the checkpoint storage.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_finalckpt.core.errors import ConfigurationError, FinalCheckpointError

SECRETS_FILE_NAME = "finalckpt-driver-secrets.json"
#: The code signing key's environment variable (``[finalckpt] code_signing_key``).
CODE_KEY_ENV = "AIRFLOW__FINALCKPT__CODE_SIGNING_KEY"
_CODE_DERIVATION = b"airflow-finalckpt code.pkl v1\0"
_SPEC_DERIVATION = b"airflow-finalckpt spec.json v1\0"


class UntrustedCodeError(FinalCheckpointError):
    """``code.pkl`` or the job spec is not sealed with this deployment's key: refused before
    anything is unpickled or imported.
    """


class MissingSigningKeyError(ConfigurationError):
    """No signing key to seal or open a driver's code with."""


@dataclass(frozen=True)
class SigningKey:
    """The deployment's signing key and where it comes from: ``configured`` (``[finalckpt]
    code_signing_key``: a Kubernetes cluster-mode driver needs it from a Secret) or generated
    and kept in the coordination store (a driver reads it there).
    """

    value: str
    configured: bool

    def __post_init__(self) -> None:
        if not self.value:
            raise MissingSigningKeyError(
                "no code signing key: set [finalckpt] code_signing_key (env "
                f"{CODE_KEY_ENV}, or the Helm chart's codeSigningKey.existingSecret) or let the "
                "deployment generate one in its coordination store"
            )

    def __repr__(self) -> str:  # never in a log or a traceback's locals
        return f"SigningKey(configured={self.configured}, value=***)"


def _fernet_key(signing_key: str, derivation: bytes) -> bytes:
    if not signing_key:  # never a key derived from nothing
        raise MissingSigningKeyError(
            f"no code signing key: set [finalckpt] code_signing_key ({CODE_KEY_ENV})"
        )
    digest = hashlib.sha256(derivation + signing_key.encode()).digest()
    return base64.urlsafe_b64encode(digest)


def code_key(signing_key: str) -> bytes:
    """The Fernet key of ``code.pkl`` (its own derivation of the signing key)."""
    return _fernet_key(signing_key, _CODE_DERIVATION)


def spec_key(signing_key: str) -> bytes:
    """The Fernet key of ``spec.json`` (another derivation: neither file opens as the other)."""
    return _fernet_key(signing_key, _SPEC_DERIVATION)


def seal_code(blob: bytes, key: bytes) -> bytes:
    """Encrypt and authenticate pickled stage code."""
    from cryptography.fernet import Fernet

    return Fernet(key).encrypt(blob)


def open_code(sealed: bytes, key: bytes, where: str) -> bytes:
    """The pickled code of a sealed file; ``UntrustedCodeError`` if its seal does not verify."""
    from cryptography.fernet import Fernet, InvalidToken

    try:
        return Fernet(key).decrypt(sealed)
    except (InvalidToken, ValueError, TypeError):
        raise UntrustedCodeError(
            f"code file {where} is not sealed with this deployment's code signing key "
            "(tampered, unsigned, or written with another [finalckpt] code_signing_key): "
            "refused before unpickling"
        ) from None


def write_secrets_file(values: Mapping[str, Any]) -> str:
    """Write ``values`` as JSON to a new 0600 file in a new 0700 directory; returns its path."""
    directory = tempfile.mkdtemp(prefix="finalckpt-driver-")  # mode 0700
    path = os.path.join(directory, SECRETS_FILE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(values), out)
    return path


def remove_secrets_file(path: str | None) -> None:
    """Remove a secrets file and its private directory (no error if already gone)."""
    if not path:
        return
    directory = os.path.dirname(path)
    if os.path.basename(directory).startswith("finalckpt-driver-"):
        shutil.rmtree(directory, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def read_secrets_file(named: str | None) -> dict[str, Any]:
    """The driver's secrets from the file ``--secrets`` names (by path, or by name in the
    working directory, where YARN puts ``--files``), removed once read; empty without one.
    """
    if not named:
        return {}
    path = named if os.path.exists(named) else os.path.basename(named)
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except OSError as exc:
        raise ConfigurationError(
            f"driver: cannot read its secrets file {named} ({type(exc).__name__}): the "
            "Airflow task writes it just before spark-submit and the driver removes it once read"
        ) from None
    if os.path.isabs(path):
        remove_secrets_file(path)
    return dict(doc)
