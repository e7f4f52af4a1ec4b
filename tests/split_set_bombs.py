"""Hostile split sets for the bounded-decoding tests (issue 37): front-coded sets whose every
id shares a long first id and adds a few characters, so a file of a few KB expands to
gigabytes, and a real ``_metadata`` file rewritten to hold one (its envelope checksum made
right again, as anyone who can write checkpoint storage can)."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

from airflow_finalckpt.core.metadata.compact import SPLITS_ENCODING
from airflow_finalckpt.core.metadata.envelope import body_checksum, canonical_json, json_sha256


def bomb_split_set(entries: int, shared: int, *, honest_sha256: bool = False) -> dict[str, Any]:
    """``entries`` ids of ``shared + 6`` characters from a few bytes each (the issue's 136 KB
    file: 40,000 entries of 60,000 shared characters, 2.4 GB decoded). ``honest_sha256``: the
    recorded fingerprint is the real one (computing it costs the expansion: small bombs only).
    """
    coded: list[Any] = [0, "a" * shared]
    ids = ["a" * shared]
    for number in range(entries - 1):
        coded += [shared, f"{number:06d}"]
        if honest_sha256:
            ids.append("a" * shared + f"{number:06d}")
    return {
        "encoding": SPLITS_ENCODING,
        "count": entries,
        "sha256": json_sha256(ids) if honest_sha256 else "0" * 64,
        "data": base64.b64encode(zlib.compress(canonical_json(coded), 9)).decode("ascii"),
    }


def plant_bomb(metadata_path: Path, stage_id: str, bomb: dict[str, Any]) -> int:
    """Replace ``stage_id``'s finished split set in a version 2 ``_metadata`` with ``bomb`` and
    reseal the envelope; returns the file's new size.
    """
    document = json.loads(metadata_path.read_bytes())
    document["body"]["stages"][stage_id]["finished_splits"] = bomb
    document["sha256"] = body_checksum(document["body"])
    data = json.dumps(document).encode()
    metadata_path.write_bytes(data)
    return len(data)
