"""The envelope around every metadata body: format tag, version and checksum, in strict JSON.

The envelope never changes between versions; only the body does. Readers check the envelope
first, so a file of a newer version is reported as such before its body is even looked at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from airflow_finalckpt.core.errors import MetadataError, UnsupportedMetadataVersionError

FORMAT_TAG = "airflow-finalckpt/checkpoint-metadata"
ENVELOPE_KEYS = frozenset({"format", "version", "sha256", "body"})


@dataclass(frozen=True)
class Envelope:
    """A checked envelope: its body matches its checksum and its version is readable."""

    version: int
    body: dict[str, Any]


class _StrictJsonError(ValueError):
    """JSON that Python would accept but the format forbids (duplicate keys, NaN)."""


#: ``json.dumps`` with these arguments builds this encoder at every call; built once instead
#: (thousands of small values a completion). Its ``encode`` keeps no state between calls.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """The one byte form a JSON value hashes as: sorted keys, no spaces, ASCII only.

    ASCII-only keeps any Python string (even a lone surrogate) representable and the file
    independent of the reader's text encoding.
    """
    return _CANONICAL.encode(value).encode("ascii")


def json_sha256(value: Any) -> str:
    """The sha256 of a JSON value's canonical form: every fingerprint in the metadata."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def body_checksum(body: Mapping[str, Any]) -> str:
    """The sha256 of the body's canonical JSON (what the envelope's ``sha256`` states)."""
    return json_sha256(body)


def seal(version: int, body: dict[str, Any], *, indent: int | None = 2) -> bytes:
    """Wrap a body into the envelope, the header first for humans (``indent`` None: compact)."""
    document = {
        "format": FORMAT_TAG,
        "version": version,
        "sha256": body_checksum(body),
        "body": body,
    }
    separators = (", ", ": ") if indent is not None else (",", ":")
    text = json.dumps(
        document, indent=indent, separators=separators, ensure_ascii=True, allow_nan=False
    )
    return (text + "\n").encode("ascii")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _StrictJsonError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _refuse_constant(name: str) -> NoReturn:
    raise _StrictJsonError(f"{name} is not a JSON number")


def parse_json(data: bytes, source: str) -> Any:
    """Decode strict UTF-8 JSON; every failure becomes a MetadataError naming the source."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MetadataError(
            f"checkpoint metadata {source}: expected bytes, got {type(data).__name__}"
        )
    raw = bytes(data)
    if not raw.strip():
        raise MetadataError(f"checkpoint metadata {source} is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetadataError(
            f"checkpoint metadata {source} is not UTF-8 text (invalid byte at offset "
            f"{exc.start}); the file is corrupt or not a metadata file"
        ) from None
    try:
        return json.loads(
            text, object_pairs_hook=_refuse_duplicate_keys, parse_constant=_refuse_constant
        )
    except json.JSONDecodeError as exc:
        raise MetadataError(
            f"checkpoint metadata {source} is not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}); the file is truncated or corrupt"
        ) from None
    except (ValueError, RecursionError) as exc:
        # ValueError: our strictness hooks, or an integer literal too long to convert.
        raise MetadataError(f"checkpoint metadata {source} is not acceptable JSON: {exc}") from None


def short_repr(value: Any, limit: int = 80) -> str:
    """repr() cut to a readable length: corrupt files can hold huge values."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(source: str, problem: str) -> NoReturn:
    raise MetadataError(f"checkpoint metadata {source} {problem}")


def _check_version(document: dict[str, Any], source: str, oldest: int, newest: int) -> int:
    """The tag, then the version: a newer file is reported as such before anything else."""
    tag = document.get("format")
    if tag != FORMAT_TAG:
        found = "no 'format' tag" if tag is None else f"format tag {short_repr(tag)}"
        _fail(
            source,
            f"is not airflow-finalckpt checkpoint metadata: it has {found}, "
            f"expected {FORMAT_TAG!r}",
        )
    version = document.get("version")
    if type(version) is not int:
        _fail(source, f"has no integer 'version' (found {short_repr(version)})")
    if version > newest:
        raise UnsupportedMetadataVersionError(
            f"checkpoint metadata {source} was written in metadata format version {version}, "
            f"this airflow-finalckpt reads versions {oldest}..{newest}; upgrade airflow-finalckpt"
        )
    if version < oldest:
        _fail(
            source,
            f"has metadata format version {version}, which never existed "
            f"(versions are {oldest}..{newest}); the file is corrupt",
        )
    return version


def _checked_body(document: dict[str, Any], source: str) -> dict[str, Any]:
    """The keys, the body's type and its checksum."""
    keys = set(document)
    if keys != ENVELOPE_KEYS:
        missing = sorted(ENVELOPE_KEYS - keys)
        extra = sorted(keys - ENVELOPE_KEYS)
        _fail(source, f"has a malformed envelope (missing keys {missing}, unexpected keys {extra})")
    body = document["body"]
    if not isinstance(body, dict):
        _fail(source, f"has a 'body' that is a JSON {type(body).__name__}, expected an object")
    stated = document["sha256"]
    if not isinstance(stated, str):
        _fail(source, f"has a 'sha256' that is not a string (found {short_repr(stated)})")
    try:
        actual = body_checksum(body)
    except (ValueError, RecursionError) as exc:
        _fail(source, f"has a body that cannot be hashed: {exc}")
    if actual != stated:
        _fail(
            source,
            f"fails its checksum: the file states sha256 {short_repr(stated)} but its body "
            f"hashes to {actual!r}; the file is corrupt or was edited",
        )
    return body


def open_envelope(document: Any, source: str, *, oldest: int, newest: int) -> Envelope:
    """Check tag, version, keys and checksum, in that order, so errors say the most useful thing."""
    if not isinstance(document, dict):
        _fail(source, f"is a JSON {type(document).__name__}, expected a JSON object")
    version = _check_version(document, source, oldest, newest)
    return Envelope(version=version, body=_checked_body(document, source))
