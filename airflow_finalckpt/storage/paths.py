"""Validation and encoding of every path component checkpoint storage builds.

Paths are only ever assembled from components that passed these checks, so no user input
(pipeline key, run id, checkpoint id, state file name) can point outside the storage root.
"""

from __future__ import annotations

import re

from airflow_finalckpt.core.errors import UnsafePathError

METADATA_FILE_NAME = "_metadata"
CHECKPOINT_DIR_PREFIX = "chk-"
MAX_COMPONENT_LENGTH = 200

PIPELINE_KEY_RULE = (
    "a pipeline key is 1-200 ASCII characters from A-Z a-z 0-9 _ . = -, starts with a letter, "
    "digit or '_', and contains no '..'"
)
_PIPELINE_KEY_FIRST = re.compile(r"[A-Za-z0-9_]")
_PIPELINE_KEY_CHAR = re.compile(r"[A-Za-z0-9_.=-]")

_RUN_ID_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_ENCODED_RUN_ID = re.compile(r"(?:[A-Za-z0-9_.-]|%[0-9A-F]{2})+")

STATE_PATH_RULE = (
    "a state path is 1-32 '/'-separated names of 1-200 characters from A-Z a-z 0-9 _ . = % + -, "
    "relative (no leading '/'), without '.' or '..' names, and not named '_metadata'"
)
_STATE_COMPONENT = re.compile(r"[A-Za-z0-9_.=%+-]{1,200}")
_MAX_STATE_DEPTH = 32

_CHECKPOINT_DIR = re.compile(r"chk-([1-9][0-9]{0,18})")


def _describe_char(char: str) -> str:
    return f"{char!r} (U+{ord(char):04X})"


def _pipeline_key_violation(key: object) -> str | None:
    if not isinstance(key, str):
        return f"it is a {type(key).__name__}, not a string"
    if not key:
        return "it is empty"
    if len(key) > MAX_COMPONENT_LENGTH:
        return f"it is {len(key)} characters long, the limit is {MAX_COMPONENT_LENGTH}"
    if not _PIPELINE_KEY_FIRST.fullmatch(key[0]):
        return f"it starts with {_describe_char(key[0])}"
    for char in key:
        if not _PIPELINE_KEY_CHAR.fullmatch(char):
            return f"it contains the character {_describe_char(char)}"
    if ".." in key:
        return "it contains '..'"
    return None


def validate_pipeline_key(key: str) -> str:
    """Return ``key`` if it is a safe single path component, else raise UnsafePathError."""
    violation = _pipeline_key_violation(key)
    if violation is not None:
        raise UnsafePathError(f"unsafe pipeline key {key!r}: {violation}; {PIPELINE_KEY_RULE}")
    return key


def validate_checkpoint_id(checkpoint_id: int) -> int:
    """The id, if it is a positive int that can name a ``chk-<id>`` directory safely."""
    if type(checkpoint_id) is not int or not 1 <= checkpoint_id < 10**19:
        raise UnsafePathError(
            f"invalid checkpoint id {checkpoint_id!r}: checkpoint ids are positive integers"
        )
    return checkpoint_id


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """``chk-<id>``: the directory of one checkpoint under its pipeline's directory."""
    return f"{CHECKPOINT_DIR_PREFIX}{validate_checkpoint_id(checkpoint_id)}"


def parse_checkpoint_dir_name(name: str) -> int | None:
    """The id of a ``chk-<id>`` directory name, None for anything else (no leading zeros)."""
    match = _CHECKPOINT_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def encode_run_id(run_id: str) -> str:
    """Map an Airflow run id to one safe path component, reversibly (see decode_run_id).

    Bytes outside ``A-Za-z0-9_.-`` become ``%XX`` (upper-case hex of their UTF-8 bytes), so
    ``manual__2026-11-22T03:45:16.123456+00:00`` becomes
    ``manual__2026-11-22T03%3A45%3A16.123456%2B00%3A00``.
    """
    if not isinstance(run_id, str) or not run_id:
        raise UnsafePathError(f"invalid run id {run_id!r}: a run id is a non-empty string")
    try:
        raw = run_id.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePathError(f"invalid run id {run_id!r}: it is not valid Unicode") from None
    encoded = "".join(chr(b) if b in _RUN_ID_SAFE_BYTES else f"%{b:02X}" for b in raw)
    if encoded in (".", ".."):
        raise UnsafePathError(f"unsafe run id {run_id!r}: '.' and '..' name directories")
    if len(encoded) > MAX_COMPONENT_LENGTH:
        raise UnsafePathError(
            f"run id {run_id[:60]!r}... is too long: it encodes to {len(encoded)} characters, "
            f"the limit is {MAX_COMPONENT_LENGTH}"
        )
    return encoded


def decode_run_id(component: str) -> str:
    """Inverse of encode_run_id; refuses anything encode_run_id would never produce."""
    problem = f"{component!r} is not an encoded run id"
    if not isinstance(component, str) or not _ENCODED_RUN_ID.fullmatch(component):
        raise UnsafePathError(f"{problem}: use only A-Za-z0-9_.- and %XX escapes")
    raw = bytearray()
    position = 0
    while position < len(component):  # the pattern above guarantees whole %XX escapes
        if component[position] == "%":
            raw.append(int(component[position + 1 : position + 3], 16))
            position += 3
        else:
            raw.append(ord(component[position]))
            position += 1
    try:
        run_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePathError(f"{problem}: its escapes are not UTF-8") from None
    if encode_run_id(run_id) != component:
        raise UnsafePathError(f"{problem}: it is not in canonical form")
    return run_id


def normalize_state_path(relpath: object) -> str | None:
    """A path some record names, without surrounding blanks, trailing '/' or leading './';
    None when it is not a safe state path (the caller reports or ignores it).
    """
    if not isinstance(relpath, str):
        return None
    path = relpath.strip().rstrip("/")
    while path.startswith("./"):
        path = path[2:]
    try:
        validate_state_path(path)
    except UnsafePathError:
        return None
    return path


def validate_state_path(relpath: str) -> tuple[str, ...]:
    """Split a state file path relative to a pipeline directory into checked components."""
    if not isinstance(relpath, str) or not relpath:
        raise UnsafePathError(f"unsafe state path {relpath!r}: it is empty; {STATE_PATH_RULE}")
    parts = tuple(relpath.split("/"))
    if len(parts) > _MAX_STATE_DEPTH:
        raise UnsafePathError(
            f"unsafe state path {relpath[:80]!r}: it is {len(parts)} levels deep; {STATE_PATH_RULE}"
        )
    for part in parts:
        if part in ("", ".", "..") or not _STATE_COMPONENT.fullmatch(part):
            shown = "an empty name (leading, trailing or double '/')" if not part else repr(part)
            raise UnsafePathError(
                f"unsafe state path {relpath!r}: it contains {shown}; {STATE_PATH_RULE}"
            )
    if parts[-1] == METADATA_FILE_NAME:
        raise UnsafePathError(
            f"unsafe state path {relpath!r}: '{METADATA_FILE_NAME}' is reserved for checkpoint "
            "metadata, a state file must not be able to complete a checkpoint"
        )
    return parts
