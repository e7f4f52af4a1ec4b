"""Compact values inside a metadata body (format version 2): a finished split set, and a packed
JSON value. Pure functions over plain values; every bad input is a MetadataError saying what.

Both are JSON objects holding base64 text of zlib-compressed canonical JSON plus the sha256 of
what was compressed, so a file stays plain data (never code), self-contained (no reference to
another file or checkpoint) and checkable on its own:

- a *split set* is the sorted split ids, front-coded (each id as the length of the prefix it
  shares with the previous one and the rest): ids such as ``data/2013/01/part-00017`` shrink to
  a few bytes each. Its ``sha256`` is the set's fingerprint (of the canonical JSON of the sorted
  ids), checked when it is decoded, so a corrupt or wrongly encoded set is refused, never
  silently restored as another set;
- a *packed* value is any JSON value (the graph, the fully finished stages), compressed.

Decoding is bounded (issue 37): front coding expands without limit (an id may share all of
the previous one, so N entries of a few bytes each can decode to N times a long id: a 7 KB set
once took 127 MB). Every split set of one ``_metadata`` file draws on one
:class:`DecodeBudget`, charged before the JSON is parsed and id by id while it expands, and the
set's fingerprint is hashed as the ids appear (no second copy of the set to hash it): a hostile
or corrupt set is refused with a MetadataError once it passes the budget, never after.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata.envelope import (
    canonical_json,
    json_sha256,
    parse_json,
    short_repr,
)

SPLITS_ENCODING = "front-coded+zlib+base64"
PACKED_ENCODING = "zlib+base64"
#: A packed value never inflates beyond this (a corrupt or hostile file cannot exhaust memory):
#: the largest legitimate ones (the fully finished stages of 10,000 stages) take a few MB.
MAX_UNPACKED_BYTES = 64 << 20
#: What the split sets of one ``_metadata`` file may decode to: the characters of every id
#: plus :data:`SPLIT_ID_OVERHEAD` per id. 64 MiB: half a million ids of 64 characters (a
#: bucket path each) finished by the stages still in progress, ten times the largest
#: checkpoint we measure (100,000 splits of which 50,000 finished: 5 MiB; with 10,000 stages
#: x 100 splits the fully finished stages keep no ids). A legitimate set of that size decodes
#: in about a second; a bomb is refused once it has spent it.
MAX_DECODED_SPLIT_BYTES = 64 << 20
#: What one id costs besides its characters, counted against the budget: about CPython's
#: string header and its slots in the list and the set being built.
SPLIT_ID_OVERHEAD = 64
_LEVEL = 6
#: Characters of ids hashed per call while a set expands (one encoder call per chunk of ids,
#: not per id, and never a copy of the whole set).
_HASH_CHUNK = 1 << 20


class DecodeBudget:
    """What the split sets of one ``_metadata`` file may still decode to, in bytes; shared by
    every set of the file, so many small bombs add up to one refusal.
    """

    def __init__(self, limit: int = MAX_DECODED_SPLIT_BYTES) -> None:
        self.limit = limit
        self.left = limit

    def require(self, amount: int, what: str) -> None:
        """Refuse now what would spend more than is left (``amount`` is not taken)."""
        if amount > self.left:
            self.refuse(what)

    def refuse(self, what: str) -> NoReturn:
        """The one-line MetadataError of a spent budget."""
        raise MetadataError(
            f"{what}: the split ids expand beyond {self.limit} bytes, the limit of one "
            "checkpoint (MAX_DECODED_SPLIT_BYTES); the file is corrupt or not written by "
            "airflow-finalckpt"
        )


def split_set_fingerprint(splits: Collection[str]) -> str:
    """The sha256 of a split set: of the canonical JSON of its sorted ids."""
    return json_sha256(sorted(splits))


def _shared_prefix(a: str, b: str, guess: int) -> int:
    """Length of the common prefix of two ids by slice comparisons (C speed; a character loop
    in Python cost 0.12 s per 62,500 ids): ``guess`` first (sorted neighbours mostly share as
    much as the pair before), else by bisection.
    """
    high = min(len(a), len(b))
    if guess <= high and a[:guess] == b[:guess] and (guess == high or a[guess] != b[guess]):
        return guess
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _front_code(ordered: list[str]) -> list[Any]:
    coded: list[Any] = []
    append = coded.append
    previous = ""
    shared = 0
    for split in ordered:
        # inline the common case of _shared_prefix: as much shared as with the pair before
        if not (
            split.startswith(previous[:shared])
            and (shared in (len(split), len(previous)) or split[shared] != previous[shared])
        ):
            shared = _shared_prefix(split, previous, shared)
        append(shared)
        append(split[shared:])
        previous = split
    return coded


def encode_split_set(splits: Collection[str]) -> dict[str, Any]:
    """A split set as ``{"encoding", "count", "sha256", "data"}``."""
    ordered = sorted(set(splits))
    data = zlib.compress(canonical_json(_front_code(ordered)), _LEVEL)
    return {
        "encoding": SPLITS_ENCODING,
        "count": len(ordered),
        "sha256": json_sha256(ordered),
        "data": base64.b64encode(data).decode("ascii"),
    }


def _inflate(text: str, what: str, limit: int = MAX_UNPACKED_BYTES) -> bytes:
    """base64 -> zlib -> bytes, refusing bad base64, bad zlib data and oversized output."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MetadataError(f"{what}: 'data' is not base64 text") from None
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise MetadataError(f"{what}: 'data' is not zlib data ({exc})") from None
    if len(out) > limit:
        raise MetadataError(f"{what}: 'data' inflates beyond {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise MetadataError(f"{what}: 'data' is truncated or has trailing bytes")
    return out


def _chunked_fingerprint(ordered: list[str]) -> str:
    """:func:`split_set_fingerprint` of sorted ids, hashed a chunk of ids at a time: the same
    digest without a canonical JSON copy of the whole set in memory.
    """
    digest = hashlib.sha256(b"[")
    start, size = 0, 0
    for end, split in enumerate(ordered, start=1):
        size += len(split) + 8
        if size >= _HASH_CHUNK or end == len(ordered):
            text = canonical_json(ordered[start:end])[1:-1]  # the ids without the brackets
            digest.update(text if start == 0 else b"," + text)
            start, size = end, 0
    digest.update(b"]")
    return digest.hexdigest()


def _expand(coded: Any, what: str, budget: DecodeBudget) -> list[str]:
    """The ids of a front-coded list, each charged to ``budget`` before it is made."""
    if not isinstance(coded, list) or len(coded) % 2:
        raise MetadataError(f"{what}: the front-coded ids are not a list of (prefix, rest) pairs")
    ordered: list[str] = []
    previous = ""
    left = budget.left
    for shared, rest in zip(coded[::2], coded[1::2], strict=True):
        if type(shared) is not int or not isinstance(rest, str):
            raise MetadataError(
                f"{what}: front-coded entry {len(ordered)} is not a (prefix length, text) pair "
                f"(found {short_repr(shared)}, {short_repr(rest)})"
            )
        if not 0 <= shared <= len(previous):
            raise MetadataError(
                f"{what}: front-coded entry {len(ordered)} shares {shared} characters with a "
                f"previous id of {len(previous)}"
            )
        left -= shared + len(rest) + SPLIT_ID_OVERHEAD
        if left < 0:  # before the id is made
            budget.refuse(what)
        split = previous[:shared] + rest
        if ordered and split <= previous:
            raise MetadataError(f"{what}: the split ids are not sorted and unique")
        ordered.append(split)
        previous = split
    budget.left = left
    return ordered


def decode_split_set(
    encoded: Mapping[str, Any], *, what: str = "split set", budget: DecodeBudget | None = None
) -> frozenset[str]:
    """The ids of an encoded split set; MetadataError if it is corrupt, its count or sha256
    does not match its ids, or it decodes beyond ``budget`` (a fresh
    :data:`MAX_DECODED_SPLIT_BYTES` one if None; a file's reader passes one for all its sets).
    """
    if encoded.get("encoding") != SPLITS_ENCODING:
        raise MetadataError(
            f"{what}: unknown encoding {short_repr(encoded.get('encoding'))}, "
            f"expected {SPLITS_ENCODING!r}"
        )
    budget = DecodeBudget() if budget is None else budget
    count = encoded["count"]
    budget.require(count * SPLIT_ID_OVERHEAD, what)  # the stated count alone is too many ids
    text = _inflate(encoded["data"], what, limit=min(MAX_UNPACKED_BYTES, budget.left))
    # a parsed entry costs about what an id costs: bound what json.loads would build (at most
    # one (prefix, rest) pair per two commas) before it builds it
    budget.require((text.count(b",") + 2) // 2 * SPLIT_ID_OVERHEAD, what)
    coded = parse_json(text, what)
    if isinstance(coded, list) and len(coded) % 2 == 0 and len(coded) != 2 * count:
        raise MetadataError(f"{what}: it states {count} splits but holds {len(coded) // 2}")
    ordered = _expand(coded, what, budget)
    actual = _chunked_fingerprint(ordered)  # after the budget held: hashing costs more
    if actual != encoded["sha256"]:
        raise MetadataError(
            f"{what}: its split ids hash to {actual}, not to the recorded fingerprint "
            f"{short_repr(encoded['sha256'])}; the set is corrupt or was written wrongly"
        )
    return frozenset(ordered)


def pack_json(value: Any) -> dict[str, Any]:
    """A JSON value as ``{"encoding", "size", "sha256", "data"}`` (of its canonical JSON)."""
    return pack_canonical(canonical_json(value))


def pack_canonical(text: bytes) -> dict[str, Any]:
    """:func:`pack_json` of a value whose canonical JSON the caller made already."""
    return {
        "encoding": PACKED_ENCODING,
        "size": len(text),
        "sha256": hashlib.sha256(text).hexdigest(),
        "data": base64.b64encode(zlib.compress(text, _LEVEL)).decode("ascii"),
    }


def unpack_json(packed: Mapping[str, Any], *, what: str = "packed value") -> Any:
    """The JSON value of a packed one; MetadataError if it is corrupt."""
    if packed.get("encoding") != PACKED_ENCODING:
        raise MetadataError(
            f"{what}: unknown encoding {short_repr(packed.get('encoding'))}, "
            f"expected {PACKED_ENCODING!r}"
        )
    size = packed["size"]
    text = _inflate(packed["data"], what, limit=min(size, MAX_UNPACKED_BYTES))
    if len(text) != size or hashlib.sha256(text).hexdigest() != packed["sha256"]:
        raise MetadataError(
            f"{what}: its content ({len(text)} bytes) does not match its recorded size "
            f"({size}) and sha256; the value is corrupt"
        )
    return parse_json(text, what)
