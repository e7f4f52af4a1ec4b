"""The one assembly point of a stage attempt.

The stage operator (Spark in the Airflow task: local, client mode or Spark Connect) and a Spark
driver submitted through ``spark-submit`` build their ``StageRunner`` here, from the same plain
values: a ``StageJob`` (spec, upstream manifests, where throughput hints live), the DAG author's
``StageCode``, the coordinator, the checkpoint storage and a factory of the stage logic (the
Spark adapter, which this module does not know). Closing a finished stage needs none of this:
see ``runner.StageCloser``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.core.split_bytes import SplitBytes
from airflow_finalckpt.runtime.runner import Log, Progress, StageLogic, StageRunner, StageSpec
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints


@dataclass(frozen=True)
class StageCode:
    """What the DAG author wrote for a stage: shipped by reference or pickled to a driver."""

    transform: Callable[..., Any] | None = None
    on_finish: Callable[..., Any] | None = None
    sinks: tuple[TwoPhaseCommitSink, ...] = ()
    #: A source's declared input bytes per split (``core.split_bytes``): evaluated where the
    #: stage logic runs (the Spark driver), which sees the input files.
    split_bytes: SplitBytes | None = None


@dataclass(frozen=True)
class StageJob:
    """One stage attempt as plain values: the operator resolves them from its arguments and the
    ``[finalckpt]`` settings, a submitted driver reads them back from its job spec.
    """

    spec: StageSpec
    upstream_manifests: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Where measured batch throughput is shared between runs (the DAG); None: not kept.
    hints_scope: str | None = None
    #: The Airflow run the stage works for (logical date, data interval, params, conf).
    run: RunContext = field(default_factory=RunContext)


class LogicFactory(Protocol):
    """Builds an attempt's stage logic (the Spark adapter) from the job, code and storage."""

    def __call__(self, job: StageJob, code: StageCode, storage: CheckpointStorage) -> StageLogic:
        """The logic of one attempt, ready for ``StageRunner`` to restore and run."""
        ...


def assemble_runner(
    coordinator: CoordinatorPort,
    storage: CheckpointStorage,
    job: StageJob,
    code: StageCode,
    make_logic: LogicFactory,
    *,
    log: Log | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    fault: Callable[[str], None] | None = None,
) -> StageRunner:
    """The runner of one attempt: the logic writes output parts, throughput hints are kept in
    the checkpoint storage under the job's scope.
    """
    logic = make_logic(job, code, storage)
    hints = None
    if job.hints_scope:
        hints = StorageThroughputHints(storage, job.hints_scope, job.spec.pipeline_key)
    return StageRunner(
        coordinator,
        job.spec,
        logic,
        code.sinks,
        output_handle=getattr(logic, "output_handle", None),
        log=log,
        on_progress=on_progress,
        fault=fault,
        hints=hints,
    )
