"""The splits of a source stage reading an incremental source: the range its pipeline run
recorded, claimed once when the stage first starts (``store.cursors.claim_range``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.core.source_cursor import RangeState, default_cursor_id
from airflow_finalckpt.sources.base import IncrementalSource
from airflow_finalckpt.store.cursors import claim_range

log = logging.getLogger(__name__)


def cursor_id_of(source: IncrementalSource, dag_id: str | None, stage_id: str) -> str:
    """The source's own cursor id, else ``<dag_id>.<stage_id>``."""
    return source.cursor_id or default_cursor_id(dag_id, stage_id)


def claim_splits(
    engine: Engine,
    source: IncrementalSource,
    *,
    pipeline_key: str,
    stage_id: str,
    run: RunContext | None = None,
    logger: Any = None,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """The split ids this pipeline run reads of ``source`` (recorded once, the same on every
    retry, resume, restore and clear of the run); says in the log which range it is.
    """
    run = run or RunContext()
    cursor_id = cursor_id_of(source, run.dag_id, stage_id)
    record = claim_range(
        engine,
        cursor_id=cursor_id,
        kind=source.kind,
        pipeline_key=pipeline_key,
        stage_id=stage_id,
        lister=source.list_new,
        now=clock,
        dag_id=run.dag_id,
        run_id=run.run_id,
        logical_date=run.logical_date_iso,
    )
    rng = record.effective()
    how = {
        RangeState.OPEN: "reads the range recorded for this run",
        RangeState.COMMITTED: "reads again the range this run committed",
        RangeState.RECOMPUTE: "recomputes the committed range of its logical date",
    }[record.state]
    (logger or log).info(
        "stage %s: source %s (cursor %s) %s: %d file(s), position %s -> %s",
        stage_id,
        source.describe(),
        cursor_id,
        how,
        len(rng.files),
        rng.start,
        rng.end,
    )
    return rng.splits
