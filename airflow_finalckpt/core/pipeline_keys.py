"""The default pipeline key of a DAG run, and the scope its batch throughput is shared in.

A pipeline key is one path segment (``storage.validate_pipeline_key``), so a DAG id and a run id
cannot be kept as they are. Replacing unsafe characters alone is not injective (``T00:00:00``
and ``T00-00-00``, or ``("a.b", "c")`` and ``("a", "b.c")``, became one key, and a run silently
continued another run's pipeline): the key keeps that readable form and adds a digest of the
exact pair, so two DAG runs with different ids never share a default key.

A DAG run deleted and created again gets the same ids from Airflow (a backfill of the day
again): ``core.run_instance`` tells it from the original, and it gets the next *generation* of
the key (``...-g2.<digest>``), a new pipeline, so it computes everything again.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]")
_SAFE_FIRST = re.compile(r"[A-Za-z0-9_]")
_DOT_BEFORE_DOT = re.compile(r"\.(?=\.)")
#: Hex digits of the sha256 of ``[dag_id, run_id]`` ending every default key (64 bits).
DIGEST_CHARS = 16
#: Room for the readable part: the key stays within 200 characters.
READABLE_CHARS = 200 - DIGEST_CHARS - 1


def _readable(text: str) -> str:
    """``text`` with every character a path segment may not hold replaced by ``-``."""
    return _UNSAFE.sub("-", text)


class KeyOrigin(StrEnum):
    """Where a stage attempt's pipeline key came from: what a refusal may suggest changing."""

    #: ``dag_run.conf["pipeline_key"]``: a continuation asked for in the conf
    CONF = "conf"
    #: the operator's ``pipeline_key`` argument
    OPERATOR = "operator"
    #: ``dag_run.conf["restore_from"]``: the savepoint's pipeline
    RESTORE = "restore"
    #: the DAG run's own default key
    DEFAULT = "default"


def default_pipeline_key(
    dag_id: str, run_id: str, generation: int = 1, partition_key: str | None = None
) -> str:
    """One pipeline run per DAG run: ``<dag>.<run, made safe>.<digest of the exact pair>``;
    generation 2 and later (a re-created DAG run): ``<dag>.<run>-g<n>.<digest with n>``.

    A partitioned run's key names its partition too, ``<dag>.p=<partition key>.<run>.<digest>``
    (``nyc.p=us-2026-03-10.scheduled__...``): an asset-triggered run's id says nothing of
    it. The digest stays that of (dag, run[, generation]): the DAG run alone picks the pipeline.
    """
    if generation < 1:
        raise ValueError(f"a pipeline key generation starts at 1, got {generation}")
    suffix = "" if generation == 1 else f"-g{generation}"
    run = run_id if partition_key is None else f"p={partition_key}.{run_id}"
    readable = _readable(f"{dag_id}.{run}")[: READABLE_CHARS - len(suffix)]
    if not _SAFE_FIRST.match(readable):
        readable = "_" + readable[: READABLE_CHARS - len(suffix) - 1]
    readable += suffix
    ids: list[object] = [dag_id, run_id] if generation == 1 else [dag_id, run_id, generation]
    pair = json.dumps(ids, ensure_ascii=True).encode()
    key = f"{readable}.{hashlib.sha256(pair).hexdigest()[:DIGEST_CHARS]}"
    return _DOT_BEFORE_DOT.sub("-", key)  # '..' is no path segment's part


def hints_scope(dag_id: str) -> str:
    """Measured batch throughput is shared by the runs of one DAG (a path-safe name)."""
    return "dag-" + _readable(dag_id)[:190]
