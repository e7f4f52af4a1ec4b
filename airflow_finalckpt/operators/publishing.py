"""What a stage task publishes and reads through Airflow: the ``end_of_data`` XCom its
downstream stages read their splits from, the attempt's run record, and the Asset events of a
commit. Plain functions over the task's values, so the operator only wires them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset

from airflow_finalckpt.core.errors import FinalCheckpointError, StageDefinitionError
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.core.partitions import committed_partitions, counts
from airflow_finalckpt.core.ports import CoordinatorPort

END_OF_DATA_KEY = "end_of_data"
#: What this attempt did (status, splits processed, whether Spark was started): the run's record.
STAGE_RUN_KEY = "stage_run"


def primary_splits(
    stage_id: str, primary_input: str | None, manifests: Mapping[str, list[str]]
) -> list[str]:
    """A stage without own splits reads its primary input's output parts (by default: its only
    upstream stage's).
    """
    primary = primary_input
    if primary is None:
        if len(manifests) != 1:
            raise StageDefinitionError(
                f"stage {stage_id!r} needs `splits` (a source stage) or `primary_input` "
                f"(it has {len(manifests)} upstream stages)"
            )
        primary = next(iter(manifests))
    if primary not in manifests:
        raise StageDefinitionError(
            f"stage {stage_id!r}: primary_input {primary!r} is not an upstream stage"
        )
    return manifests[primary]


def upstream_manifests(
    ti: Any, stage_id: str, upstream: Iterable[tuple[str, str]]
) -> dict[str, list[str]]:
    """Each upstream stage's output parts from its ``end_of_data`` XCom; ``upstream`` holds
    (task id, stage id) pairs. An upstream that published none has not succeeded: an error.
    """
    manifests: dict[str, list[str]] = {}
    for task_id, up_stage in upstream:
        doc = ti.xcom_pull(task_ids=task_id, key=END_OF_DATA_KEY)
        if doc is None:
            raise FinalCheckpointError(
                f"stage {stage_id!r}: upstream stage {up_stage!r} published no "
                "end_of_data; it must succeed first"
            )
        manifests[up_stage] = list(EndOfData.model_validate(doc).manifest)
    return manifests


def commit_extra(
    coordinator: CoordinatorPort, stage_id: str, transactions: Sequence[tuple[Any, str]]
) -> dict[str, Any]:
    """The extra of a closed stage's Asset events: the pipeline, the checkpoint the stage
    closed on and the rows its committed transactions wrote (per sink and in all; those of a
    commit a recompute superseded do not count).
    """
    view = coordinator.stage(stage_id)
    rows: dict[str, int] = {}
    for txn, state in transactions:
        if counts(txn, state):
            rows[txn.sink_id] = rows.get(txn.sink_id, 0) + int(txn.payload.get("rows") or 0)
    return {
        "pipeline_key": coordinator.pipeline_key,
        "stage_id": stage_id,
        "checkpoint_id": view.closed_checkpoint_id,
        "rows": sum(rows.values()),
        "rows_by_sink": rows,
    }


def announce_commit(
    context: Any,
    outlets: Sequence[Any],
    coordinator: CoordinatorPort | None,
    stage_id: str,
    *,
    republish: bool,
    log: logging.Logger | Any,
) -> bool:
    """Asset events mark committed data: one per commit, emitted by the success of the
    attempt that made it visible, never by a re-published end_of_data (a CLOSED stage in a
    continuation run would make Asset-scheduled DAGs run again on no new data). The event
    extra names the pipeline, the checkpoint the stage closed on and the rows committed.

    Partitions: in a partitioned DAG run Airflow gives the event the run's ``partition_key``.
    A stage that reported keys at run time (``ctx.add_partitions``) gets one event per key its
    committed transactions carry, none for the keys of aborted ones.
    Returns True when the task's outlets must be emptied (a re-publication: Airflow emits the
    events of ``ti.task.outlets`` at success).
    """
    if not outlets:
        return False
    if republish:
        log.info(
            "stage %s was committed and announced before (by an earlier DAG run or another "
            "try): end_of_data re-published, no Asset event for %s",
            stage_id,
            ", ".join(str(getattr(o, "name", o)) for o in outlets),
        )
        return True
    if coordinator is None:
        return False
    transactions = coordinator.transactions(stage_id)
    extra = commit_extra(coordinator, stage_id, transactions)
    keys = committed_partitions(transactions)
    if keys:
        extra["partition_keys"] = keys
    for outlet in outlets:
        if isinstance(outlet, Asset):
            events = context["outlet_events"][outlet]
            events.extra.update(extra)
            if keys:
                events.add_partitions(keys)
    if keys:
        log.info("stage %s committed partitions %s: one Asset event each", stage_id, keys)
    return False


def log_resume_point(log: logging.Logger | Any, coordinator: Any, stage_id: str) -> None:
    """Where the stage's attempt starts from: the latest completed checkpoint, the stage's
    lifecycle and how many splits it finished (``StageView.finished_count``).
    """
    latest = coordinator.latest_completed()
    view = coordinator.stage(stage_id)
    count = view.finished_count()
    log.info(
        "pipeline %s: latest completed checkpoint %s; stage %s is %s with %s finished splits",
        coordinator.pipeline_key,
        latest.checkpoint_id if latest else None,
        stage_id,
        view.lifecycle.value,
        "an unknown number of" if count is None else count,
    )


def publish_end_of_data(
    ti: Any, stage_id: str, eod: EndOfData, log: logging.Logger | Any
) -> dict[str, Any]:
    """Push the committed stage's ``end_of_data`` (what downstream stages read) and say so."""
    doc = eod.model_dump(mode="json")
    ti.xcom_push(key=END_OF_DATA_KEY, value=doc)
    log.info(
        "stage %s committed: end_of_data drain=%s, %d output parts, finished at checkpoint %s",
        stage_id,
        eod.drain,
        len(eod.manifest),
        eod.finished_at_checkpoint,
    )
    return doc
