"""How an attempt cuts its pending splits into batches and names their transactions.

Batch keys and transaction ids are deterministic (a redone batch writes the same parts and
reuses its name), and a transaction id carries the attempt's epoch, so a stale attempt's
transactions are told apart from the current one's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

from airflow_finalckpt.core.batching import (
    BatchPolicy,
    BatchSample,
    Throughput,
    fit,
    next_batch_size,
)


class BatchSizer:
    """Sizes an attempt's batches from the policy, the samples so far and a stored hint.

    Weights are input bytes when the logic knows every pending split's size (upstream output
    parts), else split counts; a hint measured in the other unit is ignored.
    """

    def __init__(
        self,
        policy: BatchPolicy,
        weigh: Callable[[Sequence[str]], Sequence[int | None]] | None = None,
        hint: Throughput | None = None,
    ) -> None:
        self.policy = policy
        self._weigh = weigh
        self._weights: dict[str, float] = {}
        self._hint = hint
        self.by_bytes: bool | None = None if weigh is not None else False
        self.samples: list[BatchSample] = []
        self.throughput: Throughput | None = None
        if self.by_bytes is False:
            self._use_hint()

    def _use_hint(self) -> None:
        if self._hint is not None and self._hint.by_bytes == self.by_bytes:
            self.samples = list(self._hint.samples)
            self.throughput = self._hint

    def weights(self, splits: Sequence[str]) -> list[float]:
        """Bytes per split (at least 1) when known for all of them, else 1 per split."""
        if self.by_bytes is not False and self._weigh is not None:
            missing = [s for s in splits if s not in self._weights]
            found = list(self._weigh(missing)) if missing else []
            if len(found) != len(missing) or any(w is None for w in found):
                self.by_bytes, self.samples, self.throughput = False, [], None
                self._use_hint()
            else:
                self._weights.update(
                    {s: float(max(int(w or 0), 1)) for s, w in zip(missing, found, strict=True)}
                )
                if self.by_bytes is None:
                    self.by_bytes = True
                    self._use_hint()
        if not self.by_bytes:
            return [1.0] * len(splits)
        return [self._weights[s] for s in splits]

    def next_size(self, pending: Sequence[str]) -> int:
        """How many of the ``pending`` splits the next batch takes."""
        if self.policy.fixed is not None:
            return min(self.policy.fixed, len(pending))
        window = pending[: self.policy.max_splits]
        weights = self.weights(window)
        return next_batch_size(self.policy, self.throughput, weights, by_bytes=bool(self.by_bytes))

    def observe(self, splits: Sequence[str], seconds: float) -> None:
        """Add a measured batch to the samples and refit the throughput."""
        weight = sum(self.weights(splits))
        self.samples.append(BatchSample(len(splits), weight, max(seconds, 0.0)))
        self.throughput = fit(self.samples, by_bytes=bool(self.by_bytes))


def batch_key(splits: Sequence[str]) -> str:
    """A stable, path-safe name of a batch: its first split's tail plus a digest of all."""
    digest = hashlib.sha1("\n".join(splits).encode()).hexdigest()[:10]
    tail = re.sub(r"[^A-Za-z0-9_.-]", "_", splits[0].rsplit("/", 1)[-1])[:40].lstrip(".-")
    return f"{tail or 'b'}-n{len(splits)}-{digest}"


def transaction_prefix(pipeline_key: str, stage_id: str) -> str:
    """What every transaction id of one stage of one pipeline starts with: pipelines sharing a
    sink never write to, commit or sweep each other's transactions.
    """
    digest = hashlib.sha1(pipeline_key.encode()).hexdigest()[:10]
    return f"{stage_id}.p{digest}."


def transaction_id(
    pipeline_key: str, stage_id: str, batch: str, epoch: int | None, sink_id: str | None = None
) -> str:
    """``<stage>.p<pipeline digest>.<batch key>.<sink id>.e<epoch>``: one per batch, sink and
    attempt, at most 200 characters (a long stage id, batch key or sink id is shortened with a
    digest, never the epoch). The sink id keeps two sinks of one stage out of each other's
    staging (issue 37: two sinks on one path shared ``txn-<id>/`` and committed each row
    twice); ids written without it by earlier versions (``sink_id`` None) stay valid, opaque
    to the sinks and keep the stage's prefix the orphan sweep matches.
    """
    sink = "" if sink_id is None else f".{sink_id}"
    body, suffix = f"{transaction_prefix(pipeline_key, stage_id)}{batch}{sink}", f".e{epoch}"
    if len(body) + len(suffix) > 200:
        body = f"{body[:180]}-{hashlib.sha1(body.encode()).hexdigest()[:10]}"
    return body + suffix
