"""``@finalckpt_stage``: write a stage as a function, TaskFlow-style.

    @finalckpt_stage(splits=days, batch_size=10)
    def ingest(ctx):
        return ctx.spark.read.parquet(*paths_of(ctx.splits))

    @finalckpt_stage(batch_size=5)
    def delay_windows(ctx): ...

    @delay_windows.finish           # end of input or drain: fire every open window
    def _(ctx): ...

    ingest() >> enrich() >> delay_windows() >> publish()

Calling the decorated function creates the stage task (a FinalCheckpointStageOperator whose
transform is the function); keyword arguments override the decorator's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.spark.stage import Transform


class StageDecorator:
    """The decorated transform: calling it in a DAG makes a stage task running that transform."""

    def __init__(self, transform: Transform, operator_kwargs: dict[str, Any]) -> None:
        functools.update_wrapper(self, transform)
        self.transform = transform
        self.operator_kwargs = operator_kwargs
        self.on_finish: Transform | None = None

    def finish(self, on_finish: Transform) -> Transform:
        """Register the finish() hook (flush state at end of input / drain)."""
        self.on_finish = on_finish
        return on_finish

    def __call__(self, **overrides: Any) -> FinalCheckpointStageOperator:
        """A stage task (task id: the function's name) with the decorator's arguments, which
        ``overrides`` replace.
        """
        kwargs: dict[str, Any] = {
            "task_id": self.transform.__name__,
            "on_finish": self.on_finish,
            **self.operator_kwargs,
            **overrides,
        }
        return FinalCheckpointStageOperator(transform=self.transform, **kwargs)


@overload
def finalckpt_stage(transform: Transform, **operator_kwargs: Any) -> StageDecorator: ...


@overload
def finalckpt_stage(
    transform: None = None, **operator_kwargs: Any
) -> Callable[[Transform], StageDecorator]: ...


def finalckpt_stage(
    transform: Transform | None = None, **operator_kwargs: Any
) -> StageDecorator | Callable[[Transform], StageDecorator]:
    """Decorate a transform ``fn(ctx) -> DataFrame | None`` into a stage task factory."""
    if transform is not None:
        return StageDecorator(transform, operator_kwargs)
    return lambda fn: StageDecorator(fn, operator_kwargs)
